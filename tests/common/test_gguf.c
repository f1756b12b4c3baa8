/* GGUF reader on the real vocab fixtures, and writer -> reader round trips.
 * usage: test_gguf QWEN2.gguf LLAMA_BPE.gguf LLAMA_SPM.gguf TMPDIR */
#include "common/gguf.h"
#include "tests/common/gguf_test_util.h"

#include <math.h>
#include <unistd.h>

static char g_tmpdir[512];

/* The 151936-token vocab opens in ~2 ms in Release; sanitizers make it ~15x slower. */
#if defined(__SANITIZE_ADDRESS__)
static const double k_open_limit_s = 0.5;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
static const double k_open_limit_s = 0.5;
#else
static const double k_open_limit_s = 0.1;
#endif
#else
static const double k_open_limit_s = 0.1;
#endif

static void tmp_path(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/test_gguf_%d_%s", g_tmpdir, (int)getpid(), name);
}

static bool str_eq(moex_gguf_str s, const char *c) { return s.len == strlen(c) && memcmp(s.data, c, s.len) == 0; }

/* ---- fixtures ---- */

static void check_vocab(const char *path, const char *model, const char *pre, uint64_t n_vocab, const char *tok0,
                        bool has_scores) {
    moex_error err = {{0}};
    double t0 = moex_time_s();
    moex_gguf *g = moex_gguf_open(path, &err);
    double ms = (moex_time_s() - t0) * 1e3;
    if (!g) {
        fprintf(stderr, "%s: %s\n", path, err.msg);
        CHECK(!"fixture opens");
        return;
    }
    fprintf(stderr, "%s: opened in %.2f ms\n", path, ms);
    CHECK(g->version == 3);
    CHECK(g->n_tensors == 0);
    CHECK(g->alignment == 32);
    char buf[64];
    CHECK(moex_gguf_get_str(g, "tokenizer.ggml.model", buf, sizeof buf, &err) == 0 && !strcmp(buf, model));
    CHECK(moex_gguf_get_str(g, "tokenizer.ggml.pre", buf, sizeof buf, &err) == 0 && !strcmp(buf, pre));
    const moex_gguf_value *toks = moex_gguf_get_array(g, "tokenizer.ggml.tokens", MOEX_GGUF_STRING, &err);
    CHECK(toks && toks->v.arr.n == n_vocab);
    if (toks) CHECK(str_eq(toks->v.arr.strs[0], tok0));
    const moex_gguf_value *types = moex_gguf_get_array(g, "tokenizer.ggml.token_type", MOEX_GGUF_INT32, &err);
    CHECK(types && types->v.arr.n == n_vocab);
    /* token types are 1..6 in llama.cpp */
    if (types) CHECK(moex_gguf_arr_i64(types, 0) >= 1 && moex_gguf_arr_i64(types, n_vocab - 1) <= 6);
    if (has_scores) {
        const moex_gguf_value *sc = moex_gguf_get_array(g, "tokenizer.ggml.scores", MOEX_GGUF_FLOAT32, &err);
        CHECK(sc && sc->v.arr.n == n_vocab);
    }
    /* wrong element type is an error naming both types */
    CHECK(!moex_gguf_get_array(g, "tokenizer.ggml.tokens", MOEX_GGUF_INT32, &err) && strstr(err.msg, "string") &&
          strstr(err.msg, "int32"));
    uint32_t u;
    CHECK(moex_gguf_get_u32(g, "general.file_type", &u, &err) == 0 && u == 1);
    CHECK(moex_gguf_get_u32(g, "tokenizer.ggml.model", &u, &err) == -1 && strstr(err.msg, "tokenizer.ggml.model") &&
          strstr(err.msg, "string"));
    CHECK(moex_gguf_get_u32(g, "no.such.key", &u, &err) == -1 && strstr(err.msg, "no.such.key"));
    CHECK(!moex_gguf_find_tensor(g, "token_embd.weight"));
    moex_gguf_close(g);
}

