/* The reader refuses every kind of broken GGUF with a relevant message, and
 * never crashes or leaks (run under ASan in the sanitizer build).
 * usage: test_gguf_malformed TMPDIR */
#include "common/gguf.h"
#include "tests/common/gguf_test_util.h"

#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);   /* common/fuzz_gguf.c */

enum { T_UINT32 = 4, T_BOOL = 7, T_STRING = 8, T_ARRAY = 9 };

/* open_memory must fail and the message must contain `needle`. */
static void expect_fail_at(const char *what, const gbuf *b, const char *needle, int line) {
    moex_error err = {{0}};
    moex_gguf *g = moex_gguf_open_memory(b->p, b->len, &err);
    if (g) {
        fprintf(stderr, "line %d: %s: opened, expected an error with '%s'\n", line, what, needle);
        g_failures++;
        moex_gguf_close(g);
        return;
    }
    if (!err.msg[0] || !strstr(err.msg, needle)) {
        fprintf(stderr, "line %d: %s: message '%s' lacks '%s'\n", line, what, err.msg, needle);
        g_failures++;
    }
}
#define EXPECT_FAIL(what, b, needle) expect_fail_at(what, b, needle, __LINE__)

static void expect_ok(const char *what, const gbuf *b) {
    moex_error err = {{0}};
    moex_gguf *g = moex_gguf_open_memory(b->p, b->len, &err);
    if (!g) {
        fprintf(stderr, "%s: expected to open, got '%s'\n", what, err.msg);
        g_failures++;
    }
    moex_gguf_close(g);
}

/* A valid one-tensor file: header, one uint32 key, tensor "w" f32 [8] at offset, data. */
static void one_tensor(gbuf *b, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t offset, size_t data) {
    gb_header(b, 3, 1, 1);
    gb_key(b, "k", T_UINT32);
    gb_u32(b, 7);
    gb_tensor(b, "w", n_dims, ne, type, offset);
    gb_pad(b, 32);
    gb_zeros(b, data);
}

static void test_header(void) {
    gbuf b = {0};
    gb_header(&b, 3, 0, 0);
    expect_ok("empty valid file", &b);
    b.p[0] = 'G', b.p[1] = 'G', b.p[2] = 'M', b.p[3] = 'L';
    EXPECT_FAIL("bad magic", &b, "not a GGUF file");
    gb_free(&b);

    gb_header(&b, 1, 0, 0);
    EXPECT_FAIL("v1", &b, "version 1 is not supported");
    gb_free(&b);
    gb_header(&b, 2, 0, 0);
    expect_ok("v2", &b);
    gb_free(&b);
    gb_header(&b, 4, 0, 0);
    EXPECT_FAIL("v4", &b, "unknown GGUF version 4");
    gb_free(&b);
    gb_header(&b, 0x03000000u, 0, 0);
    EXPECT_FAIL("big-endian", &b, "big-endian");
    gb_free(&b);

    /* counts no file could hold */
    gb_header(&b, 3, 0, UINT64_MAX);
    EXPECT_FAIL("huge n_kv", &b, "metadata count 18446744073709551615 cannot fit");
    gb_free(&b);
    gb_header(&b, 3, 1ull << 62, 0);
    EXPECT_FAIL("huge n_tensors", &b, "tensor count 4611686018427387904");
    gb_free(&b);
    gb_header(&b, 3, 1, 0);
    gb_zeros(&b, 31);   /* one byte short of the smallest tensor info */
    EXPECT_FAIL("n_tensors vs bytes", &b, "cannot fit");
    gb_free(&b);

    EXPECT_FAIL("empty buffer", &(gbuf){0}, "truncated");
}

