/* moex-gguf info FILE: version, metadata, tensor table and totals of a GGUF file. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/gguf.h"
#include "tools/tool.h"

#define PREVIEW_ITEMS 5    /* array elements shown */
#define PREVIEW_CHARS 72   /* string bytes shown */

/* A string with quotes, backslashes and control bytes escaped, cut at `max` bytes. */
static void print_str(moex_gguf_str s, size_t max) {
    putchar('"');
    size_t n = s.len < max ? (size_t)s.len : max;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.data[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c < 32 || c == 127) printf("\\x%02x", c);
        else putchar(c);
    }
    putchar('"');
    if (s.len > n) printf("...(%" PRIu64 " bytes)", s.len);
}

/* A key or tensor name, control bytes shown as '?' (names come from the file), padded to width. */
static void print_name(moex_gguf_str s, int width) {
    size_t n = s.len < 200 ? (size_t)s.len : 200;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.data[i];
        putchar(c < 32 || c == 127 ? '?' : c);
    }
    if (s.len > n) fputs("...", stdout);
    for (int i = (int)n + (s.len > n ? 3 : 0); i < width; i++) putchar(' ');
}

static const char *plural(moex_gguf_vtype t) {
    switch (t) {
    case MOEX_GGUF_STRING: return "strings";
    case MOEX_GGUF_ARRAY: return "arrays";
    case MOEX_GGUF_BOOL: return "bools";
    default: return moex_gguf_vtype_name(t);
    }
}

static void print_array(const moex_gguf_value *v, int depth);

static void print_element(const moex_gguf_value *arr, uint64_t i, int depth) {
    switch (arr->v.arr.elem_type) {
    case MOEX_GGUF_STRING: print_str(arr->v.arr.strs[i], 24); break;
    case MOEX_GGUF_ARRAY: print_array(&arr->v.arr.items[i], depth + 1); break;
    case MOEX_GGUF_FLOAT32: case MOEX_GGUF_FLOAT64: printf("%g", moex_gguf_arr_f64(arr, i)); break;
    case MOEX_GGUF_BOOL: fputs(moex_gguf_arr_i64(arr, i) ? "true" : "false", stdout); break;
    case MOEX_GGUF_UINT64: printf("%.0f", moex_gguf_arr_f64(arr, i)); break;  /* may exceed int64 */
    default: printf("%" PRId64, moex_gguf_arr_i64(arr, i)); break;
    }
}

/* [n type] followed by the first few elements; nested arrays show one level of preview. */
static void print_array(const moex_gguf_value *v, int depth) {
    uint64_t n = v->v.arr.n;
    printf("[%" PRIu64 " %s]", n, plural(v->v.arr.elem_type));
    if (n == 0 || depth > 1) return;
    uint64_t shown = n < PREVIEW_ITEMS ? n : PREVIEW_ITEMS;
    putchar(' ');
    for (uint64_t i = 0; i < shown; i++) {
        if (i) fputs(", ", stdout);
        print_element(v, i, depth);
    }
    if (n > shown) fputs(", ...", stdout);
}

static void print_value(const moex_gguf_value *v) {
    switch (v->type) {
    case MOEX_GGUF_STRING: print_str(v->v.str, PREVIEW_CHARS); break;
    case MOEX_GGUF_ARRAY: print_array(v, 0); break;
    case MOEX_GGUF_FLOAT32: case MOEX_GGUF_FLOAT64: printf("%g", v->v.f64); break;
    case MOEX_GGUF_BOOL: fputs(v->v.u64 ? "true" : "false", stdout); break;
    case MOEX_GGUF_INT8: case MOEX_GGUF_INT16: case MOEX_GGUF_INT32: case MOEX_GGUF_INT64:
        printf("%" PRId64, v->v.i64);
        break;
    default: printf("%" PRIu64, v->v.u64); break;
    }
}

static void print_metadata(const moex_gguf *g) {
    printf("metadata (%" PRIu64 " keys):\n", g->n_kv);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const moex_gguf_kv *kv = &g->kvs[i];
        fputs("  ", stdout);
        print_name(kv->key, 44);
        printf(" %-8s ", moex_gguf_vtype_name(kv->value.type));
        print_value(&kv->value);
        putchar('\n');
    }
}

static void format_shape(const moex_gguf_tensor *t, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (uint32_t d = 0; d < t->n_dims && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, d ? ", " : "", t->ne[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static void print_tensors(const moex_gguf *g) {
    if (!g->n_tensors) return;
    int w = 4;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].name.len > (uint64_t)w) w = g->tensors[i].name.len > 60 ? 60 : (int)g->tensors[i].name.len;
    printf("tensors (%" PRIu64 "):\n  %-*s %-5s %-26s %14s %14s\n", g->n_tensors, w, "name", "type", "shape", "bytes",
           "offset");
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const moex_gguf_tensor *t = &g->tensors[i];
        char shape[128];
        format_shape(t, shape, sizeof shape);
        fputs("  ", stdout);
        print_name(t->name, w);
        printf(" %-5s %-26s %14zu %14" PRIu64 "\n", moex_type_get(t->type)->name, shape, t->nbytes, t->offset);
    }
}

static void print_totals(const moex_gguf *g) {
    uint64_t params = 0, data_bytes = 0, type_bytes[MOEX_TYPE_COUNT] = {0}, type_count[MOEX_TYPE_COUNT] = {0};
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const moex_gguf_tensor *t = &g->tensors[i];
        params += (uint64_t)t->n_elements;
        data_bytes += t->nbytes;
        type_bytes[t->type] += t->nbytes;
        type_count[t->type]++;
    }
    double scaled = params >= 1e9 ? (double)params / 1e9 : (double)params / 1e6;
    printf("totals:\n  parameters  %" PRIu64 " (%.2f %s)\n  tensor data %" PRIu64 " bytes\n  file        %zu bytes"
           " (metadata and tensor infos %zu)\n",
           params, scaled, params >= 1e9 ? "B" : "M", data_bytes, g->size, g->data_offset);
    for (int t = 0; t < MOEX_TYPE_COUNT; t++) {
        if (!type_count[t]) continue;
        printf("  %-5s %6" PRIu64 " tensors %16" PRIu64 " bytes (%5.1f%%)\n", moex_type_get(t)->name, type_count[t],
               type_bytes[t], 100.0 * (double)type_bytes[t] / (double)(data_bytes ? data_bytes : 1));
    }
}

int moex_tool_info(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: moex-gguf info FILE\n");
        return 0;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: moex-gguf info FILE\n");
        return 2;
    }
    const char *path = argv[1];
    moex_error err = {{0}};
    moex_gguf *g = moex_gguf_open(path, &err);
    if (!g) {
        fprintf(stderr, "moex-gguf: %s: %s\n", path, err.msg);
        return 1;
    }
    printf("%s: GGUF v%u, alignment %zu, %" PRIu64 " keys, %" PRIu64 " tensors, %zu bytes, data at %zu\n", path,
           g->version, g->alignment, g->n_kv, g->n_tensors, g->size, g->data_offset);
    print_metadata(g);
    print_tensors(g);
    print_totals(g);
    moex_gguf_close(g);
    if (fflush(stdout) != 0) {
        perror("moex-gguf: stdout");
        return 1;
    }
    return 0;
}
