/* Streaming GGUF v3 writer.
 *
 * Metadata is small, so it is serialized into a memory buffer as it comes;
 * tensor infos are kept as a list. begin_data() writes the header, the
 * metadata and the infos (with offsets laid out at the file's alignment),
 * then tensor bytes stream straight to the file, padding inserted between
 * tensors. The first error sticks: later calls fail fast and close() reports
 * it and removes the partial file. */
#include "common/gguf.h"
#include "common/gguf_index.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WRITER_VERSION 3
#define MAX_NESTING 8

typedef struct tensor_info {
    char *name;
    moex_type type;
    uint32_t n_dims;
    int64_t ne[MOEX_GGUF_MAX_DIMS];
    uint64_t offset;   /* from the start of the data section */
    uint64_t nbytes;
} tensor_info;

typedef enum { STAGE_META, STAGE_DATA, STAGE_DONE } writer_stage;

struct moex_gguf_writer {
    FILE *f;
    char *path;
    writer_stage stage;
    bool failed;
    char error[sizeof(((moex_error *)0)->msg)];

    uint8_t *meta;          /* serialized key/values */
    size_t meta_len, meta_cap;
    uint64_t n_kv;
    char **keys;            /* owned copies, indexed by key_index */
    size_t keys_cap;
    moex_name_index key_index;

    tensor_info *tensors;
    size_t n_tensors, tensors_cap;
    moex_name_index tensor_index;

    uint64_t alignment;
    size_t cur;             /* tensor receiving data */
    uint64_t cur_written;   /* its bytes so far */
    uint64_t data_pos;      /* bytes written into the data section */
};

__attribute__((format(printf, 2, 3))) static int writer_fail(moex_gguf_writer *w, const char *fmt, ...) {
    if (!w->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->error, sizeof w->error, fmt, ap);
        va_end(ap);
        w->failed = true;
    }
    return -1;
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* ---- metadata buffer ---- */

static int meta_put(moex_gguf_writer *w, const void *p, size_t n) {
    if (w->failed) return -1;
    if (n > SIZE_MAX / 2 - w->meta_len) return writer_fail(w, "metadata too large");
    if (w->meta_len + n > w->meta_cap) {
        size_t cap = w->meta_cap ? w->meta_cap : 4096;
        while (cap < w->meta_len + n) cap *= 2;
        uint8_t *m = realloc(w->meta, cap);
        if (!m) return writer_fail(w, "out of memory for metadata (%zu bytes)", cap);
        w->meta = m;
        w->meta_cap = cap;
    }
    if (n) memcpy(w->meta + w->meta_len, p, n);
    w->meta_len += n;
    return 0;
}

static int meta_u32(moex_gguf_writer *w, uint32_t v) { return meta_put(w, &v, 4); }
static int meta_u64(moex_gguf_writer *w, uint64_t v) { return meta_put(w, &v, 8); }

static int meta_str(moex_gguf_writer *w, const char *s, uint64_t len) {
    if (len && !s) return writer_fail(w, "string of length %llu has no data", (unsigned long long)len);
    if (meta_u64(w, len)) return -1;
    return meta_put(w, s, (size_t)len);
}


/* Registers a new key and writes its name and type tag. */
static int begin_kv(moex_gguf_writer *w, const char *key, uint64_t key_len, moex_gguf_vtype type) {
    if (w->failed) return -1;
    if (w->stage != STAGE_META)
        return writer_fail(w, "metadata key '%.*s' added after begin_data", (int)(key_len > 200 ? 200 : key_len), key);
    if (!key || !key_len) return writer_fail(w, "empty metadata key");
    if (w->n_kv == w->keys_cap) {
        size_t cap = w->keys_cap ? w->keys_cap * 2 : 64;
        char **k = realloc(w->keys, cap * sizeof *k);
        if (!k) return writer_fail(w, "out of memory");
        w->keys = k;
        w->keys_cap = cap;
    }
    char *copy = malloc((size_t)key_len + 1);
    if (!copy) return writer_fail(w, "out of memory");
    memcpy(copy, key, (size_t)key_len);
    copy[key_len] = 0;
    int r = moex_name_index_add(&w->key_index, copy, key_len, w->n_kv, NULL);
    if (r) {
        free(copy);
        return r < 0 ? writer_fail(w, "out of memory") : writer_fail(w, "duplicate metadata key '%.200s'", key);
    }
    w->keys[w->n_kv++] = copy;
    if (meta_str(w, key, key_len)) return -1;
    return meta_u32(w, (uint32_t)type);
}

