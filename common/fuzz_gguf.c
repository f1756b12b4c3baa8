/* libFuzzer target for the GGUF reader: parse the input, then walk everything
 * a loader would touch (every getter on every key, every array element, every
 * tensor lookup, the first and last byte of every tensor's data), so a bad
 * bound anywhere shows up under ASan/UBSan. Also linked into
 * tests/test_gguf_malformed.c, which drives it with mutated files. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t g_sink;   /* keeps the reads from being optimised away */

static void touch_str(moex_gguf_str s) {
    if (s.len) g_sink += (uint8_t)s.data[0] + (uint8_t)s.data[s.len - 1];
}

static void walk_value(const moex_gguf_value *v) {
    if (v->type == MOEX_GGUF_STRING) {
        touch_str(v->v.str);
        return;
    }
    if (v->type != MOEX_GGUF_ARRAY) return;
    uint64_t n = v->v.arr.n;
    if (v->v.arr.elem_type == MOEX_GGUF_STRING) {
        for (uint64_t i = 0; i < n; i++) touch_str(v->v.arr.strs[i]);
    } else if (v->v.arr.elem_type == MOEX_GGUF_ARRAY) {
        for (uint64_t i = 0; i < n; i++) walk_value(&v->v.arr.items[i]);
    } else {
        for (uint64_t i = 0; i < n; i++) g_sink += (uint64_t)moex_gguf_arr_i64(v, i) + (uint64_t)moex_gguf_arr_f64(v, i);
        g_sink += (uint64_t)moex_gguf_arr_i64(v, n);   /* one past the end: must be handled */
    }
}

/* Keys are not NUL-terminated in the file: the getters need a C string. */
static void walk_getters(const moex_gguf *g, const moex_gguf_kv *kv) {
    char key[256], buf[64];
    if (kv->key.len >= sizeof key || memchr(kv->key.data, 0, kv->key.len)) return;
    memcpy(key, kv->key.data, kv->key.len);
    key[kv->key.len] = 0;
    moex_error err;
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f;
    bool b;
    if (moex_gguf_find(g, key) != kv) __builtin_trap();
    if (!moex_gguf_get_u32(g, key, &u32, &err)) g_sink += u32;
    if (!moex_gguf_get_u64(g, key, &u64, &err)) g_sink += u64;
    if (!moex_gguf_get_i64(g, key, &i64, &err)) g_sink += (uint64_t)i64;
    if (!moex_gguf_get_f32(g, key, &f, &err)) g_sink += (uint64_t)(f == f);
    if (!moex_gguf_get_bool(g, key, &b, &err)) g_sink += b;
    if (!moex_gguf_get_str(g, key, buf, sizeof buf, &err)) g_sink += (uint8_t)buf[0];
    for (int t = 0; t < MOEX_GGUF_VTYPE_COUNT; t++)
        if (moex_gguf_get_array(g, key, (moex_gguf_vtype)t, &err)) g_sink++;
}

static void walk_tensor(const moex_gguf *g, const moex_gguf_tensor *t) {
    char name[256];
    if (t->name.len < sizeof name && !memchr(t->name.data, 0, t->name.len)) {
        memcpy(name, t->name.data, t->name.len);
        name[t->name.len] = 0;
        if (moex_gguf_find_tensor(g, name) != t) __builtin_trap();
    }
    const uint8_t *d = t->data;
    if (t->nbytes) g_sink += d[0] + d[t->nbytes - 1];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    moex_error err = {{0}};
    moex_gguf *g = moex_gguf_open_memory(data, size, &err);
    if (!g) {
        if (!err.msg[0]) __builtin_trap();   /* every failure must say why */
        return 0;
    }
    for (uint64_t i = 0; i < g->n_kv; i++) {
        walk_value(&g->kvs[i].value);
        walk_getters(g, &g->kvs[i]);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) walk_tensor(g, &g->tensors[i]);
    g_sink += (uintptr_t)moex_gguf_find(g, "general.architecture") + (uintptr_t)moex_gguf_find_tensor(g, "output.weight");
    moex_gguf_close(g);
    return 0;
}