static void test_fixtures(const char *qwen2, const char *bpe, const char *spm) {
    check_vocab(qwen2, "gpt2", "qwen2", 151936, "!", false);
    check_vocab(bpe, "gpt2", "llama-bpe", 128256, "!", false);
    check_vocab(spm, "llama", "default", 32000, "<unk>", true);

    /* The 151936-token vocab must open fast: best of 5 (the first run faults pages in). */
    double best = 1e9;
    for (int i = 0; i < 5; i++) {
        moex_error err;
        double t0 = moex_time_s();
        moex_gguf *g = moex_gguf_open(qwen2, &err);
        double dt = moex_time_s() - t0;
        CHECK(g != NULL);
        moex_gguf_close(g);
        if (dt < best) best = dt;
    }
    fprintf(stderr, "qwen2 vocab open: best %.2f ms (limit %.0f ms)\n", best * 1e3, k_open_limit_s * 1e3);
    CHECK(best < k_open_limit_s);

    moex_error err;
    moex_gguf *g = moex_gguf_open(spm, &err);
    CHECK(g != NULL);
    if (g) {
        uint32_t bos, eos;
        bool add_bos;
        CHECK(moex_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos, &err) == 0 && bos == 1);
        CHECK(moex_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &eos, &err) == 0 && eos == 2);
        CHECK(moex_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos, &err) == 0);
        float eps;
        CHECK(moex_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps, &err) == 0 && eps > 0 && eps < 1e-3);
        const moex_gguf_value *toks = moex_gguf_get_array(g, "tokenizer.ggml.tokens", MOEX_GGUF_STRING, &err);
        CHECK(toks && str_eq(toks->v.arr.strs[1], "<s>") && str_eq(toks->v.arr.strs[2], "</s>"));
        moex_gguf_close(g);
    }
}

/* ---- deep value comparison ---- */

static bool values_equal(const moex_gguf_value *a, const moex_gguf_value *b) {
    if (a->type != b->type) return false;
    switch (a->type) {
    case MOEX_GGUF_STRING:
        return a->v.str.len == b->v.str.len && !memcmp(a->v.str.data, b->v.str.data, a->v.str.len);
    case MOEX_GGUF_FLOAT32: case MOEX_GGUF_FLOAT64:
        return a->v.f64 == b->v.f64;
    case MOEX_GGUF_INT8: case MOEX_GGUF_INT16: case MOEX_GGUF_INT32: case MOEX_GGUF_INT64:
        return a->v.i64 == b->v.i64;
    case MOEX_GGUF_ARRAY:
        break;
    default:
        return a->v.u64 == b->v.u64;
    }
    if (a->v.arr.elem_type != b->v.arr.elem_type || a->v.arr.n != b->v.arr.n) return false;
    uint64_t n = a->v.arr.n;
    size_t es = moex_gguf_vtype_size(a->v.arr.elem_type);
    if (es) return n == 0 || !memcmp(a->v.arr.raw, b->v.arr.raw, n * es);
    for (uint64_t i = 0; i < n; i++) {
        if (a->v.arr.elem_type == MOEX_GGUF_STRING) {
            moex_gguf_str x = a->v.arr.strs[i], y = b->v.arr.strs[i];
            if (x.len != y.len || memcmp(x.data, y.data, x.len)) return false;
        } else if (!values_equal(&a->v.arr.items[i], &b->v.arr.items[i])) {
            return false;
        }
    }
    return true;
}

/* ---- writer round trip ---- */

typedef struct tspec {
    const char *name;
    moex_type type;
    uint32_t n_dims;
    int64_t ne[4];
} tspec;

static const tspec k_tensors[] = {
    {"a.f32", MOEX_TYPE_F32, 2, {7, 3}},
    {"b.f16", MOEX_TYPE_F16, 1, {5}},
    {"c.q4_0", MOEX_TYPE_Q4_0, 2, {64, 2}},
    {"d.q8_0", MOEX_TYPE_Q8_0, 3, {32, 3, 2}},
    {"e.q4_K", MOEX_TYPE_Q4_K, 2, {256, 2}},
    {"f.q6_K", MOEX_TYPE_Q6_K, 4, {512, 1, 1, 2}},
    {"g.bf16", MOEX_TYPE_BF16, 4, {3, 2, 2, 2}},
    {"h.q5_K", MOEX_TYPE_Q5_K, 1, {256}},
    {"i.q4_1", MOEX_TYPE_Q4_1, 1, {32}},
    {"j.q5_0", MOEX_TYPE_Q5_0, 1, {32}},
    {"k.q5_1", MOEX_TYPE_Q5_1, 1, {96}},
    {"l.mxfp4", MOEX_TYPE_MXFP4, 3, {64, 3, 2}},   /* 17-byte blocks: rows of 34 bytes */
};
#define N_TENSORS (sizeof k_tensors / sizeof k_tensors[0])