/* The alignment the data section will use follows general.alignment. */
static int note_alignment(moex_gguf_writer *w, const char *key, uint64_t key_len, moex_gguf_vtype type, uint64_t v) {
    if (key_len != strlen("general.alignment") || memcmp(key, "general.alignment", (size_t)key_len)) return 0;
    if (type != MOEX_GGUF_UINT32) return writer_fail(w, "general.alignment must be a uint32");
    if (v == 0 || (v & (v - 1))) return writer_fail(w, "general.alignment = %llu is not a power of two", (unsigned long long)v);
    w->alignment = v;
    return 0;
}

static int write_scalar_kv(moex_gguf_writer *w, const char *key, moex_gguf_vtype type, const void *v) {
    uint64_t len = key ? strlen(key) : 0;
    if (begin_kv(w, key, len, type) || meta_put(w, v, moex_gguf_vtype_size(type))) return -1;
    if (type == MOEX_GGUF_UINT32) return note_alignment(w, key, len, type, *(const uint32_t *)v);
    return note_alignment(w, key, len, type, 0);
}

int moex_gguf_writer_kv_u32(moex_gguf_writer *w, const char *key, uint32_t v) {
    return write_scalar_kv(w, key, MOEX_GGUF_UINT32, &v);
}
int moex_gguf_writer_kv_i32(moex_gguf_writer *w, const char *key, int32_t v) {
    return write_scalar_kv(w, key, MOEX_GGUF_INT32, &v);
}
int moex_gguf_writer_kv_u64(moex_gguf_writer *w, const char *key, uint64_t v) {
    return write_scalar_kv(w, key, MOEX_GGUF_UINT64, &v);
}
int moex_gguf_writer_kv_f32(moex_gguf_writer *w, const char *key, float v) {
    return write_scalar_kv(w, key, MOEX_GGUF_FLOAT32, &v);
}
int moex_gguf_writer_kv_bool(moex_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    return write_scalar_kv(w, key, MOEX_GGUF_BOOL, &b);
}

int moex_gguf_writer_kv_str(moex_gguf_writer *w, const char *key, const char *v) {
    if (!v) return writer_fail(w, "metadata key '%.200s': NULL string", key ? key : "");
    uint64_t len = key ? strlen(key) : 0;
    if (begin_kv(w, key, len, MOEX_GGUF_STRING) || meta_str(w, v, strlen(v))) return -1;
    return note_alignment(w, key, len, MOEX_GGUF_STRING, 0);
}

/* elems: n values of elem_type in native (little-endian) layout; for STRING, n `const char *`. */
int moex_gguf_writer_kv_array(moex_gguf_writer *w, const char *key, moex_gguf_vtype elem_type, const void *elems,
                              uint64_t n) {
    uint64_t len = key ? strlen(key) : 0;
    size_t size = moex_gguf_vtype_size(elem_type);
    if (!size && elem_type != MOEX_GGUF_STRING)
        return writer_fail(w, "metadata key '%.200s': kv_array takes fixed-size or string elements, not %s (use kv_copy)",
                           key ? key : "", moex_gguf_vtype_name(elem_type));
    if (n && !elems) return writer_fail(w, "metadata key '%.200s': NULL array data", key ? key : "");
    if (begin_kv(w, key, len, MOEX_GGUF_ARRAY) || meta_u32(w, (uint32_t)elem_type) || meta_u64(w, n)) return -1;
    if (elem_type == MOEX_GGUF_STRING) {
        const char *const *strs = elems;
        for (uint64_t i = 0; i < n; i++) {
            if (!strs[i]) return writer_fail(w, "metadata key '%.200s': string %llu is NULL", key, (unsigned long long)i);
            if (meta_str(w, strs[i], strlen(strs[i]))) return -1;
        }
    } else {
        if (n > SIZE_MAX / size) return writer_fail(w, "metadata key '%.200s': array too large", key);
        if (meta_put(w, elems, (size_t)(n * size))) return -1;
    }
    return note_alignment(w, key, len, MOEX_GGUF_ARRAY, 0);
}

