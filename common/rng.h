/* The project's pseudo-random generators, after the authors' reference code:
 * splitmix64 (Steele, Lea and Flood), which seeds the others, derives the
 * generator's weights (tools/) and draws jitter and fault injection, and
 * xoshiro256 (Blackman and Vigna) in its ** variant (the sampler) and its +
 * variant (the simulator). Header-only; part of the common module's API
 * (common/common.h). The state is the caller's: no globals. */
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

/* ---- xoshiro256: four words of state ---- */

/* The four words from splitmix64 on seed, as the authors recommend. */
static inline void moex_xoshiro256_seed(uint64_t s[4], uint64_t seed) {
    for (int i = 0; i < 4; i++) s[i] = moex_splitmix64(&seed);
}

static inline uint64_t moex_rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* The state transition both variants share; each takes its output from the
 * state before the step. */
static inline void moex_xoshiro256_step(uint64_t s[4]) {
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = moex_rotl64(s[3], 45);
}

/* xoshiro256**: all 64 bits are good. */
static inline uint64_t moex_xoshiro256ss(uint64_t s[4]) {
    const uint64_t result = moex_rotl64(s[1] * 5, 7) * 9;
    moex_xoshiro256_step(s);
    return result;
}

/* xoshiro256+: faster; its top 53 bits are the well-mixed ones (doubles). */
static inline uint64_t moex_xoshiro256p(uint64_t s[4]) {
    const uint64_t result = s[0] + s[3];
    moex_xoshiro256_step(s);
    return result;
}

#endif
