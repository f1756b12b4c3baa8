/* common/rng.h: splitmix64's contract (the state moves by the gamma per draw,
 * moex_rand01 is the top 53 bits of the next draw), agreement with the test
 * harness's own splitmix64 (tests/test_util.h) on fresh seeds, xoshiro256's
 * seeding through splitmix64, and the statistics each generator must have:
 * uniform [0, 1) draws from the top 53 bits (chi-square) and balanced output
 * bits (all 64 for splitmix64 and xoshiro256**, the top 53 for xoshiro256+,
 * whose low bits are weak by design). Seeded per run; MOEX_TEST_SEED replays. */
#include "common/common.h"

#include "tests/test_util.h"

enum { DRAWS = 1 << 20, BINS = 64 };

/* Chi-square critical value with tail probability ~1e-6 (Wilson-Hilferty, z = 4.75). */
static double chi2_critical(int df) {
    const double a = 2.0 / (9.0 * df);
    const double c = 1.0 - a + 4.75 * sqrt(a);
    return df * c * c * c;
}

static void test_contract(rng *r) {
    for (int i = 0; i < 1000; i++) {
        const uint64_t seed = rng_next(r);
        uint64_t s = seed;
        rng ref = {seed};
        const uint64_t a = moex_splitmix64(&s);
        CHECK(a == rng_next(&ref), "seed %llu: differs from the harness's splitmix64", (unsigned long long)seed);
        CHECK(s == seed + MOEX_SPLITMIX64_GAMMA, "seed %llu: state did not move by the gamma", (unsigned long long)seed);
        uint64_t t = seed;
        const double u = moex_rand01(&t);
        CHECK(u == (double)(a >> 11) / 9007199254740992.0 && u >= 0.0 && u < 1.0,
              "seed %llu: rand01 %.17g is not the top 53 bits of the draw", (unsigned long long)seed, u);
        CHECK(t == s, "seed %llu: rand01 moved the state differently", (unsigned long long)seed);
    }
    uint64_t top = UINT64_MAX - MOEX_SPLITMIX64_GAMMA + 1;   /* the state wraps to 0 */
    const double u = moex_rand01(&top);
    CHECK(top == 0 && u >= 0.0 && u < 1.0, "state wrap: state %llu, draw %.17g", (unsigned long long)top, u);
}

static void test_xoshiro_seed(rng *r) {
    const uint64_t seed = rng_next(r);
    uint64_t s[4], x = seed;
    moex_xoshiro256_seed(s, seed);
    for (int i = 0; i < 4; i++) CHECK(s[i] == moex_splitmix64(&x), "xoshiro256 seed word %d is not splitmix64's", i);
}

typedef enum { GEN_SPLITMIX, GEN_XOSHIRO_SS, GEN_XOSHIRO_P } gen_kind;

static uint64_t draw(gen_kind g, uint64_t *s) {
    switch (g) {
    case GEN_SPLITMIX: return moex_splitmix64(s);
    case GEN_XOSHIRO_SS: return moex_xoshiro256ss(s);
    default: return moex_xoshiro256p(s);
    }
}

/* Uniformity of the top 53 bits as doubles, and balance of the bits from low_bit up. */
static void test_statistics(rng *r, gen_kind g, const char *name, int low_bit) {
    uint64_t s[4];
    for (int i = 0; i < 4; i++) s[i] = rng_next(r);
    long bins[BINS] = {0}, bit_set[64] = {0};
    for (int i = 0; i < DRAWS; i++) {
        const uint64_t x = draw(g, s);
        for (int b = 0; b < 64; b++) bit_set[b] += (long)((x >> b) & 1);
        bins[(int)((double)(x >> 11) * 0x1.0p-53 * BINS)]++;
    }
    const double e = (double)DRAWS / BINS;
    double chi2 = 0.0;
    for (int i = 0; i < BINS; i++) chi2 += (bins[i] - e) * (bins[i] - e) / e;
    CHECK(chi2 < chi2_critical(BINS - 1), "%s: chi2 %.1f over %d dof exceeds %.1f", name, chi2, BINS - 1,
          chi2_critical(BINS - 1));
    /* each bit is Binomial(DRAWS, 1/2): 6 standard deviations are 3 * sqrt(DRAWS) */
    for (int b = low_bit; b < 64; b++)
        CHECK(fabs(bit_set[b] - DRAWS / 2.0) < 3.0 * sqrt((double)DRAWS), "%s: bit %d set in %ld of %d draws", name,
              b, bit_set[b], DRAWS);
    printf("%s: chi2 %.2f over %d bins (limit %.1f)\n", name, chi2, BINS, chi2_critical(BINS - 1));
}

int main(void) {
    rng r = test_rng("test_rng");
    test_contract(&r);
    test_xoshiro_seed(&r);
    test_statistics(&r, GEN_SPLITMIX, "splitmix64", 0);
    test_statistics(&r, GEN_XOSHIRO_SS, "xoshiro256**", 0);
    test_statistics(&r, GEN_XOSHIRO_P, "xoshiro256+", 11);
    if (g_failures) fprintf(stderr, "%d failure(s)\n", g_failures);
    return g_failures ? 1 : 0;
}