static void test_values(void) {
    gbuf b = {0};
    gb_header(&b, 3, 0, 1);
    gb_key(&b, "x", 13);
    gb_u64(&b, 0);
    EXPECT_FAIL("unknown value type", &b, "key 'x': unknown value type 13");
    gb_free(&b);

    gb_header(&b, 3, 0, 1);
    gb_key(&b, "arr", T_ARRAY);
    gb_u32(&b, 200);
    gb_u64(&b, 0);
    EXPECT_FAIL("unknown array element type", &b, "unknown array element type 200");
    gb_free(&b);

    gb_header(&b, 3, 0, 2);
    gb_key(&b, "dup", T_UINT32);
    gb_u32(&b, 1);
    gb_key(&b, "dup", T_BOOL);
    gb_u8(&b, 1);
    EXPECT_FAIL("duplicate key", &b, "duplicate key 'dup'");
    gb_free(&b);

    gb_header(&b, 3, 0, 1);
    gb_key(&b, "", T_UINT32);
    gb_u32(&b, 1);
    EXPECT_FAIL("empty key", &b, "empty name");
    gb_free(&b);

    gb_header(&b, 3, 0, 1);
    gb_key(&b, "b", T_BOOL);
    gb_u8(&b, 2);
    EXPECT_FAIL("bool 2", &b, "bool value 2");
    gb_free(&b);

    gb_header(&b, 3, 0, 1);
    gb_key(&b, "s", T_STRING);
    gb_u64(&b, 1ull << 40);
    gb_bytes(&b, "abc", 3);
    EXPECT_FAIL("huge string length", &b, "string value of key 's' has length 1099511627776");
    gb_free(&b);

    gb_header(&b, 3, 0, 1);
    gb_key(&b, "a", T_ARRAY);
    gb_u32(&b, T_UINT32);
    gb_u64(&b, UINT64_MAX / 2);
    gb_zeros(&b, 64);
    EXPECT_FAIL("huge fixed array", &b, "array of 9223372036854775807 uint32 cannot fit");
    gb_free(&b);

    gb_header(&b, 3, 0, 1);
    gb_key(&b, "a", T_ARRAY);
    gb_u32(&b, T_STRING);
    gb_u64(&b, 1ull << 61);
    gb_zeros(&b, 64);
    EXPECT_FAIL("huge string array", &b, "array of 2305843009213693952 strings cannot fit");
    gb_free(&b);

    gb_header(&b, 3, 0, 1);
    gb_key(&b, "a", T_ARRAY);
    gb_u32(&b, T_STRING);
    gb_u64(&b, 3);
    gb_str(&b, "one");
    gb_u64(&b, 100);   /* second string runs past the end */
    gb_zeros(&b, 20);
    EXPECT_FAIL("string array element", &b, "string 1 of 3 has length 100");
    gb_free(&b);

    gb_header(&b, 3, 0, 1);
    gb_key(&b, "a", T_ARRAY);
    gb_u32(&b, T_ARRAY);
    gb_u64(&b, 1ull << 40);
    gb_zeros(&b, 64);
    EXPECT_FAIL("huge nested array", &b, "arrays cannot fit");
    gb_free(&b);

    /* nesting: 8 levels are fine, 9 are not */
    for (int levels = 8; levels <= 9; levels++) {
        gb_header(&b, 3, 0, 1);
        gb_key(&b, "deep", T_ARRAY);
        for (int i = 0; i < levels - 1; i++) {
            gb_u32(&b, T_ARRAY);
            gb_u64(&b, 1);
        }
        gb_u32(&b, T_UINT32);
        gb_u64(&b, 1);
        gb_u32(&b, 5);
        if (levels == 8) expect_ok("8 nested arrays", &b);
        else EXPECT_FAIL("9 nested arrays", &b, "nested deeper than 8");
        gb_free(&b);
    }

    gb_header(&b, 3, 0, 1);
    gb_key(&b, "a", T_ARRAY);
    gb_u32(&b, T_BOOL);
    gb_u64(&b, 3);
    gb_u8(&b, 0), gb_u8(&b, 1), gb_u8(&b, 9);
    EXPECT_FAIL("bool array element", &b, "bool element 2 is 9");
    gb_free(&b);
}

static void test_alignment_key(void) {
    gbuf b = {0};
    const uint32_t bad[] = {0, 3, 48};
    for (int i = 0; i < 3; i++) {
        gb_header(&b, 3, 0, 1);
        gb_key(&b, "general.alignment", T_UINT32);
        gb_u32(&b, bad[i]);
        EXPECT_FAIL("alignment not a power of two", &b, "is not a power of two");
        gb_free(&b);
    }
    gb_header(&b, 3, 0, 1);
    gb_key(&b, "general.alignment", T_STRING);
    gb_str(&b, "32");
    EXPECT_FAIL("alignment type", &b, "general.alignment has type string");
    gb_free(&b);

    /* alignment 64 moves the data section and the offsets that count as aligned */
    uint64_t ne[1] = {8};
    gb_header(&b, 3, 2, 1);
    gb_key(&b, "general.alignment", T_UINT32);
    gb_u32(&b, 64);
    gb_tensor(&b, "a", 1, ne, MOEX_TYPE_F32, 0);
    gb_tensor(&b, "b", 1, ne, MOEX_TYPE_F32, 32);
    gb_pad(&b, 64);
    gb_zeros(&b, 128);
    EXPECT_FAIL("offset 32 with alignment 64", &b, "offset 32 is not a multiple of the alignment 64");
    gb_free(&b);
}

