/* GGUF v2/v3 reader: maps the file and validates every byte it uses.
 *
 * The parser walks the buffer with a cursor that never moves past the end;
 * every count is checked against the bytes left before anything is allocated
 * (each element needs at least a known number of bytes), so neither a
 * truncated nor a hostile file can crash it or make it allocate more than a
 * small multiple of the file's size. Strings are pointers into the mapping. */
#include "common/gguf.h"
#include "common/gguf_index.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#define MAX_NESTING 8
#define INDEX_PRESIZE (1u << 16)   /* names indexed up front; beyond, the index grows */
/* Smallest possible encodings, for the "could the rest of the file hold this many" checks. */
#define MIN_KV_BYTES 13      /* key length u64, type u32, one value byte */
#define MIN_TENSOR_BYTES 32  /* name length u64, n_dims u32, one dim u64, type u32, offset u64 */
#define MIN_ARRAY_BYTES 12   /* nested array: elem type u32, count u64 */

/* Allocations made while parsing, freed together on close or on error. */
typedef struct chunk {
    struct chunk *next;
    max_align_t data[];
} chunk;

typedef struct gguf_internal {
    void *map;               /* mmap'd file, or NULL for memory buffers */
    size_t map_size;
    chunk *chunks;
    moex_name_index kv_index, tensor_index;
} gguf_internal;

typedef struct parser {
    const uint8_t *base;
    size_t size, pos;
    gguf_internal *in;
    moex_error *err;
} parser;

static const char *const vtype_names[MOEX_GGUF_VTYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool", "string", "array", "uint64", "int64", "float64",
};

const char *moex_gguf_vtype_name(moex_gguf_vtype t) {
    return (unsigned)t < MOEX_GGUF_VTYPE_COUNT ? vtype_names[t] : "unknown";
}

