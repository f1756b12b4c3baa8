/* Picks the dot-product table for this CPU once per process. The choice is a
 * pure function of the CPU and MOEX_SIMD, cached in a pthread_once. */
#include <pthread.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_internal.h"

int moex_vec_dot_type(moex_type weight_type) {
    switch (weight_type) {
    case MOEX_TYPE_F32:
    case MOEX_TYPE_F16:
    case MOEX_TYPE_BF16: return MOEX_TYPE_F32;
    case MOEX_TYPE_Q4_0:
    case MOEX_TYPE_Q5_0:
    case MOEX_TYPE_Q8_0: return MOEX_TYPE_Q8_0;
    case MOEX_TYPE_Q4_1:
    case MOEX_TYPE_Q5_1: return MOEX_TYPE_Q8_1;
    case MOEX_TYPE_Q4_K:
    case MOEX_TYPE_Q5_K:
    case MOEX_TYPE_Q6_K: return MOEX_TYPE_Q8_K;
    default: return -1;
    }
}

const moex_simd_table *moex_simd_portable(void) { return &moex_simd_table_portable; }

const moex_simd_table *moex_simd_avx2(void) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    /* F16C through cpuid: clang 14's __builtin_cpu_supports does not know it. */
    unsigned a, b, c, d;
    bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c) return &moex_simd_table_avx2;
#endif
    return NULL;
}

static pthread_once_t active_once = PTHREAD_ONCE_INIT;
static const moex_simd_table *active_table; /* written once, under active_once */

static void choose_table(void) {
    const char *forced = getenv("MOEX_SIMD");
    const moex_simd_table *t = NULL;
    if (!forced || strcmp(forced, "portable") != 0) t = moex_simd_avx2();
    active_table = t ? t : moex_simd_portable();
}

const moex_simd_table *moex_simd_active(void) {
    pthread_once(&active_once, choose_table);
    return active_table;
}

const char *moex_kernels_simd_name(void) { return moex_simd_active()->name; }