/* Serializes a value's payload (everything after its type tag). */
static int put_value(moex_gguf_writer *w, const moex_gguf_value *v, int depth) {
    size_t size = moex_gguf_vtype_size(v->type);
    if (v->type == MOEX_GGUF_BOOL) {
        uint8_t b = v->v.u64 ? 1 : 0;
        return meta_put(w, &b, 1);
    }
    if (size) {
        uint8_t buf[8];
        if (v->type == MOEX_GGUF_FLOAT32) {
            float f = (float)v->v.f64;
            memcpy(buf, &f, 4);
        } else if (v->type == MOEX_GGUF_FLOAT64) {
            memcpy(buf, &v->v.f64, 8);
        } else {
            memcpy(buf, &v->v.u64, 8);   /* little-endian: the low bytes are the narrow value */
        }
        return meta_put(w, buf, size);
    }
    if (v->type == MOEX_GGUF_STRING) return meta_str(w, v->v.str.data, v->v.str.len);
    if (v->type != MOEX_GGUF_ARRAY) return writer_fail(w, "unknown value type %d", (int)v->type);

    if (depth >= MAX_NESTING) return writer_fail(w, "arrays nested deeper than %d", MAX_NESTING);
    moex_gguf_vtype et = v->v.arr.elem_type;
    uint64_t n = v->v.arr.n;
    if (meta_u32(w, (uint32_t)et) || meta_u64(w, n)) return -1;
    size_t esize = moex_gguf_vtype_size(et);
    if (esize) {
        if (n && !v->v.arr.raw) return writer_fail(w, "array of %llu %s has no data", (unsigned long long)n, moex_gguf_vtype_name(et));
        if (n > SIZE_MAX / esize) return writer_fail(w, "array too large");
        return meta_put(w, v->v.arr.raw, (size_t)(n * esize));
    }
    if (et == MOEX_GGUF_STRING) {
        if (n && !v->v.arr.strs) return writer_fail(w, "array of %llu strings has no data", (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++)
            if (meta_str(w, v->v.arr.strs[i].data, v->v.arr.strs[i].len)) return -1;
        return 0;
    }
    if (et == MOEX_GGUF_ARRAY) {
        if (n && !v->v.arr.items) return writer_fail(w, "array of %llu arrays has no data", (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) {
            if (v->v.arr.items[i].type != MOEX_GGUF_ARRAY) return writer_fail(w, "nested array item is not an array");
            if (put_value(w, &v->v.arr.items[i], depth + 1)) return -1;
        }
        return 0;
    }
    return writer_fail(w, "unknown array element type %d", (int)et);
}

int moex_gguf_writer_kv_copy(moex_gguf_writer *w, const moex_gguf_kv *kv) {
    if (!kv) return writer_fail(w, "kv_copy: NULL key/value");
    if (begin_kv(w, kv->key.data, kv->key.len, kv->value.type) || put_value(w, &kv->value, 0)) return -1;
    return note_alignment(w, kv->key.data, kv->key.len, kv->value.type, kv->value.v.u64);
}

/* ---- tensor infos ---- */

int moex_gguf_writer_tensor(moex_gguf_writer *w, const char *name, moex_type type, uint32_t n_dims, const int64_t *ne) {
    if (w->failed) return -1;
    if (w->stage != STAGE_META) return writer_fail(w, "tensor '%.200s' added after begin_data", name ? name : "");
    if (!name || !*name) return writer_fail(w, "tensor with an empty name");
    const moex_type_traits *tt = moex_type_get(type);
    if (!tt) return writer_fail(w, "tensor '%.200s': unknown type %d", name, (int)type);
    if (n_dims < 1 || n_dims > MOEX_GGUF_MAX_DIMS || !ne)
        return writer_fail(w, "tensor '%.200s': n_dims %u not in 1..%d", name, n_dims, MOEX_GGUF_MAX_DIMS);
    int64_t n = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] <= 0) return writer_fail(w, "tensor '%.200s': dim %u is %lld", name, d, (long long)ne[d]);
        if (__builtin_mul_overflow(n, ne[d], &n)) return writer_fail(w, "tensor '%.200s': element count overflows", name);
    }
    if (ne[0] % tt->block_elems)
        return writer_fail(w, "tensor '%.200s': ne[0] = %lld is not a multiple of %s's block of %d", name,
                           (long long)ne[0], tt->name, tt->block_elems);
    uint64_t nbytes;
    if (__builtin_mul_overflow((uint64_t)moex_row_bytes(type, ne[0]), (uint64_t)(n / ne[0]), &nbytes))
        return writer_fail(w, "tensor '%.200s': byte size overflows", name);

    if (w->n_tensors == w->tensors_cap) {
        size_t cap = w->tensors_cap ? w->tensors_cap * 2 : 64;
        tensor_info *t = realloc(w->tensors, cap * sizeof *t);
        if (!t) return writer_fail(w, "out of memory");
        w->tensors = t;
        w->tensors_cap = cap;
    }
    char *copy = strdup(name);
    if (!copy) return writer_fail(w, "out of memory");
    int r = moex_name_index_add(&w->tensor_index, copy, strlen(copy), w->n_tensors, NULL);
    if (r) {
        free(copy);
        return r < 0 ? writer_fail(w, "out of memory") : writer_fail(w, "duplicate tensor name '%.200s'", name);
    }
    tensor_info *t = &w->tensors[w->n_tensors++];
    *t = (tensor_info){.name = copy, .type = type, .n_dims = n_dims, .nbytes = nbytes};
    for (int d = 0; d < MOEX_GGUF_MAX_DIMS; d++) t->ne[d] = d < (int)n_dims ? ne[d] : 1;
    return 0;
}

