/* splitmix64 (Steele, Lea and Flood; Vigna's reference code): the one 64-bit
 * generator the project seeds its PRNGs with (the sampler's xoshiro256**, the
 * simulator's xoshiro256+), derives the generator's weights from (tools/) and
 * draws jitter and fault injection from. Header-only; part of the common
 * module's API (common/common.h). The state is the caller's: no globals. */
#ifndef MOEX_RNG_H
#define MOEX_RNG_H

#include <stdint.h>

/* The increment of the state per draw (2^64 / golden ratio, odd). */
#define MOEX_SPLITMIX64_GAMMA 0x9e3779b97f4a7c15ull

/* Advances *state by MOEX_SPLITMIX64_GAMMA and returns the next 64 bits: the
 * new state through splitmix64's bijective mix. */
static inline uint64_t moex_splitmix64(uint64_t *state) {
    uint64_t z = (*state += MOEX_SPLITMIX64_GAMMA);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform double in [0, 1): the top 53 bits of the next draw. */
static inline double moex_rand01(uint64_t *state) { return (double)(moex_splitmix64(state) >> 11) * 0x1.0p-53; }

#endif