static size_t spec_bytes(const tspec *t) {
    int64_t rows = 1;
    for (uint32_t d = 1; d < t->n_dims; d++) rows *= t->ne[d];
    return moex_row_bytes(t->type, t->ne[0]) * (size_t)rows;
}

static uint8_t pattern_byte(size_t tensor, size_t i) { return (uint8_t)(tensor * 31 + i * 7 + (i >> 8)); }

/* Hand-built values of every type, nested arrays included, written through kv_copy. */
static moex_gguf_kv make_kv(const char *key, moex_gguf_value v) {
    return (moex_gguf_kv){{strlen(key), key}, v};
}

static const moex_gguf_str k_strs[] = {{3, "abc"}, {0, ""}, {5, "x\0y\"z"}, {4, "\xe4\xbd\xa0\xe5"}};
static const int32_t k_i32s[] = {-1, 0, 2147483647, -2147483647 - 1, 42};

static void fill_nested(moex_gguf_value inner[3], moex_gguf_value *deep, moex_gguf_value deeper[2]) {
    inner[0] = (moex_gguf_value){MOEX_GGUF_ARRAY, .v.arr = {MOEX_GGUF_STRING, 4, NULL, k_strs, NULL}};
    inner[1] = (moex_gguf_value){MOEX_GGUF_ARRAY, .v.arr = {MOEX_GGUF_INT32, 5, k_i32s, NULL, NULL}};
    inner[2] = (moex_gguf_value){MOEX_GGUF_ARRAY, .v.arr = {MOEX_GGUF_FLOAT64, 0, NULL, NULL, NULL}};
    /* three levels: [[[1,2,-1,...]], []] */
    deeper[0] = (moex_gguf_value){MOEX_GGUF_ARRAY, .v.arr = {MOEX_GGUF_ARRAY, 1, NULL, NULL, &inner[1]}};
    deeper[1] = (moex_gguf_value){MOEX_GGUF_ARRAY, .v.arr = {MOEX_GGUF_ARRAY, 0, NULL, NULL, NULL}};
    *deep = (moex_gguf_value){MOEX_GGUF_ARRAY, .v.arr = {MOEX_GGUF_ARRAY, 2, NULL, NULL, deeper}};
}

