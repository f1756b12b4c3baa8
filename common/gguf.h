/* GGUF v2/v3 reader (mmap, strictly validated) and streaming writer.
 * Part of the common module's API (common/common.h).
 *
 * The reader never trusts a length or offset in the file: every count is
 * checked against the bytes left before anything is allocated, so a hostile
 * file ends in a clear error, not a crash or an out-of-memory. Tensor data is
 * mapped, not copied. Multi-byte values are little-endian on disk. */
#ifndef MOEX_GGUF_H
#define MOEX_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/error.h"
#include "common/types.h"

#define MOEX_GGUF_MAX_DIMS 4
#define MOEX_GGUF_DEFAULT_ALIGNMENT 32

typedef enum moex_gguf_vtype {
    MOEX_GGUF_UINT8 = 0,
    MOEX_GGUF_INT8 = 1,
    MOEX_GGUF_UINT16 = 2,
    MOEX_GGUF_INT16 = 3,
    MOEX_GGUF_UINT32 = 4,
    MOEX_GGUF_INT32 = 5,
    MOEX_GGUF_FLOAT32 = 6,
    MOEX_GGUF_BOOL = 7,
    MOEX_GGUF_STRING = 8,
    MOEX_GGUF_ARRAY = 9,
    MOEX_GGUF_UINT64 = 10,
    MOEX_GGUF_INT64 = 11,
    MOEX_GGUF_FLOAT64 = 12,
    MOEX_GGUF_VTYPE_COUNT
} moex_gguf_vtype;

/* A string inside the mapped file: not NUL-terminated. */
typedef struct moex_gguf_str {
    uint64_t len;
    const char *data;
} moex_gguf_str;

typedef struct moex_gguf_value moex_gguf_value;
struct moex_gguf_value {
    moex_gguf_vtype type;
    union {
        uint64_t u64;   /* UINT8/16/32/64 and BOOL (0/1) */
        int64_t i64;    /* INT8/16/32/64 */
        double f64;     /* FLOAT32/64 */
        moex_gguf_str str;
        struct {
            moex_gguf_vtype elem_type;
            uint64_t n;
            /* Fixed-size elements: raw little-endian bytes in the file (may be unaligned). */
            const void *raw;
            /* STRING elements: n strings. */
            const moex_gguf_str *strs;
            /* ARRAY elements (nested arrays): n values. */
            const moex_gguf_value *items;
        } arr;
    } v;
};

typedef struct moex_gguf_kv {
    moex_gguf_str key;
    moex_gguf_value value;
} moex_gguf_kv;

typedef struct moex_gguf_tensor {
    moex_gguf_str name;
    moex_type type;
    uint32_t n_dims;
    int64_t ne[MOEX_GGUF_MAX_DIMS];  /* ne[0] is the contiguous dimension; unused dims are 1 */
    int64_t n_elements;
    uint64_t offset;                 /* from the start of the data section */
    size_t nbytes;
    const void *data;                /* points into the mapping */
} moex_gguf_tensor;

typedef struct moex_gguf {
    uint32_t version;
    uint64_t n_kv, n_tensors;
    moex_gguf_kv *kvs;
    moex_gguf_tensor *tensors;
    size_t alignment;
    const uint8_t *base;   /* the mapped file */
    size_t size;
    size_t data_offset;    /* start of the tensor data section */
    void *internal;        /* parser allocations */
} moex_gguf;

/* Maps and validates a file. NULL with err->msg set on any problem. */
moex_gguf *moex_gguf_open(const char *path, moex_error *err);
/* Same, over a caller-owned buffer (must outlive the result). For fuzzing and tests. */
moex_gguf *moex_gguf_open_memory(const void *data, size_t size, moex_error *err);
void moex_gguf_close(moex_gguf *g);
/* The file's identity: XXH3-64 (seed 0) of its bytes [0, data_offset) --
 * header, metadata and tensor infos, not the weights. It names the
 * architecture, tokenizer, shapes, types and layout in milliseconds even for
 * a 100 GB model; hub and worker compare it before a worker computes. */
uint64_t moex_gguf_identity(const moex_gguf *g);

/* Lookups return NULL / -1 when absent. Keys compare as exact byte strings. */
const moex_gguf_kv *moex_gguf_find(const moex_gguf *g, const char *key);
const moex_gguf_tensor *moex_gguf_find_tensor(const moex_gguf *g, const char *name);

