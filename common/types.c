/* Type traits: the size table the GGUF reader validates against and the
 * kernels index by. Block sizes come from the layouts in types.h. */
#include "common/types.h"

#include <strings.h>

static const moex_type_traits type_table[MOEX_TYPE_COUNT] = {
    [MOEX_TYPE_F32] = {"f32", 1, 4, 1},
    [MOEX_TYPE_F16] = {"f16", 1, 2, 1},
    [MOEX_TYPE_BF16] = {"bf16", 1, 2, 1},
    [MOEX_TYPE_Q4_0] = {"q4_0", MOEX_QK4_0, sizeof(moex_block_q4_0), 1},
    [MOEX_TYPE_Q4_1] = {"q4_1", MOEX_QK4_1, sizeof(moex_block_q4_1), 1},
    [MOEX_TYPE_Q5_0] = {"q5_0", MOEX_QK5_0, sizeof(moex_block_q5_0), 1},
    [MOEX_TYPE_Q5_1] = {"q5_1", MOEX_QK5_1, sizeof(moex_block_q5_1), 1},
    [MOEX_TYPE_Q8_0] = {"q8_0", MOEX_QK8_0, sizeof(moex_block_q8_0), 1},
    [MOEX_TYPE_Q8_1] = {"q8_1", MOEX_QK8_1, sizeof(moex_block_q8_1), 0},
    [MOEX_TYPE_Q4_K] = {"q4_K", MOEX_QK_K, sizeof(moex_block_q4_K), 1},
    [MOEX_TYPE_Q5_K] = {"q5_K", MOEX_QK_K, sizeof(moex_block_q5_K), 1},
    [MOEX_TYPE_Q6_K] = {"q6_K", MOEX_QK_K, sizeof(moex_block_q6_K), 1},
    [MOEX_TYPE_Q8_K] = {"q8_K", MOEX_QK_K, sizeof(moex_block_q8_K), 0},
    [MOEX_TYPE_MXFP4] = {"mxfp4", MOEX_QK_MXFP4, sizeof(moex_block_mxfp4), 1},
};

const int8_t moex_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

const moex_type_traits *moex_type_get(int type) {
    if (type < 0 || type >= MOEX_TYPE_COUNT || !type_table[type].name) return NULL;
    return &type_table[type];
}

int moex_type_from_name(const char *name) {
    for (int t = 0; t < MOEX_TYPE_COUNT; t++)
        if (type_table[t].name && strcasecmp(type_table[t].name, name) == 0) return t;
    return -1;
}

size_t moex_row_bytes(moex_type type, int64_t n) {
    const moex_type_traits *tt = moex_type_get(type);
    if (!tt || n < 0 || n % tt->block_elems) return 0;
    return (size_t)(n / tt->block_elems) * (size_t)tt->block_bytes;
}
