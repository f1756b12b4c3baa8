/* Picks the dot-product table for this CPU once per process. The choice is a
 * pure function of the CPU and a program's --simd (moex_kernels_use_simd,
 * before the first kernel runs), cached in a pthread_once. */
#include <pthread.h>
#include <stdatomic.h>
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
    case MOEX_TYPE_Q8_0:
    case MOEX_TYPE_MXFP4: return MOEX_TYPE_Q8_0;
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

#if defined(__x86_64__) || defined(__i386__)
/* AVX-512 F/BW/VL/VNNI in cpuid, and the OS saving the opmask and zmm
 * registers (XCR0 bits 1, 2, 5, 6, 7): cpuid alone does not say the OS
 * enabled them. */
static bool cpu_has_avx512_vnni(void) {
#if defined(__GNUC__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return false;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const unsigned ebx_bits = (1u << 16) | (1u << 30) | (1u << 31); /* avx512f, avx512bw, avx512vl */
    if ((b & ebx_bits) != ebx_bits || !(c & (1u << 11)))            /* avx512_vnni */
        return false;
    unsigned xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    return (xcr0_lo & 0xE6) == 0xE6;
#else
    return false;
#endif
}

static moex_simd_table vnni_table; /* built once, under vnni_once */
#endif

static pthread_once_t vnni_once = PTHREAD_ONCE_INIT;
static const moex_simd_table *vnni_available; /* &vnni_table or NULL */

/* The AVX2 table with every entry dot_vnni.c defines put in its place. */
static void build_vnni_table(void) {
#if defined(__x86_64__) || defined(__i386__)
    const moex_simd_table *base = moex_simd_avx2(), *over = &moex_simd_table_vnni;
    if (!base || !cpu_has_avx512_vnni()) return;
    vnni_table = *base;
    vnni_table.name = over->name;
    for (int t = 0; t < MOEX_TYPE_COUNT; t++) {
        if (over->vec_dot[t]) vnni_table.vec_dot[t] = over->vec_dot[t];
        if (over->vec_dot_multi[t]) vnni_table.vec_dot_multi[t] = over->vec_dot_multi[t];
        if (over->quantize_act[t]) vnni_table.quantize_act[t] = over->quantize_act[t];
    }
    vnni_available = &vnni_table;
#endif
}

const moex_simd_table *moex_simd_vnni(void) {
    pthread_once(&vnni_once, build_vnni_table);
    return vnni_available;
}

static pthread_once_t active_once = PTHREAD_ONCE_INIT;
static const moex_simd_table *active_table; /* written once, under active_once */
static _Atomic int requested = -1;           /* moex_kernels_use_simd's choice: 0 portable, 1 avx2; -1 the best */

/* Best path of this CPU, or a lower one that moex_kernels_use_simd asked for. */
static void choose_table(void) {
    const moex_simd_table *t = NULL;
    const int want = atomic_load(&requested);
    if (want == 1) t = moex_simd_avx2();
    else if (want < 0 && !(t = moex_simd_vnni())) t = moex_simd_avx2();
    active_table = t ? t : moex_simd_portable();
}

int moex_kernels_use_simd(const char *name, moex_error *err) {
    static const char *const names[] = {"portable", "avx2", "avx512vnni"};
    int i = 0;
    while (i < 3 && strcmp(name, names[i])) i++;
    if (i == 3) return moex_fail(err, "--simd wants portable, avx2 or avx512vnni, not '%s'", name);
    atomic_store(&requested, i == 2 ? -1 : i);
    if (active_table && strcmp(moex_kernels_simd_name(), name) && i != 2)
        return moex_fail(err, "--simd %s: the kernels already run on %s", name, moex_kernels_simd_name());
    return 0;
}

const moex_simd_table *moex_simd_active(void) {
    pthread_once(&active_once, choose_table);
    return active_table;
}

const char *moex_kernels_simd_name(void) { return moex_simd_active()->name; }