size_t moex_gguf_vtype_size(moex_gguf_vtype t) {
    switch (t) {
    case MOEX_GGUF_UINT8: case MOEX_GGUF_INT8: case MOEX_GGUF_BOOL: return 1;
    case MOEX_GGUF_UINT16: case MOEX_GGUF_INT16: return 2;
    case MOEX_GGUF_UINT32: case MOEX_GGUF_INT32: case MOEX_GGUF_FLOAT32: return 4;
    case MOEX_GGUF_UINT64: case MOEX_GGUF_INT64: case MOEX_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static void *arena_alloc(gguf_internal *in, size_t n, size_t elem) {
    if (elem && n > (SIZE_MAX - sizeof(chunk)) / elem) return NULL;
    chunk *c = calloc(1, sizeof(chunk) + n * elem);
    if (!c) return NULL;
    c->next = in->chunks;
    in->chunks = c;
    return c->data;
}

/* A name from the file, made safe to print: at most 80 bytes, non-printables as '?'. */
typedef struct { char s[96]; } printable;
static printable show(moex_gguf_str str) {
    printable p;
    size_t n = str.len < 80 ? (size_t)str.len : 80, j = 0;
    for (size_t i = 0; i < n; i++) p.s[j++] = (str.data[i] >= 32 && str.data[i] < 127) ? str.data[i] : '?';
    if (str.len > n) { memcpy(p.s + j, "...", 3); j += 3; }
    p.s[j] = 0;
    return p;
}

/* ---- cursor reads: each fails with "truncated" naming what was being read ---- */

static size_t bytes_left(const parser *p) { return p->size - p->pos; }

static int need(parser *p, size_t n, const char *what, const char *item) {
    if (bytes_left(p) >= n) return 0;
    return moex_fail(p->err, "truncated file: %s%s%s needs %zu bytes at offset %zu, only %zu left", what,
                     item ? " of " : "", item ? item : "", n, p->pos, bytes_left(p));
}

static int read_u32(parser *p, uint32_t *v, const char *what, const char *item) {
    if (need(p, 4, what, item)) return -1;
    memcpy(v, p->base + p->pos, 4);
    p->pos += 4;
    return 0;
}

static int read_u64(parser *p, uint64_t *v, const char *what, const char *item) {
    if (need(p, 8, what, item)) return -1;
    memcpy(v, p->base + p->pos, 8);
    p->pos += 8;
    return 0;
}

static int read_str(parser *p, moex_gguf_str *s, const char *what, const char *item) {
    uint64_t len;
    if (read_u64(p, &len, what, item)) return -1;
    if (len > bytes_left(p))
        return moex_fail(p->err, "truncated file: %s%s%s has length %" PRIu64 " at offset %zu, only %zu bytes left",
                         what, item ? " of " : "", item ? item : "", len, p->pos - 8, bytes_left(p));
    s->len = len;
    s->data = (const char *)p->base + p->pos;
    p->pos += (size_t)len;
    return 0;
}

/* ---- metadata values ---- */

static int read_scalar(parser *p, moex_gguf_value *v, const char *item) {
    size_t n = moex_gguf_vtype_size(v->type);
    if (need(p, n, moex_gguf_vtype_name(v->type), item)) return -1;
    const uint8_t *b = p->base + p->pos;
    uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32; float f32;
    switch (v->type) {
    case MOEX_GGUF_UINT8: u8 = b[0]; v->v.u64 = u8; break;
    case MOEX_GGUF_INT8: memcpy(&i8, b, 1); v->v.i64 = i8; break;
    case MOEX_GGUF_BOOL:
        if (b[0] > 1) return moex_fail(p->err, "%s: bool value %u at offset %zu is not 0 or 1", item, b[0], p->pos);
        v->v.u64 = b[0];
        break;
    case MOEX_GGUF_UINT16: memcpy(&u16, b, 2); v->v.u64 = u16; break;
    case MOEX_GGUF_INT16: memcpy(&i16, b, 2); v->v.i64 = i16; break;
    case MOEX_GGUF_UINT32: memcpy(&u32, b, 4); v->v.u64 = u32; break;
    case MOEX_GGUF_INT32: memcpy(&i32, b, 4); v->v.i64 = i32; break;
    case MOEX_GGUF_FLOAT32: memcpy(&f32, b, 4); v->v.f64 = f32; break;
    case MOEX_GGUF_UINT64: memcpy(&v->v.u64, b, 8); break;
    case MOEX_GGUF_INT64: memcpy(&v->v.i64, b, 8); break;
    case MOEX_GGUF_FLOAT64: memcpy(&v->v.f64, b, 8); break;
    default: return moex_fail(p->err, "%s: not a scalar type", item);
    }
    p->pos += n;
    return 0;
}

static int read_value(parser *p, moex_gguf_value *v, int depth, const char *item);

static int read_string_array(parser *p, moex_gguf_value *v, const char *item) {
    uint64_t n = v->v.arr.n;
    if (n > bytes_left(p) / 8)
        return moex_fail(p->err, "%s: array of %" PRIu64 " strings cannot fit in the %zu bytes left", item, n, bytes_left(p));
    moex_gguf_str *strs = arena_alloc(p->in, (size_t)n, sizeof *strs);
    if (!strs && n) return moex_fail(p->err, "%s: out of memory for %" PRIu64 " strings", item, n);
    /* The hot loop for 150k-token vocabularies: no per-string formatting. */
    const uint8_t *base = p->base;
    size_t pos = p->pos, size = p->size;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len;
        if (size - pos < 8) {
            p->pos = pos;
            return moex_fail(p->err, "truncated file: %s: string %" PRIu64 " of %" PRIu64 " at offset %zu", item, i, n, pos);
        }
        memcpy(&len, base + pos, 8);
        pos += 8;
        if (len > size - pos) {
            p->pos = pos;
            return moex_fail(p->err, "truncated file: %s: string %" PRIu64 " of %" PRIu64 " has length %" PRIu64
                             " at offset %zu, only %zu bytes left", item, i, n, len, pos - 8, size - pos);
        }
        strs[i].len = len;
        strs[i].data = (const char *)base + pos;
        pos += (size_t)len;
    }
    p->pos = pos;
    v->v.arr.strs = strs;
    return 0;
}

static int read_array(parser *p, moex_gguf_value *v, int depth, const char *item) {
    if (depth >= MAX_NESTING) return moex_fail(p->err, "%s: arrays nested deeper than %d", item, MAX_NESTING);
    uint32_t et;
    uint64_t n;
    if (read_u32(p, &et, "array element type", item) || read_u64(p, &n, "array length", item)) return -1;
    if (et >= MOEX_GGUF_VTYPE_COUNT)
        return moex_fail(p->err, "%s: unknown array element type %u at offset %zu", item, et, p->pos - 12);
    v->v.arr.elem_type = (moex_gguf_vtype)et;
    v->v.arr.n = n;
    size_t esize = moex_gguf_vtype_size(v->v.arr.elem_type);
    if (esize) {
        if (n > bytes_left(p) / esize)
            return moex_fail(p->err, "%s: array of %" PRIu64 " %s cannot fit in the %zu bytes left", item, n,
                             vtype_names[et], bytes_left(p));
        v->v.arr.raw = p->base + p->pos;
        if (et == MOEX_GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (p->base[p->pos + i] > 1)
                    return moex_fail(p->err, "%s: bool element %" PRIu64 " is %u, not 0 or 1", item, i, p->base[p->pos + i]);
        p->pos += (size_t)(n * esize);
        return 0;
    }
    if (et == MOEX_GGUF_STRING) return read_string_array(p, v, item);
    /* Nested arrays: each item is itself (elem type, count, elements). */
    if (n > bytes_left(p) / MIN_ARRAY_BYTES)
        return moex_fail(p->err, "%s: array of %" PRIu64 " arrays cannot fit in the %zu bytes left", item, n, bytes_left(p));
    moex_gguf_value *items = arena_alloc(p->in, (size_t)n, sizeof *items);
    if (!items && n) return moex_fail(p->err, "%s: out of memory for %" PRIu64 " arrays", item, n);
    for (uint64_t i = 0; i < n; i++) {
        items[i].type = MOEX_GGUF_ARRAY;
        if (read_array(p, &items[i], depth + 1, item)) return -1;
    }
    v->v.arr.items = items;
    return 0;
}

static int read_value(parser *p, moex_gguf_value *v, int depth, const char *item) {
    if (v->type == MOEX_GGUF_STRING) return read_str(p, &v->v.str, "string value", item);
    if (v->type == MOEX_GGUF_ARRAY) return read_array(p, v, depth, item);
    return read_scalar(p, v, item);
}

static int read_kv(parser *p, moex_gguf *g, uint64_t i) {
    char what[64];
    snprintf(what, sizeof what, "key #%" PRIu64, i);
    moex_gguf_kv *kv = &g->kvs[i];
    if (read_str(p, &kv->key, "name", what)) return -1;
    if (kv->key.len == 0) return moex_fail(p->err, "%s has an empty name (offset %zu)", what, p->pos - 8);
    char item[128];
    snprintf(item, sizeof item, "key '%s'", show(kv->key).s);
    uint32_t type;
    if (read_u32(p, &type, "value type", item)) return -1;
    if (type >= MOEX_GGUF_VTYPE_COUNT)
        return moex_fail(p->err, "%s: unknown value type %u at offset %zu", item, type, p->pos - 4);
    kv->value.type = (moex_gguf_vtype)type;
    if (read_value(p, &kv->value, 0, item)) return -1;
    uint64_t prev;
    int r = moex_name_index_add(&p->in->kv_index, kv->key.data, kv->key.len, i, &prev);
    if (r < 0) return moex_fail(p->err, "out of memory indexing keys");
    if (r > 0) return moex_fail(p->err, "duplicate %s (key #%" PRIu64 " and #%" PRIu64 ")", item, prev, i);
    return 0;
}

/* general.alignment: a power-of-two uint32 when present. */
static int read_alignment(moex_gguf *g, moex_error *err) {
    g->alignment = MOEX_GGUF_DEFAULT_ALIGNMENT;
    const moex_gguf_kv *kv = moex_gguf_find(g, "general.alignment");
    if (!kv) return 0;
    if (kv->value.type != MOEX_GGUF_UINT32)
        return moex_fail(err, "general.alignment has type %s, expected uint32", moex_gguf_vtype_name(kv->value.type));
    uint64_t a = kv->value.v.u64;
    if (a == 0 || (a & (a - 1))) return moex_fail(err, "general.alignment = %" PRIu64 " is not a power of two", a);
    g->alignment = (size_t)a;
    return 0;
}

/* ---- tensor infos ---- */

static int read_tensor_info(parser *p, moex_gguf *g, uint64_t i) {
    char what[64];
    snprintf(what, sizeof what, "tensor #%" PRIu64, i);
    moex_gguf_tensor *t = &g->tensors[i];
    if (read_str(p, &t->name, "name", what)) return -1;
    if (t->name.len == 0) return moex_fail(p->err, "%s has an empty name (offset %zu)", what, p->pos - 8);
    char item[128];
    snprintf(item, sizeof item, "tensor '%s'", show(t->name).s);
    if (read_u32(p, &t->n_dims, "n_dims", item)) return -1;
    if (t->n_dims == 0 || t->n_dims > MOEX_GGUF_MAX_DIMS)
        return moex_fail(p->err, "%s: n_dims = %u, must be 1..%d", item, t->n_dims, MOEX_GGUF_MAX_DIMS);
    t->n_elements = 1;
    for (int d = 0; d < MOEX_GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d >= (int)t->n_dims) continue;
        uint64_t ne;
        if (read_u64(p, &ne, "dimension", item)) return -1;
        if (ne == 0 || ne > INT64_MAX)
            return moex_fail(p->err, "%s: dimension %d is %" PRIu64 ", must be 1..2^63-1", item, d, ne);
        t->ne[d] = (int64_t)ne;
        if (__builtin_mul_overflow(t->n_elements, t->ne[d], &t->n_elements))
            return moex_fail(p->err, "%s: element count overflows int64 at dimension %d", item, d);
    }
    uint32_t type;
    if (read_u32(p, &type, "type", item) || read_u64(p, &t->offset, "data offset", item)) return -1;
    const moex_type_traits *tt = moex_type_get((int)type);
    if (!tt) return moex_fail(p->err, "%s: unknown tensor type %u", item, type);
    if (!tt->is_weight_type) return moex_fail(p->err, "%s: type %s cannot be stored in a model file", item, tt->name);
    t->type = (moex_type)type;
    if (t->ne[0] % tt->block_elems)
        return moex_fail(p->err, "%s: ne[0] = %" PRId64 " is not a multiple of %s's block of %d", item, t->ne[0],
                         tt->name, tt->block_elems);
    uint64_t nbytes;
    if (__builtin_mul_overflow((uint64_t)(t->n_elements / tt->block_elems), (uint64_t)tt->block_bytes, &nbytes) ||
        nbytes > SIZE_MAX)
        return moex_fail(p->err, "%s: byte size overflows", item);
    t->nbytes = (size_t)nbytes;
    uint64_t prev;
    int r = moex_name_index_add(&p->in->tensor_index, t->name.data, t->name.len, i, &prev);
    if (r < 0) return moex_fail(p->err, "out of memory indexing tensors");
    if (r > 0) return moex_fail(p->err, "duplicate %s (tensors #%" PRIu64 " and #%" PRIu64 ")", item, prev, i);
    return 0;
}

/* Offsets aligned, data inside the file. */
static int check_tensor_placement(const moex_gguf *g, const moex_gguf_tensor *t, moex_error *err) {
    if (t->offset % g->alignment)
        return moex_fail(err, "tensor '%s': data offset %" PRIu64 " is not a multiple of the alignment %zu",
                         show(t->name).s, t->offset, g->alignment);
    size_t avail = g->size - g->data_offset;
    if (t->offset > avail || t->nbytes > avail - t->offset)
        return moex_fail(err, "tensor '%s': data [%" PRIu64 ", +%zu) runs past the end of the file (data section is %zu bytes)",
                         show(t->name).s, t->offset, t->nbytes, avail);
    return 0;
}

static int cmp_by_offset(const void *a, const void *b) {
    const moex_gguf_tensor *x = *(const moex_gguf_tensor *const *)a, *y = *(const moex_gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int check_no_overlap(moex_gguf *g, moex_error *err) {
    if (g->n_tensors < 2) return 0;
    const moex_gguf_tensor **order = malloc((size_t)g->n_tensors * sizeof *order);
    if (!order) return moex_fail(err, "out of memory");
    for (uint64_t i = 0; i < g->n_tensors; i++) order[i] = &g->tensors[i];
    qsort(order, (size_t)g->n_tensors, sizeof *order, cmp_by_offset);
    int rc = 0;
    for (uint64_t i = 1; i < g->n_tensors && !rc; i++) {
        const moex_gguf_tensor *a = order[i - 1], *b = order[i];
        if (a->offset + a->nbytes > b->offset)
            rc = moex_fail(err, "tensors '%s' [%" PRIu64 ", +%zu) and '%s' [%" PRIu64 ", +%zu) overlap", show(a->name).s,
                           a->offset, a->nbytes, show(b->name).s, b->offset, b->nbytes);
    }
    free(order);
    return rc;
}

/* ---- open / close ---- */

static int parse_header(parser *p, moex_gguf *g) {
    if (need(p, 4, "magic", NULL)) return -1;
    if (memcmp(p->base, "GGUF", 4))
        return moex_fail(p->err, "not a GGUF file (magic %02x %02x %02x %02x, expected \"GGUF\")", p->base[0],
                         p->base[1], p->base[2], p->base[3]);
    p->pos = 4;
    if (read_u32(p, &g->version, "version", NULL)) return -1;
    if (g->version == 1) return moex_fail(p->err, "GGUF version 1 is not supported (only 2 and 3); re-convert the model");
    if (g->version != 2 && g->version != 3) {
        if (g->version >= 0x01000000u)
            return moex_fail(p->err, "unknown GGUF version %u (a big-endian file? only little-endian is supported)", g->version);
        return moex_fail(p->err, "unknown GGUF version %u (supported: 2, 3)", g->version);
    }
    if (read_u64(p, &g->n_tensors, "tensor count", NULL) || read_u64(p, &g->n_kv, "metadata count", NULL)) return -1;
    size_t left = bytes_left(p);
    if (g->n_kv > left / MIN_KV_BYTES)
        return moex_fail(p->err, "metadata count %" PRIu64 " cannot fit in the %zu bytes left", g->n_kv, left);
    if (g->n_tensors > left / MIN_TENSOR_BYTES ||
        g->n_kv * MIN_KV_BYTES > left - g->n_tensors * MIN_TENSOR_BYTES)
        return moex_fail(p->err, "tensor count %" PRIu64 " (with %" PRIu64 " keys) cannot fit in the %zu bytes left",
                         g->n_tensors, g->n_kv, left);
    return 0;
}

static int parse(parser *p, moex_gguf *g) {
    if (parse_header(p, g)) return -1;
    gguf_internal *in = p->in;
    /* Presize for real files; a hostile count only grows the index as entries actually parse. */
    if (moex_name_index_init(&in->kv_index, g->n_kv < INDEX_PRESIZE ? (size_t)g->n_kv : INDEX_PRESIZE) ||
        moex_name_index_init(&in->tensor_index, g->n_tensors < INDEX_PRESIZE ? (size_t)g->n_tensors : INDEX_PRESIZE))
        return moex_fail(p->err, "out of memory");
    g->kvs = arena_alloc(in, (size_t)g->n_kv, sizeof *g->kvs);
    g->tensors = arena_alloc(in, (size_t)g->n_tensors, sizeof *g->tensors);
    if (!g->kvs || !g->tensors) return moex_fail(p->err, "out of memory");
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (read_kv(p, g, i)) return -1;
    if (read_alignment(g, p->err)) return -1;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (read_tensor_info(p, g, i)) return -1;
    /* The data section starts at the aligned end of the header; a tensor-less file may end before it. */
    size_t data_offset = (p->pos + g->alignment - 1) / g->alignment * g->alignment;
    if (data_offset < p->pos) return moex_fail(p->err, "alignment %zu overflows the data offset", g->alignment);
    g->data_offset = data_offset > g->size ? g->size : data_offset;
    if (g->n_tensors && data_offset > g->size)
        return moex_fail(p->err, "truncated file: the data section would start at %zu, past the end (%zu bytes)",
                         data_offset, g->size);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if (check_tensor_placement(g, &g->tensors[i], p->err)) return -1;
        g->tensors[i].data = g->base + g->data_offset + g->tensors[i].offset;
    }
    return check_no_overlap(g, p->err);
}

static moex_gguf *open_buffer(const void *data, size_t size, void *map, moex_error *err) {
    moex_gguf *g = calloc(1, sizeof *g);
    gguf_internal *in = calloc(1, sizeof *in);
    if (!g || !in) {
        free(g);
        free(in);
        if (map) munmap(map, size);
        moex_fail(err, "out of memory");
        return NULL;
    }
    in->map = map;
    in->map_size = size;
    g->internal = in;
    g->base = data;
    g->size = size;
    parser p = {.base = data, .size = size, .in = in, .err = err};
    if (!data && size) {
        moex_fail(err, "NULL buffer");
        goto fail;
    }
    if (parse(&p, g)) goto fail;
    return g;
fail:
    moex_gguf_close(g);
    return NULL;
}

moex_gguf *moex_gguf_open_memory(const void *data, size_t size, moex_error *err) {
    return open_buffer(data, size, NULL, err);
}

moex_gguf *moex_gguf_open(const char *path, moex_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        moex_fail(err, "cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        moex_fail(err, "cannot stat: %s", strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        moex_fail(err, "not a regular file");
        close(fd);
        return NULL;
    }
    if (st.st_size == 0) {
        moex_fail(err, "truncated file: it is empty");
        close(fd);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);   /* the mapping keeps the file */
    if (map == MAP_FAILED) {
        moex_fail(err, "cannot map %zu bytes: %s", size, strerror(errno));
        return NULL;
    }
    return open_buffer(map, size, map, err);
}

void moex_gguf_close(moex_gguf *g) {
    if (!g) return;
    gguf_internal *in = g->internal;
    if (in) {
        for (chunk *c = in->chunks, *next; c; c = next) {
            next = c->next;
            free(c);
        }
        moex_name_index_free(&in->kv_index);
        moex_name_index_free(&in->tensor_index);
        if (in->map) munmap(in->map, in->map_size);
        free(in);
    }
    free(g);
}

/* ---- lookups ---- */

const moex_gguf_kv *moex_gguf_find(const moex_gguf *g, const char *key) {
    if (!g || !key) return NULL;
    const gguf_internal *in = g->internal;
    int64_t i = moex_name_index_get(&in->kv_index, key, strlen(key));
    return i < 0 ? NULL : &g->kvs[i];
}

const moex_gguf_tensor *moex_gguf_find_tensor(const moex_gguf *g, const char *name) {
    if (!g || !name) return NULL;
    const gguf_internal *in = g->internal;
    int64_t i = moex_name_index_get(&in->tensor_index, name, strlen(name));
    return i < 0 ? NULL : &g->tensors[i];
}

/* ---- typed getters ---- */

static bool is_unsigned_int(moex_gguf_vtype t) {
    return t == MOEX_GGUF_UINT8 || t == MOEX_GGUF_UINT16 || t == MOEX_GGUF_UINT32 || t == MOEX_GGUF_UINT64;
}
static bool is_signed_int(moex_gguf_vtype t) {
    return t == MOEX_GGUF_INT8 || t == MOEX_GGUF_INT16 || t == MOEX_GGUF_INT32 || t == MOEX_GGUF_INT64;
}

static const moex_gguf_kv *find_or_fail(const moex_gguf *g, const char *key, moex_error *err) {
    const moex_gguf_kv *kv = moex_gguf_find(g, key);
    if (!kv) moex_fail(err, "missing metadata key '%s'", key ? key : "(null)");
    return kv;
}

static int wrong_type(const char *key, const moex_gguf_kv *kv, const char *expected, moex_error *err) {
    return moex_fail(err, "metadata key '%s' has type %s, expected %s", key, moex_gguf_vtype_name(kv->value.type), expected);
}

/* Integer value as a sign flag and magnitude-preserving pair, range-checked against [lo, hi]. */
static int get_int_in_range(const moex_gguf *g, const char *key, int64_t lo, uint64_t hi, const char *tname,
                            uint64_t *out_u, int64_t *out_i, moex_error *err) {
    const moex_gguf_kv *kv = find_or_fail(g, key, err);
    if (!kv) return -1;
    moex_gguf_vtype t = kv->value.type;
    if (is_unsigned_int(t)) {
        uint64_t v = kv->value.v.u64;
        if (v > hi) return moex_fail(err, "metadata key '%s' = %" PRIu64 " (%s) does not fit %s", key, v, moex_gguf_vtype_name(t), tname);
        *out_u = v;
        *out_i = (int64_t)v;
        return 0;
    }
    if (is_signed_int(t)) {
        int64_t v = kv->value.v.i64;
        if (v < lo || (v >= 0 && (uint64_t)v > hi))
            return moex_fail(err, "metadata key '%s' = %" PRId64 " (%s) does not fit %s", key, v, moex_gguf_vtype_name(t), tname);
        *out_u = (uint64_t)v;
        *out_i = v;
        return 0;
    }
    return wrong_type(key, kv, "an integer", err);
}

int moex_gguf_get_u32(const moex_gguf *g, const char *key, uint32_t *out, moex_error *err) {
    uint64_t u = 0;
    int64_t i = 0;
    if (get_int_in_range(g, key, 0, UINT32_MAX, "uint32", &u, &i, err)) return -1;
    *out = (uint32_t)u;
    return 0;
}

int moex_gguf_get_u64(const moex_gguf *g, const char *key, uint64_t *out, moex_error *err) {
    uint64_t u = 0;
    int64_t i = 0;
    if (get_int_in_range(g, key, 0, UINT64_MAX, "uint64", &u, &i, err)) return -1;
    *out = u;
    return 0;
}

int moex_gguf_get_i64(const moex_gguf *g, const char *key, int64_t *out, moex_error *err) {
    uint64_t u = 0;
    int64_t i = 0;
    if (get_int_in_range(g, key, INT64_MIN, INT64_MAX, "int64", &u, &i, err)) return -1;
    *out = i;
    return 0;
}

int moex_gguf_get_f32(const moex_gguf *g, const char *key, float *out, moex_error *err) {
    const moex_gguf_kv *kv = find_or_fail(g, key, err);
    if (!kv) return -1;
    moex_gguf_vtype t = kv->value.type;
    if (t == MOEX_GGUF_FLOAT32 || t == MOEX_GGUF_FLOAT64) *out = (float)kv->value.v.f64;
    else if (is_unsigned_int(t)) *out = (float)kv->value.v.u64;
    else if (is_signed_int(t)) *out = (float)kv->value.v.i64;
    else return wrong_type(key, kv, "a number", err);
    return 0;
}

int moex_gguf_get_bool(const moex_gguf *g, const char *key, bool *out, moex_error *err) {
    const moex_gguf_kv *kv = find_or_fail(g, key, err);
    if (!kv) return -1;
    if (kv->value.type != MOEX_GGUF_BOOL) return wrong_type(key, kv, "bool", err);
    *out = kv->value.v.u64 != 0;
    return 0;
}

int moex_gguf_get_str(const moex_gguf *g, const char *key, char *buf, size_t cap, moex_error *err) {
    const moex_gguf_kv *kv = find_or_fail(g, key, err);
    if (!kv) return -1;
    if (kv->value.type != MOEX_GGUF_STRING) return wrong_type(key, kv, "string", err);
    if (!buf || cap == 0) return moex_fail(err, "metadata key '%s': no room for the string", key);
    size_t n = kv->value.v.str.len < cap - 1 ? (size_t)kv->value.v.str.len : cap - 1;
    memcpy(buf, kv->value.v.str.data, n);
    buf[n] = 0;
    return 0;
}

const moex_gguf_value *moex_gguf_get_array(const moex_gguf *g, const char *key, moex_gguf_vtype elem_type,
                                           moex_error *err) {
    const moex_gguf_kv *kv = find_or_fail(g, key, err);
    if (!kv) return NULL;
    if (kv->value.type != MOEX_GGUF_ARRAY) {
        wrong_type(key, kv, "array", err);
        return NULL;
    }
    if (kv->value.v.arr.elem_type != elem_type) {
        moex_fail(err, "metadata key '%s' is an array of %s, expected an array of %s", key,
                  moex_gguf_vtype_name(kv->value.v.arr.elem_type), moex_gguf_vtype_name(elem_type));
        return NULL;
    }
    return &kv->value;
}

/* Reads element i of a fixed-size array as (is_float, u/i/f). 0 when out of range or not fixed-size. */
static int arr_elem(const moex_gguf_value *arr, uint64_t i, moex_gguf_value *out) {
    if (!arr || arr->type != MOEX_GGUF_ARRAY || i >= arr->v.arr.n) return -1;
    moex_gguf_vtype t = arr->v.arr.elem_type;
    size_t size = moex_gguf_vtype_size(t);
    if (!size || !arr->v.arr.raw) return -1;
    parser p = {.base = (const uint8_t *)arr->v.arr.raw + i * size, .size = size};
    out->type = t;
    return read_scalar(&p, out, "array element");
}

int64_t moex_gguf_arr_i64(const moex_gguf_value *arr, uint64_t i) {
    moex_gguf_value v = {0};
    if (arr_elem(arr, i, &v)) return 0;
    if (v.type == MOEX_GGUF_FLOAT32 || v.type == MOEX_GGUF_FLOAT64) {
        if (!(v.v.f64 >= -9.2e18 && v.v.f64 <= 9.2e18)) return v.v.f64 > 0 ? INT64_MAX : v.v.f64 < 0 ? INT64_MIN : 0;
        return (int64_t)v.v.f64;
    }
    if (is_signed_int(v.type)) return v.v.i64;
    return v.v.u64 > INT64_MAX ? INT64_MAX : (int64_t)v.v.u64;   /* unsigned and bool */
}

double moex_gguf_arr_f64(const moex_gguf_value *arr, uint64_t i) {
    moex_gguf_value v = {0};
    if (arr_elem(arr, i, &v)) return 0;
    if (v.type == MOEX_GGUF_FLOAT32 || v.type == MOEX_GGUF_FLOAT64) return v.v.f64;
    if (is_signed_int(v.type)) return (double)v.v.i64;
    return (double)v.v.u64;
}

uint64_t moex_gguf_identity(const moex_gguf *g) {
    size_t n = g->data_offset <= g->size ? g->data_offset : g->size;
    return XXH3_64bits(g->base, n);
}