static int write_roundtrip_file(const char *path, uint32_t alignment, moex_gguf_kv *kvs, int n_kvs, size_t chunk) {
    moex_error err;
    moex_gguf_writer *w = moex_gguf_writer_open(path, &err);
    if (!w) {
        fprintf(stderr, "writer_open: %s\n", err.msg);
        return -1;
    }
    if (alignment != 32) moex_gguf_writer_kv_u32(w, "general.alignment", alignment);
    moex_gguf_writer_kv_u32(w, "t.u32", 4000000000u);
    moex_gguf_writer_kv_i32(w, "t.i32", -123456);
    moex_gguf_writer_kv_u64(w, "t.u64", UINT64_MAX);
    moex_gguf_writer_kv_f32(w, "t.f32", 1.5e-6f);
    moex_gguf_writer_kv_bool(w, "t.bool", true);
    moex_gguf_writer_kv_str(w, "t.str", "hello, gguf");
    static const float f32s[] = {1.0f, -2.5f, 3e30f};
    static const uint8_t u8s[] = {0, 1, 255};
    static const int64_t i64s[] = {INT64_MIN, 0, INT64_MAX};
    static const double f64s[] = {0.1, -1e300};
    static const uint16_t u16s[] = {1, 65535};
    static const char *const strs[] = {"first", "", "th\xc3\xaerd"};
    moex_gguf_writer_kv_array(w, "a.f32", MOEX_GGUF_FLOAT32, f32s, 3);
    moex_gguf_writer_kv_array(w, "a.u8", MOEX_GGUF_UINT8, u8s, 3);
    moex_gguf_writer_kv_array(w, "a.i64", MOEX_GGUF_INT64, i64s, 3);
    moex_gguf_writer_kv_array(w, "a.f64", MOEX_GGUF_FLOAT64, f64s, 2);
    moex_gguf_writer_kv_array(w, "a.u16", MOEX_GGUF_UINT16, u16s, 2);
    moex_gguf_writer_kv_array(w, "a.str", MOEX_GGUF_STRING, strs, 3);
    moex_gguf_writer_kv_array(w, "a.empty", MOEX_GGUF_INT32, NULL, 0);
    for (int i = 0; i < n_kvs; i++) moex_gguf_writer_kv_copy(w, &kvs[i]);
    for (size_t i = 0; i < N_TENSORS; i++)
        moex_gguf_writer_tensor(w, k_tensors[i].name, k_tensors[i].type, k_tensors[i].n_dims, k_tensors[i].ne);
    moex_gguf_writer_begin_data(w);
    /* Stream all tensors' bytes as one sequence cut in `chunk`-sized pieces, so pieces straddle tensors. */
    size_t total = 0;
    for (size_t i = 0; i < N_TENSORS; i++) total += spec_bytes(&k_tensors[i]);
    uint8_t *all = malloc(total);
    size_t pos = 0;
    for (size_t i = 0; i < N_TENSORS; i++)
        for (size_t j = 0; j < spec_bytes(&k_tensors[i]); j++) all[pos++] = pattern_byte(i, j);
    for (size_t off = 0; off < total; off += chunk)
        moex_gguf_writer_data(w, all + off, total - off < chunk ? total - off : chunk);
    free(all);
    int rc = moex_gguf_writer_close(w, &err);
    if (rc) fprintf(stderr, "writer_close: %s\n", err.msg);
    return rc;
}