/* ---- file output ---- */

static int file_put(moex_gguf_writer *w, const void *p, size_t n) {
    if (w->failed) return -1;
    if (n && fwrite(p, 1, n, w->f) != n) return writer_fail(w, "write failed: %s", strerror(errno));
    return 0;
}

static int file_zeros(moex_gguf_writer *w, uint64_t n) {
    static const uint8_t zeros[256];
    while (n) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        if (file_put(w, zeros, k)) return -1;
        n -= k;
    }
    return 0;
}

static int write_tensor_info(moex_gguf_writer *w, const tensor_info *t) {
    uint64_t len = strlen(t->name);
    if (file_put(w, &len, 8) || file_put(w, t->name, (size_t)len) || file_put(w, &t->n_dims, 4)) return -1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne = (uint64_t)t->ne[d];
        if (file_put(w, &ne, 8)) return -1;
    }
    uint32_t type = (uint32_t)t->type;
    return file_put(w, &type, 4) || file_put(w, &t->offset, 8) ? -1 : 0;
}

int moex_gguf_writer_begin_data(moex_gguf_writer *w) {
    if (w->failed) return -1;
    if (w->stage != STAGE_META) return writer_fail(w, "begin_data called twice");
    uint64_t end = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        w->tensors[i].offset = align_up(end, w->alignment);
        end = w->tensors[i].offset + w->tensors[i].nbytes;
    }
    uint32_t version = WRITER_VERSION;
    uint64_t n_tensors = w->n_tensors;
    if (file_put(w, "GGUF", 4) || file_put(w, &version, 4) || file_put(w, &n_tensors, 8) || file_put(w, &w->n_kv, 8) ||
        file_put(w, w->meta, w->meta_len))
        return -1;
    uint64_t header = 24 + w->meta_len;
    for (size_t i = 0; i < w->n_tensors; i++) {
        if (write_tensor_info(w, &w->tensors[i])) return -1;
        header += 8 + strlen(w->tensors[i].name) + 4 + 8 * (uint64_t)w->tensors[i].n_dims + 4 + 8;
    }
    if (file_zeros(w, align_up(header, w->alignment) - header)) return -1;
    free(w->meta);   /* no longer needed: free it before the (possibly huge) data streams */
    w->meta = NULL;
    w->meta_len = w->meta_cap = 0;
    w->stage = STAGE_DATA;
    w->cur = 0;
    w->cur_written = 0;
    w->data_pos = 0;
    return 0;
}

/* Skips to the first tensor that still needs bytes, padding up to its offset. */
static int advance_to_open_tensor(moex_gguf_writer *w) {
    while (w->cur < w->n_tensors && w->cur_written == w->tensors[w->cur].nbytes) {
        w->cur++;
        w->cur_written = 0;
    }
    if (w->cur < w->n_tensors && w->cur_written == 0 && w->data_pos < w->tensors[w->cur].offset) {
        if (file_zeros(w, w->tensors[w->cur].offset - w->data_pos)) return -1;
        w->data_pos = w->tensors[w->cur].offset;
    }
    return 0;
}