static void test_tensor_infos(void) {
    gbuf b = {0};
    uint64_t ne8[1] = {8};
    one_tensor(&b, 1, ne8, MOEX_TYPE_F32, 0, 32);
    expect_ok("one f32 tensor", &b);
    gb_free(&b);

    one_tensor(&b, 1, ne8, 99, 0, 32);
    EXPECT_FAIL("type 99", &b, "tensor 'w': unknown tensor type 99");
    gb_free(&b);
    one_tensor(&b, 1, ne8, 4, 0, 32);   /* ids 4, 5 were removed from ggml */
    EXPECT_FAIL("type 4", &b, "unknown tensor type 4");
    gb_free(&b);
    uint64_t ne256[1] = {256};
    one_tensor(&b, 1, ne256, MOEX_TYPE_Q8_K, 0, 292);
    EXPECT_FAIL("q8_K tensor", &b, "q8_K cannot be stored");
    gb_free(&b);

    one_tensor(&b, 0, ne8, MOEX_TYPE_F32, 0, 32);
    EXPECT_FAIL("n_dims 0", &b, "n_dims = 0");
    gb_free(&b);
    uint64_t ne5[5] = {8, 1, 1, 1, 1};
    one_tensor(&b, 5, ne5, MOEX_TYPE_F32, 0, 32);
    EXPECT_FAIL("n_dims 5", &b, "n_dims = 5");
    gb_free(&b);

    uint64_t zero[2] = {8, 0};
    one_tensor(&b, 2, zero, MOEX_TYPE_F32, 0, 32);
    EXPECT_FAIL("dim 0", &b, "dimension 1 is 0");
    gb_free(&b);
    uint64_t neg[2] = {8, 1ull << 63};
    one_tensor(&b, 2, neg, MOEX_TYPE_F32, 0, 32);
    EXPECT_FAIL("negative dim", &b, "dimension 1 is 9223372036854775808");
    gb_free(&b);
    uint64_t big[2] = {1ull << 62, 1ull << 62};
    one_tensor(&b, 2, big, MOEX_TYPE_F32, 0, 32);
    EXPECT_FAIL("2^62 x 2^62", &b, "element count overflows");
    gb_free(&b);
    /* elements fit int64 but bytes do not fit: 2^61 f32 = 2^63 bytes */
    uint64_t bytes_big[2] = {1ull << 31, 1ull << 30};
    one_tensor(&b, 2, bytes_big, MOEX_TYPE_F32, 0, 32);
    EXPECT_FAIL("2^61 f32", &b, "past the end");
    gb_free(&b);

    uint64_t ne33[2] = {33, 2};
    one_tensor(&b, 2, ne33, MOEX_TYPE_Q4_0, 0, 64);
    EXPECT_FAIL("ne0 33 q4_0", &b, "ne[0] = 33 is not a multiple of q4_0's block of 32");
    gb_free(&b);

    /* MXFP4: 17-byte blocks, so a [64, 3] tensor takes 102 bytes */
    uint64_t ne64x3[2] = {64, 3};
    one_tensor(&b, 2, ne64x3, MOEX_TYPE_MXFP4, 0, 102);
    expect_ok("mxfp4 tensor", &b);
    gb_free(&b);
    one_tensor(&b, 2, ne64x3, MOEX_TYPE_MXFP4, 0, 101);
    EXPECT_FAIL("mxfp4 data one byte short", &b, "runs past the end of the file");
    gb_free(&b);
    uint64_t ne48[1] = {48};
    one_tensor(&b, 1, ne48, MOEX_TYPE_MXFP4, 0, 34);
    EXPECT_FAIL("ne0 48 mxfp4", &b, "ne[0] = 48 is not a multiple of mxfp4's block of 32");
    gb_free(&b);

    one_tensor(&b, 1, ne8, MOEX_TYPE_F32, 8, 64);
    EXPECT_FAIL("misaligned offset", &b, "offset 8 is not a multiple of the alignment 32");
    gb_free(&b);

    one_tensor(&b, 1, ne8, MOEX_TYPE_F32, 0, 31);
    EXPECT_FAIL("data one byte short", &b, "runs past the end of the file");
    gb_free(&b);
    one_tensor(&b, 1, ne8, MOEX_TYPE_F32, 1ull << 63, 32);
    EXPECT_FAIL("offset past the end", &b, "runs past the end of the file");
    gb_free(&b);
    one_tensor(&b, 1, ne8, MOEX_TYPE_F32, UINT64_MAX - 31, 32);
    EXPECT_FAIL("offset near 2^64", &b, "runs past the end of the file");  /* no wrap-around */
    gb_free(&b);

    /* two tensors: duplicate names, overlap, and the good layout */
    const struct { const char *n1, *n2; uint64_t off2; const char *needle; } cases[] = {
        {"a", "a", 32, "duplicate tensor 'a'"},
        {"a", "b", 0, "overlap"},
        {"a", "b", 32, NULL},
    };
    uint64_t ne16[1] = {16};   /* 64 bytes: [0, 64) */
    for (int i = 0; i < 3; i++) {
        gb_header(&b, 3, 2, 0);
        gb_tensor(&b, cases[i].n1, 1, ne16, MOEX_TYPE_F32, 64);
        gb_tensor(&b, cases[i].n2, 1, ne8, MOEX_TYPE_F32, cases[i].off2 + (i == 2 ? 96 : 64));
        gb_pad(&b, 32);
        gb_zeros(&b, 256);
        if (cases[i].needle) EXPECT_FAIL(cases[i].needle, &b, cases[i].needle);
        else expect_ok("adjacent tensors", &b);
        gb_free(&b);
    }
    /* partial overlap: [0,64) and [32,64) */
    gb_header(&b, 3, 2, 0);
    gb_tensor(&b, "big", 1, ne16, MOEX_TYPE_F32, 0);
    gb_tensor(&b, "small", 1, ne8, MOEX_TYPE_F32, 32);
    gb_pad(&b, 32);
    gb_zeros(&b, 64);
    EXPECT_FAIL("partial overlap", &b, "tensors 'big' [0, +64) and 'small' [32, +32) overlap");
    gb_free(&b);

    gb_header(&b, 3, 1, 0);
    gb_tensor(&b, "", 1, ne8, MOEX_TYPE_F32, 0);
    gb_pad(&b, 32);
    gb_zeros(&b, 32);
    EXPECT_FAIL("empty tensor name", &b, "tensor #0 has an empty name");
    gb_free(&b);
}