static void check_roundtrip(const char *path, uint32_t alignment, moex_gguf_kv *kvs, int n_kvs) {
    moex_error err;
    moex_gguf *g = moex_gguf_open(path, &err);
    if (!g) {
        fprintf(stderr, "reopen: %s\n", err.msg);
        CHECK(!"round-trip file reopens");
        return;
    }
    CHECK(g->version == 3);
    CHECK(g->alignment == alignment);
    CHECK(g->data_offset % alignment == 0);
    CHECK(g->n_tensors == N_TENSORS);
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f;
    bool b;
    char s[64];
    CHECK(moex_gguf_get_u32(g, "t.u32", &u32, &err) == 0 && u32 == 4000000000u);
    CHECK(moex_gguf_get_i64(g, "t.u32", &i64, &err) == 0 && i64 == 4000000000LL);
    CHECK(moex_gguf_get_i64(g, "t.i32", &i64, &err) == 0 && i64 == -123456);
    /* range and sign checks name the key */
    CHECK(moex_gguf_get_u32(g, "t.i32", &u32, &err) == -1 && strstr(err.msg, "t.i32"));
    CHECK(moex_gguf_get_u64(g, "t.i32", &u64, &err) == -1 && strstr(err.msg, "-123456"));
    CHECK(moex_gguf_get_u64(g, "t.u64", &u64, &err) == 0 && u64 == UINT64_MAX);
    CHECK(moex_gguf_get_u32(g, "t.u64", &u32, &err) == -1 && strstr(err.msg, "uint32"));
    CHECK(moex_gguf_get_i64(g, "t.u64", &i64, &err) == -1 && strstr(err.msg, "int64"));
    CHECK(moex_gguf_get_f32(g, "t.f32", &f, &err) == 0 && f == 1.5e-6f);
    CHECK(moex_gguf_get_f32(g, "t.i32", &f, &err) == 0 && f == -123456.0f);
    CHECK(moex_gguf_get_bool(g, "t.bool", &b, &err) == 0 && b);
    CHECK(moex_gguf_get_bool(g, "t.u32", &b, &err) == -1 && strstr(err.msg, "uint32") && strstr(err.msg, "t.u32"));
    CHECK(moex_gguf_get_str(g, "t.str", s, sizeof s, &err) == 0 && !strcmp(s, "hello, gguf"));
    CHECK(moex_gguf_get_str(g, "t.str", s, 6, &err) == 0 && !strcmp(s, "hello"));  /* truncated to cap */
    CHECK(moex_gguf_get_str(g, "t.f32", s, sizeof s, &err) == -1 && strstr(err.msg, "float32"));
    CHECK(moex_gguf_get_f32(g, "t.str", &f, &err) == -1 && strstr(err.msg, "string"));

    const moex_gguf_value *a;
    CHECK((a = moex_gguf_get_array(g, "a.f32", MOEX_GGUF_FLOAT32, &err)) && a->v.arr.n == 3 &&
          moex_gguf_arr_f64(a, 1) == -2.5 && moex_gguf_arr_f64(a, 2) == (double)3e30f && moex_gguf_arr_i64(a, 1) == -2);
    CHECK((a = moex_gguf_get_array(g, "a.u8", MOEX_GGUF_UINT8, &err)) && moex_gguf_arr_i64(a, 2) == 255);
    CHECK((a = moex_gguf_get_array(g, "a.i64", MOEX_GGUF_INT64, &err)) && moex_gguf_arr_i64(a, 0) == INT64_MIN &&
          moex_gguf_arr_i64(a, 2) == INT64_MAX);
    CHECK((a = moex_gguf_get_array(g, "a.f64", MOEX_GGUF_FLOAT64, &err)) && moex_gguf_arr_f64(a, 1) == -1e300);
    CHECK((a = moex_gguf_get_array(g, "a.u16", MOEX_GGUF_UINT16, &err)) && moex_gguf_arr_i64(a, 1) == 65535);
    CHECK(a && moex_gguf_arr_i64(a, 2) == 0 && moex_gguf_arr_f64(a, 99) == 0);  /* out of range: 0, no crash */
    CHECK((a = moex_gguf_get_array(g, "a.str", MOEX_GGUF_STRING, &err)) && a->v.arr.n == 3 &&
          str_eq(a->v.arr.strs[0], "first") && a->v.arr.strs[1].len == 0 && str_eq(a->v.arr.strs[2], "th\xc3\xaerd"));
    CHECK((a = moex_gguf_get_array(g, "a.empty", MOEX_GGUF_INT32, &err)) && a->v.arr.n == 0);

    for (int i = 0; i < n_kvs; i++) {
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)kvs[i].key.len, kvs[i].key.data);
        const moex_gguf_kv *kv = moex_gguf_find(g, key);
        CHECK(kv && values_equal(&kv->value, &kvs[i].value));
        if (!kv || !values_equal(&kv->value, &kvs[i].value)) fprintf(stderr, "  key %s differs\n", key);
    }

    for (size_t i = 0; i < N_TENSORS; i++) {
        const tspec *ts = &k_tensors[i];
        const moex_gguf_tensor *t = moex_gguf_find_tensor(g, ts->name);
        CHECK(t != NULL);
        if (!t) continue;
        CHECK(t == &g->tensors[i]);   /* info order kept */
        CHECK(t->type == ts->type && t->n_dims == ts->n_dims);
        int64_t n = 1;
        for (uint32_t d = 0; d < 4; d++) {
            int64_t want = d < ts->n_dims ? ts->ne[d] : 1;
            CHECK(t->ne[d] == want);
            n *= want;
        }
        CHECK(t->n_elements == n);
        CHECK(t->nbytes == spec_bytes(ts));
        CHECK(t->offset % alignment == 0);
        CHECK((const uint8_t *)t->data == g->base + g->data_offset + t->offset);
        size_t bad = 0;
        for (size_t j = 0; j < t->nbytes; j++) bad += ((const uint8_t *)t->data)[j] != pattern_byte(i, j);
        CHECK(bad == 0);
    }
    CHECK(moex_gguf_find_tensor(g, "nope") == NULL);
    CHECK(moex_gguf_find_tensor(g, "a.f3") == NULL);
    moex_gguf_close(g);
}