/* Typed getters. Integer getters accept any integer type whose value fits;
 * float getters accept FLOAT32/FLOAT64 and integers. Return 0 on success,
 * -1 (with err) when the key is missing, of another type or out of range. */
int moex_gguf_get_u32(const moex_gguf *g, const char *key, uint32_t *out, moex_error *err);
int moex_gguf_get_u64(const moex_gguf *g, const char *key, uint64_t *out, moex_error *err);
int moex_gguf_get_i64(const moex_gguf *g, const char *key, int64_t *out, moex_error *err);
int moex_gguf_get_f32(const moex_gguf *g, const char *key, float *out, moex_error *err);
int moex_gguf_get_bool(const moex_gguf *g, const char *key, bool *out, moex_error *err);
/* Copies a string value into buf (NUL-terminated, truncated to cap). */
int moex_gguf_get_str(const moex_gguf *g, const char *key, char *buf, size_t cap, moex_error *err);
/* Array accessors: the array of `key`, checked to hold elements of elem_type. */
const moex_gguf_value *moex_gguf_get_array(const moex_gguf *g, const char *key, moex_gguf_vtype elem_type, moex_error *err);
/* Element i of a fixed-size-element array, converted (handles unaligned data). */
int64_t moex_gguf_arr_i64(const moex_gguf_value *arr, uint64_t i);
double moex_gguf_arr_f64(const moex_gguf_value *arr, uint64_t i);

const char *moex_gguf_vtype_name(moex_gguf_vtype t);
/* Bytes of one value of a fixed-size type; 0 for STRING, ARRAY and unknown types. */
size_t moex_gguf_vtype_size(moex_gguf_vtype t);

/* ---- Writer: streams metadata, then tensor infos, then data, so that a
 * 17 GB model never sits in memory. Usage:
 *   w = moex_gguf_writer_open(path, err);
 *   moex_gguf_writer_kv_*(w, ...)               all metadata first
 *   moex_gguf_writer_tensor(w, name, type, n_dims, ne)   every tensor's info
 *   moex_gguf_writer_begin_data(w)              writes header + infos, pads
 *   moex_gguf_writer_data(w, bytes, n) ...      each tensor's bytes, in info order
 *   moex_gguf_writer_close(w, err)              checks sizes, returns 0 on success
 */
typedef struct moex_gguf_writer moex_gguf_writer;
moex_gguf_writer *moex_gguf_writer_open(const char *path, moex_error *err);
int moex_gguf_writer_kv_u32(moex_gguf_writer *w, const char *key, uint32_t v);
int moex_gguf_writer_kv_i32(moex_gguf_writer *w, const char *key, int32_t v);
int moex_gguf_writer_kv_u64(moex_gguf_writer *w, const char *key, uint64_t v);
int moex_gguf_writer_kv_f32(moex_gguf_writer *w, const char *key, float v);
int moex_gguf_writer_kv_bool(moex_gguf_writer *w, const char *key, bool v);
int moex_gguf_writer_kv_str(moex_gguf_writer *w, const char *key, const char *v);
/* Copies a key/value (any type, nested arrays included) from an opened file:
 * how gen takes the tokenizer from a vocab GGUF. */
int moex_gguf_writer_kv_copy(moex_gguf_writer *w, const moex_gguf_kv *kv);
/* elems: n values of a fixed-size elem_type in native layout (float[], int32_t[], ...),
 * or for MOEX_GGUF_STRING n NUL-terminated `const char *`. Nested arrays go through kv_copy.
 * Writer calls return 0 or -1; the first error sticks and close() reports it (and
 * deletes the partial file). A general.alignment key (uint32) sets the data alignment. */
int moex_gguf_writer_kv_array(moex_gguf_writer *w, const char *key, moex_gguf_vtype elem_type, const void *elems, uint64_t n);
int moex_gguf_writer_tensor(moex_gguf_writer *w, const char *name, moex_type type, uint32_t n_dims, const int64_t *ne);
int moex_gguf_writer_begin_data(moex_gguf_writer *w);
int moex_gguf_writer_data(moex_gguf_writer *w, const void *bytes, size_t n);
int moex_gguf_writer_close(moex_gguf_writer *w, moex_error *err);

/* general.file_type (llama.cpp's llama_ftype) of a file whose weights are
 * mostly t: MOSTLY_<type>, the K-quants as their _S mix; -1 for none. */
#define MOEX_GGUF_FTYPE_Q4_K_M 15
int moex_gguf_file_type_of(moex_type t);

#endif