/* A small valid file with every kind of section, made by the writer. */
static int make_valid_file(const char *path) {
    moex_error err;
    moex_gguf_writer *w = moex_gguf_writer_open(path, &err);
    if (!w) return -1;
    moex_gguf_writer_kv_str(w, "general.architecture", "qwen3moe");
    moex_gguf_writer_kv_u32(w, "qwen3moe.block_count", 2);
    moex_gguf_writer_kv_f32(w, "qwen3moe.rope.freq_base", 1e6f);
    moex_gguf_writer_kv_bool(w, "b", true);
    static const char *const toks[] = {"a", "bc", "<s>"};
    moex_gguf_writer_kv_array(w, "tokenizer.ggml.tokens", MOEX_GGUF_STRING, toks, 3);
    static const int32_t types[] = {1, 1, 3};
    moex_gguf_writer_kv_array(w, "tokenizer.ggml.token_type", MOEX_GGUF_INT32, types, 3);
    moex_gguf_value inner = {MOEX_GGUF_ARRAY, .v.arr = {MOEX_GGUF_INT32, 3, types, NULL, NULL}};
    moex_gguf_kv nested = {{6, "nested"}, {MOEX_GGUF_ARRAY, .v.arr = {MOEX_GGUF_ARRAY, 1, NULL, NULL, &inner}}};
    moex_gguf_writer_kv_copy(w, &nested);
    int64_t ne_a[2] = {32, 2}, ne_b[1] = {3};
    moex_gguf_writer_tensor(w, "a", MOEX_TYPE_Q8_0, 2, ne_a);
    moex_gguf_writer_tensor(w, "b", MOEX_TYPE_F32, 1, ne_b);
    moex_gguf_writer_begin_data(w);
    uint8_t data[68 + 12];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 13);
    moex_gguf_writer_data(w, data, sizeof data);
    return moex_gguf_writer_close(w, &err);
}

static int read_file(const char *path, gbuf *b) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    uint8_t buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) gb_bytes(b, buf, n);
    fclose(f);
    return 0;
}

/* Every prefix shorter than the end of the last tensor's data fails cleanly;
 * longer ones (only trailing padding cut) still open. */