static void test_writer_roundtrip(void) {
    moex_gguf_value inner[3], deep, deeper[2];
    fill_nested(inner, &deep, deeper);
    static const int16_t i16s[] = {-32768, 32767};
    static const uint8_t bools[] = {1, 0, 1};
    moex_gguf_kv kvs[] = {
        make_kv("v.u8", (moex_gguf_value){MOEX_GGUF_UINT8, .v.u64 = 200}),
        make_kv("v.i8", (moex_gguf_value){MOEX_GGUF_INT8, .v.i64 = -100}),
        make_kv("v.u16", (moex_gguf_value){MOEX_GGUF_UINT16, .v.u64 = 60000}),
        make_kv("v.i16", (moex_gguf_value){MOEX_GGUF_INT16, .v.i64 = -30000}),
        make_kv("v.u32", (moex_gguf_value){MOEX_GGUF_UINT32, .v.u64 = 123}),
        make_kv("v.i32", (moex_gguf_value){MOEX_GGUF_INT32, .v.i64 = -7}),
        make_kv("v.f32", (moex_gguf_value){MOEX_GGUF_FLOAT32, .v.f64 = 0.25}),
        make_kv("v.bool", (moex_gguf_value){MOEX_GGUF_BOOL, .v.u64 = 0}),
        make_kv("v.str", (moex_gguf_value){MOEX_GGUF_STRING, .v.str = {7, "a\0b\nc\td"}}),
        make_kv("v.u64", (moex_gguf_value){MOEX_GGUF_UINT64, .v.u64 = 1ull << 60}),
        make_kv("v.i64", (moex_gguf_value){MOEX_GGUF_INT64, .v.i64 = -(1ll << 60)}),
        make_kv("v.f64", (moex_gguf_value){MOEX_GGUF_FLOAT64, .v.f64 = 1e-300}),
        make_kv("v.arr_i16", (moex_gguf_value){MOEX_GGUF_ARRAY, .v.arr = {MOEX_GGUF_INT16, 2, i16s, NULL, NULL}}),
        make_kv("v.arr_bool", (moex_gguf_value){MOEX_GGUF_ARRAY, .v.arr = {MOEX_GGUF_BOOL, 3, bools, NULL, NULL}}),
        make_kv("v.arr_str", (moex_gguf_value){MOEX_GGUF_ARRAY, .v.arr = {MOEX_GGUF_STRING, 4, NULL, k_strs, NULL}}),
        make_kv("v.arr_arr", (moex_gguf_value){MOEX_GGUF_ARRAY, .v.arr = {MOEX_GGUF_ARRAY, 3, NULL, NULL, inner}}),
        make_kv("v.arr_arr_arr", deep),
    };
    int n_kvs = (int)(sizeof kvs / sizeof kvs[0]);
    char path[600];
    tmp_path(path, sizeof path, "rt.gguf");
    const size_t chunks[] = {1, 7, 100, 1 << 20};
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        CHECK(write_roundtrip_file(path, 32, kvs, n_kvs, chunks[c]) == 0);
        check_roundtrip(path, 32, kvs, n_kvs);
    }
    /* general.alignment is honoured by the writer and the reader */
    CHECK(write_roundtrip_file(path, 128, kvs, n_kvs, 333) == 0);
    check_roundtrip(path, 128, kvs, n_kvs);
    unlink(path);
}

