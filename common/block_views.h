/* Every weight block layout of common/types.h as names and numbers: its
 * elements, its bytes and each field's byte offset, taken from the C structs
 * by the compiler. The generators that write the same numbers for the GPU
 * languages read this table, so that no shader spells them again:
 * kernels/vk/shaders/gen_blocks.c (GLSL, at build time) and
 * web/gen_constants.c (WGSL, through moex_constants.js). Header-only; not
 * part of the common module's API (common/common.h). */
#ifndef MOEX_BLOCK_VIEWS_H
#define MOEX_BLOCK_VIEWS_H

#include <stddef.h>

#include "common/types.h"

typedef struct moex_block_field {
    const char *name;   /* NULL ends the list */
    size_t offset;
} moex_block_field;

typedef struct moex_block_view {
    const char *name;   /* as the shaders spell it: Q4_0, ..., Q6_K */
    moex_type type;
    int elems;
    size_t bytes;
    moex_block_field fields[6];
} moex_block_view;

#define MOEX_BLOCK_FIELD(T, f, NAME) {NAME, offsetof(T, f)}

static const moex_block_view moex_block_views[] = {
    {"Q4_0", MOEX_TYPE_Q4_0, MOEX_QK4_0, sizeof(moex_block_q4_0),
     {MOEX_BLOCK_FIELD(moex_block_q4_0, d, "D"), MOEX_BLOCK_FIELD(moex_block_q4_0, qs, "QS"), {NULL, 0}}},
    {"Q4_1", MOEX_TYPE_Q4_1, MOEX_QK4_1, sizeof(moex_block_q4_1),
     {MOEX_BLOCK_FIELD(moex_block_q4_1, d, "D"), MOEX_BLOCK_FIELD(moex_block_q4_1, m, "M"),
      MOEX_BLOCK_FIELD(moex_block_q4_1, qs, "QS"), {NULL, 0}}},
    {"Q5_0", MOEX_TYPE_Q5_0, MOEX_QK5_0, sizeof(moex_block_q5_0),
     {MOEX_BLOCK_FIELD(moex_block_q5_0, d, "D"), MOEX_BLOCK_FIELD(moex_block_q5_0, qh, "QH"),
      MOEX_BLOCK_FIELD(moex_block_q5_0, qs, "QS"), {NULL, 0}}},
    {"Q5_1", MOEX_TYPE_Q5_1, MOEX_QK5_1, sizeof(moex_block_q5_1),
     {MOEX_BLOCK_FIELD(moex_block_q5_1, d, "D"), MOEX_BLOCK_FIELD(moex_block_q5_1, m, "M"),
      MOEX_BLOCK_FIELD(moex_block_q5_1, qh, "QH"), MOEX_BLOCK_FIELD(moex_block_q5_1, qs, "QS"), {NULL, 0}}},
    {"Q8_0", MOEX_TYPE_Q8_0, MOEX_QK8_0, sizeof(moex_block_q8_0),
     {MOEX_BLOCK_FIELD(moex_block_q8_0, d, "D"), MOEX_BLOCK_FIELD(moex_block_q8_0, qs, "QS"), {NULL, 0}}},
    {"Q4_K", MOEX_TYPE_Q4_K, MOEX_QK_K, sizeof(moex_block_q4_K),
     {MOEX_BLOCK_FIELD(moex_block_q4_K, d, "D"), MOEX_BLOCK_FIELD(moex_block_q4_K, dmin, "DMIN"),
      MOEX_BLOCK_FIELD(moex_block_q4_K, scales, "SCALES"), MOEX_BLOCK_FIELD(moex_block_q4_K, qs, "QS"), {NULL, 0}}},
    {"Q5_K", MOEX_TYPE_Q5_K, MOEX_QK_K, sizeof(moex_block_q5_K),
     {MOEX_BLOCK_FIELD(moex_block_q5_K, d, "D"), MOEX_BLOCK_FIELD(moex_block_q5_K, dmin, "DMIN"),
      MOEX_BLOCK_FIELD(moex_block_q5_K, scales, "SCALES"), MOEX_BLOCK_FIELD(moex_block_q5_K, qh, "QH"),
      MOEX_BLOCK_FIELD(moex_block_q5_K, qs, "QS"), {NULL, 0}}},
    {"Q6_K", MOEX_TYPE_Q6_K, MOEX_QK_K, sizeof(moex_block_q6_K),
     {MOEX_BLOCK_FIELD(moex_block_q6_K, ql, "QL"), MOEX_BLOCK_FIELD(moex_block_q6_K, qh, "QH"),
      MOEX_BLOCK_FIELD(moex_block_q6_K, scales, "SCALES"), MOEX_BLOCK_FIELD(moex_block_q6_K, d, "D"), {NULL, 0}}},
};

#define MOEX_N_BLOCK_VIEWS (sizeof moex_block_views / sizeof moex_block_views[0])

#endif