static void test_prefixes(const char *tmpdir, gbuf *valid) {
    moex_error err;
    moex_gguf *g = moex_gguf_open_memory(valid->p, valid->len, &err);
    CHECK(g != NULL);
    if (!g) return;
    size_t end = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        size_t e = g->data_offset + g->tensors[i].offset + g->tensors[i].nbytes;
        if (e > end) end = e;
    }
    moex_gguf_close(g);
    CHECK(end > 100 && end <= valid->len);
    int bad = 0;
    for (size_t len = 0; len <= valid->len; len++) {
        /* a fresh heap copy of exactly len bytes, so ASan sees any read past the end */
        uint8_t *copy = malloc(len ? len : 1);
        memcpy(copy, valid->p, len);
        moex_error e = {{0}};
        moex_gguf *p = moex_gguf_open_memory(copy, len, &e);
        bool should_open = len >= end;
        bool relevant = strstr(e.msg, "truncated") || strstr(e.msg, "cannot fit") || strstr(e.msg, "past the end");
        if ((p != NULL) != should_open || (!p && !relevant)) {
            if (bad++ < 5) fprintf(stderr, "prefix %zu of %zu: %s\n", len, valid->len, p ? "opened" : e.msg);
        }
        moex_gguf_close(p);
        free(copy);
    }
    CHECK(bad == 0);
    (void)tmpdir;
}

/* Counts flipped to huge values in an otherwise valid file. */
static void test_flipped_counts(gbuf *valid) {
    gbuf b = {0};
    const struct { size_t off; const char *needle; } cases[] = {
        {8, "tensor count"},  /* n_tensors */
        {16, "metadata count"},  /* n_kv */
        {24, "key #0"},    /* first key's length */
    };
    for (int i = 0; i < 3; i++) {
        gb_bytes(&b, valid->p, valid->len);
        uint64_t huge = UINT64_MAX - 5;
        memcpy(b.p + cases[i].off, &huge, 8);
        EXPECT_FAIL(cases[i].needle, &b, cases[i].needle);
        gb_free(&b);
    }
}

/* Deterministic random mutations through the fuzz harness: must never crash
 * (ASan/UBSan catch what a plain build would not). */
static void test_mutations(gbuf *valid) {
    uint64_t s = 0x9e3779b97f4a7c15ull;
    int opened = 0;
    const int rounds = 3000;
    uint8_t *m = malloc(valid->len);
    for (int r = 0; r < rounds; r++) {
        memcpy(m, valid->p, valid->len);
        int flips = 1 + r % 4;
        for (int k = 0; k < flips; k++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            size_t at = (size_t)(s >> 8) % valid->len;
            m[at] = (r & 1) ? (uint8_t)(s >> 32) : (uint8_t)(m[at] ^ (1u << (s % 8)));
        }
        moex_error e;
        moex_gguf *g = moex_gguf_open_memory(m, valid->len, &e);
        opened += g != NULL;
        moex_gguf_close(g);
        LLVMFuzzerTestOneInput(m, valid->len);
    }
    free(m);
    fprintf(stderr, "mutations: %d of %d opened\n", opened, rounds);
    CHECK(opened > 0 && opened < rounds);  /* both outcomes exercised */
}

static void test_open_file_errors(const char *tmpdir) {
    moex_error err = {{0}};
    CHECK(!moex_gguf_open("/nonexistent/file.gguf", &err) && strstr(err.msg, "No such file"));
    CHECK(!moex_gguf_open(tmpdir, &err) && strstr(err.msg, "not a regular file"));
    char path[600];
    snprintf(path, sizeof path, "%s/test_gguf_malformed_%d_empty.gguf", tmpdir, (int)getpid());
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) fclose(f);
    CHECK(!moex_gguf_open(path, &err) && strstr(err.msg, "empty"));
    unlink(path);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s TMPDIR\n", argv[0]);
        return 2;
    }
    test_header();
    test_values();
    test_alignment_key();
    test_tensor_infos();
    test_open_file_errors(argv[1]);

    char path[600];
    snprintf(path, sizeof path, "%s/test_gguf_malformed_%d.gguf", argv[1], (int)getpid());
    gbuf valid = {0};
    CHECK(make_valid_file(path) == 0 && read_file(path, &valid) == 0);
    unlink(path);
    if (valid.len) {
        test_prefixes(argv[1], &valid);
        test_flipped_counts(&valid);
        test_mutations(&valid);
    }
    gb_free(&valid);
    if (g_failures) fprintf(stderr, "test_gguf_malformed: %d check(s) failed\n", g_failures);
    else fprintf(stderr, "test_gguf_malformed: all checks passed\n");
    return g_failures ? 1 : 0;
}