/* kv_copy of every key of a real vocab file reproduces the values exactly. */
static void test_kv_copy_fixture(const char *vocab) {
    moex_error err;
    moex_gguf *src = moex_gguf_open(vocab, &err);
    CHECK(src != NULL);
    if (!src) return;
    char path[600];
    tmp_path(path, sizeof path, "copy.gguf");
    moex_gguf_writer *w = moex_gguf_writer_open(path, &err);
    CHECK(w != NULL);
    for (uint64_t i = 0; i < src->n_kv; i++) CHECK(moex_gguf_writer_kv_copy(w, &src->kvs[i]) == 0);
    int64_t ne[2] = {64, 4};
    CHECK(moex_gguf_writer_tensor(w, "token_embd.weight", MOEX_TYPE_Q8_0, 2, ne) == 0);
    CHECK(moex_gguf_writer_begin_data(w) == 0);
    uint8_t zeros[4 * 68] = {0};
    CHECK(moex_gguf_writer_data(w, zeros, sizeof zeros) == 0);
    CHECK(moex_gguf_writer_close(w, &err) == 0);
    moex_gguf *dst = moex_gguf_open(path, &err);
    CHECK(dst != NULL);
    if (dst) {
        CHECK(dst->n_kv == src->n_kv);
        for (uint64_t i = 0; i < src->n_kv && i < dst->n_kv; i++) {
            CHECK(dst->kvs[i].key.len == src->kvs[i].key.len &&
                  !memcmp(dst->kvs[i].key.data, src->kvs[i].key.data, src->kvs[i].key.len));
            CHECK(values_equal(&dst->kvs[i].value, &src->kvs[i].value));
        }
        const moex_gguf_tensor *t = moex_gguf_find_tensor(dst, "token_embd.weight");
        CHECK(t && t->nbytes == sizeof zeros && t->ne[0] == 64 && t->ne[1] == 4);
        moex_gguf_close(dst);
    }
    moex_gguf_close(src);
    unlink(path);
}

/* Writer misuse ends in an error from close() that says what, and no file left behind. */
static void expect_writer_error(const char *what, int scenario, const char *needle) {
    char path[600];
    tmp_path(path, sizeof path, "bad.gguf");
    moex_error err = {{0}};
    moex_gguf_writer *w = moex_gguf_writer_open(path, &err);
    CHECK(w != NULL);
    if (!w) return;
    int64_t ne[2] = {32, 2};
    uint8_t buf[256] = {0};
    switch (scenario) {
    case 0:  /* too few bytes */
        moex_gguf_writer_tensor(w, "t", MOEX_TYPE_F32, 2, ne);
        moex_gguf_writer_begin_data(w);
        moex_gguf_writer_data(w, buf, 100);
        break;
    case 1:  /* too many bytes */
        moex_gguf_writer_tensor(w, "t", MOEX_TYPE_F32, 2, ne);
        moex_gguf_writer_begin_data(w);
        moex_gguf_writer_data(w, buf, 256);
        CHECK(moex_gguf_writer_data(w, buf, 1) == -1);
        break;
    case 2:  /* duplicate key */
        moex_gguf_writer_kv_u32(w, "k", 1);
        CHECK(moex_gguf_writer_kv_str(w, "k", "x") == -1);
        break;
    case 3:  /* duplicate tensor */
        moex_gguf_writer_tensor(w, "t", MOEX_TYPE_F32, 2, ne);
        CHECK(moex_gguf_writer_tensor(w, "t", MOEX_TYPE_F32, 2, ne) == -1);
        break;
    case 4:  /* ne[0] not a multiple of the block */
        ne[0] = 33;
        CHECK(moex_gguf_writer_tensor(w, "t", MOEX_TYPE_Q4_0, 2, ne) == -1);
        break;
    case 5:  /* metadata after begin_data */
        moex_gguf_writer_begin_data(w);
        CHECK(moex_gguf_writer_kv_u32(w, "late", 1) == -1);
        break;
    case 6:  /* bad alignment */
        CHECK(moex_gguf_writer_kv_u32(w, "general.alignment", 48) == -1);
        break;
    case 7:  /* data before begin_data */
        moex_gguf_writer_tensor(w, "t", MOEX_TYPE_F32, 2, ne);
        CHECK(moex_gguf_writer_data(w, buf, 4) == -1);
        break;
    case 8:  /* n_dims 5 */
        CHECK(moex_gguf_writer_tensor(w, "t", MOEX_TYPE_F32, 5, (int64_t[5]){1, 1, 1, 1, 1}) == -1);
        break;
    }
    CHECK(moex_gguf_writer_close(w, &err) == -1);
    if (!strstr(err.msg, needle)) fprintf(stderr, "writer %s: message '%s' lacks '%s'\n", what, err.msg, needle);
    CHECK(strstr(err.msg, needle) != NULL);
    CHECK(access(path, F_OK) != 0);
}

