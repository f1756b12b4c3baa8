/* Writes the seed corpus for fuzz_gguf: tiny valid GGUF files, made with the
 * writer, that between them reach every part of the format.
 * (Seed names have no .gguf suffix: the repository ignores *.gguf.)
 * usage: gguf_fuzz_seeds OUTDIR [VOCAB.gguf]   (a vocab adds a 64-token slice of it) */
#include <stdio.h>
#include <string.h>

#include "common/gguf.h"

static moex_gguf_writer *start(const char *dir, const char *name, char *path, size_t cap) {
    moex_error err;
    snprintf(path, cap, "%s/%s", dir, name);
    moex_gguf_writer *w = moex_gguf_writer_open(path, &err);
    if (!w) fprintf(stderr, "gguf_fuzz_seeds: %s\n", err.msg);
    return w;
}

static int finish(moex_gguf_writer *w) {
    moex_error err;
    if (moex_gguf_writer_close(w, &err)) {
        fprintf(stderr, "gguf_fuzz_seeds: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* Tensor data: a byte pattern, n bytes. */
static void put_bytes(moex_gguf_writer *w, size_t n) {
    unsigned char buf[512];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 37 + 11);
    while (n) {
        size_t k = n < sizeof buf ? n : sizeof buf;
        moex_gguf_writer_data(w, buf, k);
        n -= k;
    }
}

static int seed_scalars(const char *dir) {
    char path[1024];
    moex_gguf_writer *w = start(dir, "scalars", path, sizeof path);
    if (!w) return 1;
    moex_gguf_writer_kv_str(w, "general.architecture", "qwen3moe");
    moex_gguf_writer_kv_u32(w, "qwen3moe.block_count", 2);
    moex_gguf_writer_kv_i32(w, "i32", -5);
    moex_gguf_writer_kv_u64(w, "u64", 1ull << 40);
    moex_gguf_writer_kv_f32(w, "qwen3moe.rope.freq_base", 1e6f);
    moex_gguf_writer_kv_bool(w, "tokenizer.ggml.add_bos_token", false);
    const moex_gguf_value vals[] = {
        {MOEX_GGUF_UINT8, .v.u64 = 255}, {MOEX_GGUF_INT8, .v.i64 = -128}, {MOEX_GGUF_UINT16, .v.u64 = 65535},
        {MOEX_GGUF_INT16, .v.i64 = -1},  {MOEX_GGUF_INT64, .v.i64 = -1},  {MOEX_GGUF_FLOAT64, .v.f64 = 0.5},
    };
    const char *keys[] = {"u8", "i8", "u16", "i16", "i64", "f64"};
    for (int i = 0; i < 6; i++) {
        moex_gguf_kv kv = {{strlen(keys[i]), keys[i]}, vals[i]};
        moex_gguf_writer_kv_copy(w, &kv);
    }
    return finish(w);
}

static int seed_arrays(const char *dir) {
    char path[1024];
    moex_gguf_writer *w = start(dir, "arrays", path, sizeof path);
    if (!w) return 1;
    static const char *const toks[] = {"<s>", "</s>", "a", "b", "ab", ""};
    static const float scores[] = {0, 0, -1, -2, -3, -4};
    static const int32_t types[] = {3, 3, 1, 1, 1, 1};
    static const char *const merges[] = {"a b"};
    moex_gguf_writer_kv_str(w, "tokenizer.ggml.model", "gpt2");
    moex_gguf_writer_kv_array(w, "tokenizer.ggml.tokens", MOEX_GGUF_STRING, toks, 6);
    moex_gguf_writer_kv_array(w, "tokenizer.ggml.scores", MOEX_GGUF_FLOAT32, scores, 6);
    moex_gguf_writer_kv_array(w, "tokenizer.ggml.token_type", MOEX_GGUF_INT32, types, 6);
    moex_gguf_writer_kv_array(w, "tokenizer.ggml.merges", MOEX_GGUF_STRING, merges, 1);
    moex_gguf_value inner[2] = {
        {MOEX_GGUF_ARRAY, .v.arr = {MOEX_GGUF_INT32, 6, types, NULL, NULL}},
        {MOEX_GGUF_ARRAY, .v.arr = {MOEX_GGUF_STRING, 0, NULL, NULL, NULL}},
    };
    moex_gguf_value mid = {MOEX_GGUF_ARRAY, .v.arr = {MOEX_GGUF_ARRAY, 2, NULL, NULL, inner}};
    moex_gguf_kv nested = {{6, "nested"}, {MOEX_GGUF_ARRAY, .v.arr = {MOEX_GGUF_ARRAY, 1, NULL, NULL, &mid}}};
    moex_gguf_writer_kv_copy(w, &nested);
    return finish(w);
}

static int seed_tensors(const char *dir, const char *name, uint32_t alignment) {
    char path[1024];
    moex_gguf_writer *w = start(dir, name, path, sizeof path);
    if (!w) return 1;
    if (alignment != 32) moex_gguf_writer_kv_u32(w, "general.alignment", alignment);
    moex_gguf_writer_kv_str(w, "general.architecture", "qwen3moe");
    const struct { const char *name; moex_type type; uint32_t n_dims; int64_t ne[4]; } ts[] = {
        {"token_embd.weight", MOEX_TYPE_Q8_0, 2, {32, 4}},
        {"output_norm.weight", MOEX_TYPE_F32, 1, {8}},
        {"blk.0.ffn_gate_exps.weight", MOEX_TYPE_Q4_K, 3, {256, 1, 2}},
        {"blk.0.attn_q.weight", MOEX_TYPE_F16, 2, {4, 4}},
        {"blk.0.ffn_down_exps.weight", MOEX_TYPE_Q6_K, 4, {256, 1, 1, 1}},
    };
    size_t total = 0;
    for (int i = 0; i < 5; i++) {
        moex_gguf_writer_tensor(w, ts[i].name, ts[i].type, ts[i].n_dims, ts[i].ne);
        int64_t rows = 1;
        for (uint32_t d = 1; d < ts[i].n_dims; d++) rows *= ts[i].ne[d];
        total += moex_row_bytes(ts[i].type, ts[i].ne[0]) * (size_t)rows;
    }
    moex_gguf_writer_begin_data(w);
    put_bytes(w, total);
    return finish(w);
}

/* A slice of a real vocabulary: realistic keys and strings. */
static int seed_vocab_slice(const char *dir, const char *vocab) {
    moex_error err;
    moex_gguf *src = moex_gguf_open(vocab, &err);
    if (!src) {
        fprintf(stderr, "gguf_fuzz_seeds: %s: %s\n", vocab, err.msg);
        return 1;
    }
    char path[1024];
    moex_gguf_writer *w = start(dir, "vocab_slice", path, sizeof path);
    if (!w) {
        moex_gguf_close(src);
        return 1;
    }
    for (uint64_t i = 0; i < src->n_kv; i++) {
        moex_gguf_kv kv = src->kvs[i];
        if (kv.value.type == MOEX_GGUF_ARRAY && kv.value.v.arr.n > 64) kv.value.v.arr.n = 64;
        if (kv.value.type == MOEX_GGUF_STRING && kv.value.v.str.len > 64) kv.value.v.str.len = 64;
        moex_gguf_writer_kv_copy(w, &kv);
    }
    moex_gguf_close(src);
    return finish(w);
}

/* The same file declared as GGUF v2 (same layout): v2 files are still around. */
static int seed_v2_copy(const char *dir, const char *from, const char *to) {
    char src[1024], dst[1024];
    snprintf(src, sizeof src, "%s/%s", dir, from);
    snprintf(dst, sizeof dst, "%s/%s", dir, to);
    unsigned char buf[4096];
    FILE *f = fopen(src, "rb");
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    if (n < 8) return 1;
    buf[4] = 2;
    FILE *g = fopen(dst, "wb");
    if (!g) return 1;
    int bad = fwrite(buf, 1, n, g) != n;
    return fclose(g) != 0 || bad;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s OUTDIR [VOCAB.gguf]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    int bad = seed_scalars(dir) + seed_arrays(dir) + seed_tensors(dir, "tensors", 32) +
              seed_tensors(dir, "tensors_align64", 64);
    bad += seed_v2_copy(dir, "tensors", "tensors_v2");
    if (argc == 3) bad += seed_vocab_slice(dir, argv[2]);
    return bad ? 1 : 0;
}