int moex_gguf_writer_data(moex_gguf_writer *w, const void *bytes, size_t n) {
    if (w->failed) return -1;
    if (w->stage != STAGE_DATA) return writer_fail(w, "tensor data written before begin_data");
    const uint8_t *p = bytes;
    while (n) {
        if (advance_to_open_tensor(w)) return -1;
        if (w->cur == w->n_tensors) return writer_fail(w, "%zu bytes of tensor data past the last tensor", n);
        tensor_info *t = &w->tensors[w->cur];
        uint64_t room = t->nbytes - w->cur_written;
        size_t k = n < room ? n : (size_t)room;
        if (file_put(w, p, k)) return -1;
        w->cur_written += k;
        w->data_pos += k;
        p += k;
        n -= k;
    }
    return 0;
}

moex_gguf_writer *moex_gguf_writer_open(const char *path, moex_error *err) {
    moex_gguf_writer *w = calloc(1, sizeof *w);
    if (!w) {
        moex_fail(err, "out of memory");
        return NULL;
    }
    w->alignment = MOEX_GGUF_DEFAULT_ALIGNMENT;
    if (!(w->path = strdup(path)) || moex_name_index_init(&w->key_index, 64) ||
        moex_name_index_init(&w->tensor_index, 64)) {
        moex_fail(err, "out of memory");
        goto fail;
    }
    if (!(w->f = fopen(path, "wb"))) {
        moex_fail(err, "cannot create %s: %s", path, strerror(errno));
        goto fail;
    }
    setvbuf(w->f, NULL, _IOFBF, 1 << 20);
    return w;
fail:
    moex_name_index_free(&w->key_index);
    moex_name_index_free(&w->tensor_index);
    free(w->path);
    free(w);
    return NULL;
}

static void writer_free(moex_gguf_writer *w) {
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    for (size_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    free(w->keys);
    free(w->tensors);
    free(w->meta);
    free(w->path);
    moex_name_index_free(&w->key_index);
    moex_name_index_free(&w->tensor_index);
    free(w);
}

/* Every tensor must have received exactly its bytes. */
static int check_complete(moex_gguf_writer *w) {
    if (advance_to_open_tensor(w)) return -1;
    if (w->cur < w->n_tensors) {
        const tensor_info *t = &w->tensors[w->cur];
        return writer_fail(w, "tensor '%s' got %llu of its %llu bytes (%zu of %zu tensors complete)", t->name,
                           (unsigned long long)w->cur_written, (unsigned long long)t->nbytes, w->cur, w->n_tensors);
    }
    /* Pad the end too, as ggml does, so the file size is a multiple of the alignment. */
    return file_zeros(w, align_up(w->data_pos, w->alignment) - w->data_pos);
}

int moex_gguf_writer_close(moex_gguf_writer *w, moex_error *err) {
    if (!w) return moex_fail(err, "no writer");
    if (!w->failed && w->stage == STAGE_META) moex_gguf_writer_begin_data(w);
    if (!w->failed) check_complete(w);
    if (fclose(w->f) != 0) writer_fail(w, "closing %s failed: %s", w->path, strerror(errno));
    int rc = 0;
    if (w->failed) {
        moex_fail(err, "%s: %s", w->path, w->error);
        unlink(w->path);   /* a half-written model must not look like a valid one */
        rc = -1;
    }
    writer_free(w);
    return rc;
}

int moex_gguf_file_type_of(moex_type t) {
    switch (t) {
    case MOEX_TYPE_F32: return 0;
    case MOEX_TYPE_F16: return 1;
    case MOEX_TYPE_Q4_0: return 2;
    case MOEX_TYPE_Q4_1: return 3;
    case MOEX_TYPE_Q8_0: return 7;
    case MOEX_TYPE_Q5_0: return 8;
    case MOEX_TYPE_Q5_1: return 9;
    case MOEX_TYPE_Q4_K: return 14;
    case MOEX_TYPE_Q5_K: return 16;
    case MOEX_TYPE_Q6_K: return 18;
    case MOEX_TYPE_BF16: return 32;
    case MOEX_TYPE_MXFP4: return 38;   /* llama.cpp's MOSTLY_MXFP4_MOE */
    default: return -1;
    }
}