static void test_writer_errors(void) {
    expect_writer_error("short data", 0, "got 100 of its 256 bytes");
    expect_writer_error("long data", 1, "past the last tensor");
    expect_writer_error("dup key", 2, "duplicate metadata key 'k'");
    expect_writer_error("dup tensor", 3, "duplicate tensor name 't'");
    expect_writer_error("block", 4, "not a multiple");
    expect_writer_error("late kv", 5, "after begin_data");
    expect_writer_error("alignment", 6, "power of two");
    expect_writer_error("early data", 7, "before begin_data");
    expect_writer_error("n_dims", 8, "n_dims 5");
    moex_error err = {{0}};
    CHECK(moex_gguf_writer_open("/nonexistent-dir/x.gguf", &err) == NULL && strstr(err.msg, "cannot create"));
}

/* Many tensors: lookups by name must all hit (and stay fast). */
static void test_many_tensors(void) {
    char path[600];
    tmp_path(path, sizeof path, "many.gguf");
    moex_error err;
    moex_gguf_writer *w = moex_gguf_writer_open(path, &err);
    CHECK(w != NULL);
    if (!w) return;
    enum { N = 20000 };
    char name[64];
    int64_t ne[1] = {8};
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "blk.%d.ffn_gate_exps.weight", i);
        moex_gguf_writer_tensor(w, name, MOEX_TYPE_F32, 1, ne);
    }
    moex_gguf_writer_begin_data(w);
    for (int i = 0; i < N; i++) {
        float v[8] = {(float)i};
        moex_gguf_writer_data(w, v, sizeof v);
    }
    CHECK(moex_gguf_writer_close(w, &err) == 0);
    moex_gguf *g = moex_gguf_open(path, &err);
    CHECK(g != NULL);
    if (g) {
        double t0 = moex_time_s();
        int ok = 0;
        for (int i = 0; i < N; i++) {
            snprintf(name, sizeof name, "blk.%d.ffn_gate_exps.weight", i);
            const moex_gguf_tensor *t = moex_gguf_find_tensor(g, name);
            float v0;
            if (t) memcpy(&v0, t->data, 4);
            ok += t && t->offset == (uint64_t)i * 32 && v0 == (float)i;
        }
        fprintf(stderr, "%d tensor lookups: %.2f ms\n", N, (moex_time_s() - t0) * 1e3);
        CHECK(ok == N);
        moex_gguf_close(g);
    }
    unlink(path);
}

/* Value sizes as the GGUF format defines them; none for the variable-size kinds. */
static void test_vtype_sizes(void) {
    static const struct { moex_gguf_vtype t; size_t size; } want[] = {
        {MOEX_GGUF_UINT8, sizeof(uint8_t)},   {MOEX_GGUF_INT8, sizeof(int8_t)},    {MOEX_GGUF_BOOL, 1},
        {MOEX_GGUF_UINT16, sizeof(uint16_t)}, {MOEX_GGUF_INT16, sizeof(int16_t)},  {MOEX_GGUF_UINT32, sizeof(uint32_t)},
        {MOEX_GGUF_INT32, sizeof(int32_t)},   {MOEX_GGUF_FLOAT32, sizeof(float)},  {MOEX_GGUF_UINT64, sizeof(uint64_t)},
        {MOEX_GGUF_INT64, sizeof(int64_t)},   {MOEX_GGUF_FLOAT64, sizeof(double)}, {MOEX_GGUF_STRING, 0},
        {MOEX_GGUF_ARRAY, 0},                 {(moex_gguf_vtype)99, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) CHECK(moex_gguf_vtype_size(want[i].t) == want[i].size);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s QWEN2.gguf LLAMA_BPE.gguf LLAMA_SPM.gguf TMPDIR\n", argv[0]);
        return 2;
    }
    snprintf(g_tmpdir, sizeof g_tmpdir, "%s", argv[4]);
    test_vtype_sizes();
    test_fixtures(argv[1], argv[2], argv[3]);
    test_writer_roundtrip();
    test_kv_copy_fixture(argv[3]);
    test_kv_copy_fixture(argv[1]);
    test_writer_errors();
    test_many_tensors();
    if (g_failures) fprintf(stderr, "test_gguf: %d check(s) failed\n", g_failures);
    else fprintf(stderr, "test_gguf: all checks passed\n");
    return g_failures ? 1 : 0;
}
