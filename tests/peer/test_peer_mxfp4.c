/* MXFP4 against llama.cpp itself (its libggml, through llama_peer):
 *  - dequantization: blocks of every E8M0 exponent (0..255) with every 4-bit
 *    code in both nibble halves, and blocks of random bytes, give exactly
 *    ggml's floats (to_float = dequantize_row_mxfp4), bit for bit (inf and
 *    the sign of zero included);
 *  - quantization: moex_quantize_row writes exactly the bytes of ggml's
 *    quantize_row_mxfp4_ref (through ggml_quantize_chunk) for random floats
 *    of magnitudes 2^-140 .. 2^125 (subnormal blocks too), values halfway
 *    between two E2M1 values (the tie rule), block maxima at and just below
 *    powers of two (floor(log2f)), zeros and single values. Finite inputs
 *    only: the format has no inf or NaN, and ggml's exponent of such blocks
 *    is an out-of-range float-to-int conversion.
 *
 * usage: test_peer_mxfp4 SETUP_PEER_SH PEER_DIR WORKDIR [seed]
 * Exit 0 equal, 1 a difference, 77 llama.cpp peer unavailable (setup_peer.sh's
 * answer; MOEX_REQUIRE_PEER=1 makes that a failure there). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "kernels/kernels.h"
#include "tests/kernels/test_quant_util.h"

#define GGML_TYPE_MXFP4 39 /* ggml's id, which MoEx's enum uses too */
_Static_assert(MOEX_TYPE_MXFP4 == GGML_TYPE_MXFP4, "type ids are ggml's");

static char g_peer[4096];
static char g_work[4096];

/* Runs a shell command; its exit status, or -1. */
static int run(const char *cmd) {
    const int st = system(cmd);
    if (st == -1 || !WIFEXITED(st)) return -1;
    return WEXITSTATUS(st);
}

static int write_file(const char *path, const void *p, size_t len) {
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(p, 1, len, f) == len;
    if (f && fclose(f)) ok = 0;
    return ok ? 0 : -1;
}

/* Reads exactly len bytes of path; -1 when it is missing or of another size. */
static int read_file(const char *path, void *p, size_t len) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    const size_t got = fread(p, 1, len, f);
    const int extra = fgetc(f) != EOF;
    fclose(f);
    return got == len && !extra ? 0 : -1;
}

/* llama_peer MODE 39 IN OUT [extra]: 0 when it ran and succeeded. */
static int peer(const char *mode, const char *in, const char *out, const char *extra) {
    char cmd[3 * 4096 + 256];
    snprintf(cmd, sizeof cmd, "'%s' %s %d '%s' '%s' %s", g_peer, mode, GGML_TYPE_MXFP4, in, out, extra ? extra : "");
    const int rc = run(cmd);
    CHECK(rc == 0, "llama_peer %s exited with %d", mode, rc);
    return rc == 0 ? 0 : -1;
}

static void test_dequant(rng *r) {
    enum { ROUNDS = 16, RANDOM = 4096 };
    const int64_t nb = 256 * ROUNDS + RANDOM, n = nb * 32;
    moex_block_mxfp4 *b = malloc(sizeof *b * (size_t)nb);
    float *ours = malloc(sizeof(float) * (size_t)n), *theirs = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < 256 * ROUNDS; i++) {
        b[i].e = (uint8_t)(i % 256);
        mxfp4_all_codes(r, b[i].qs);
    }
    for (int64_t i = 256 * ROUNDS; i < nb; i++) {
        b[i].e = (uint8_t)rng_next(r);
        for (int j = 0; j < 16; j++) b[i].qs[j] = (uint8_t)rng_next(r);
    }
    char in[4200], out[4200];
    snprintf(in, sizeof in, "%s/mxfp4_blocks.bin", g_work);
    snprintf(out, sizeof out, "%s/mxfp4_ggml.f32", g_work);
    CHECK(write_file(in, b, sizeof *b * (size_t)nb) == 0, "cannot write %s", in);
    if (peer("dequant", in, out, NULL) == 0) {
        CHECK(read_file(out, theirs, sizeof(float) * (size_t)n) == 0, "%s: missing or not %lld floats", out,
              (long long)n);
        CHECK(moex_dequantize_row(MOEX_TYPE_MXFP4, b, ours, n, NULL) == 0, "moex_dequantize_row failed");
        int64_t bad = 0;
        for (int64_t k = 0; k < n; k++)
            if (memcmp(&ours[k], &theirs[k], 4) && bad++ < 5)
                printf("  block %lld (e %d) element %lld: MoEx %a, ggml %a\n", (long long)(k / 32), b[k / 32].e,
                       (long long)(k % 32), ours[k], theirs[k]);
        int n_inf = 0;
        for (int64_t k = 0; k < n; k++) n_inf += isinf(theirs[k]) != 0;
        CHECK(bad == 0, "dequantize: %lld of %lld values differ from ggml's", (long long)bad, (long long)n);
        printf("dequantize: %lld blocks (all 256 exponents x all codes, %d rounds; %d random), %lld values "
               "(%d inf) equal to ggml's bit for bit: %s\n",
               (long long)nb, ROUNDS, RANDOM, (long long)n, n_inf, bad ? "NO" : "yes");
    }
    free(b);
    free(ours);
    free(theirs);
}

/* The 8 E2M1 magnitudes. */
static const float k_e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

/* Block k of the quantization input, one of several kinds. */
static void fill_block(rng *r, int kind, float x[32]) {
    const int s = (int)(rng_next(r) % 200) - 100; /* a power of two for the kinds that want one */
    switch (kind) {
    case 0: { /* gaussian, per-block magnitude 2^-140 .. 2^125 (tiny ones: subnormal blocks, wrapped exponents) */
        const float scale = ldexpf(1.0f, (int)(rng_next(r) % 266) - 140);
        for (int j = 0; j < 32; j++) x[j] = rng_gauss(r) * scale;
        break;
    }
    case 1: /* gaussian of weight-like size */
        for (int j = 0; j < 32; j++) x[j] = rng_gauss(r) * 0.02f;
        break;
    case 2: /* halfway between adjacent E2M1 values, with a top value fixing the exponent */
        for (int j = 0; j < 32; j++) {
            const int m = (int)(rng_next(r) % 7);
            const float v = 0.5f * (k_e2m1[m] + k_e2m1[m + 1]);
            x[j] = ldexpf(rng_next(r) & 1 ? -v : v, s);
        }
        x[rng_next(r) % 32] = ldexpf(rng_next(r) & 1 ? 6.0f : 4.0f, s);
        break;
    case 3: { /* the maximum at a power of two or just below it (where log2f rounds up) */
        for (int j = 0; j < 32; j++) x[j] = (float)(rng_uniform(r) * 2 - 1) * ldexpf(1.0f, s);
        const float p = ldexpf(1.0f, s + 1);
        const int which = (int)(rng_next(r) % 3);
        x[rng_next(r) % 32] = which == 0 ? p : which == 1 ? nextafterf(p, 0) : -nextafterf(nextafterf(p, 0), 0);
        break;
    }
    case 4: /* representable values: each should come back as itself */
        for (int j = 0; j < 32; j++) {
            const float v = k_e2m1[rng_next(r) % 8];
            x[j] = ldexpf(rng_next(r) & 1 ? -v : v, s);
        }
        break;
    case 5: /* zeros (signed), or one value among zeros */
        for (int j = 0; j < 32; j++) x[j] = rng_next(r) & 1 ? -0.0f : 0.0f;
        if (rng_next(r) & 1) x[rng_next(r) % 32] = rng_gauss(r);
        break;
    default: /* uniform, with a few large outliers */
        for (int j = 0; j < 32; j++) x[j] = (float)(rng_uniform(r) * 2 - 1) * (rng_uniform(r) < 0.05 ? 50.0f : 1.0f);
        break;
    }
}

static void test_quantize(rng *r) {
    enum { KINDS = 7, PER_KIND = 1024, PER_ROW = 32 * 64 };
    const int64_t nb = KINDS * PER_KIND, n = nb * 32;
    float *x = malloc(sizeof(float) * (size_t)n);
    moex_block_mxfp4 *ours = malloc(sizeof *ours * (size_t)nb), *theirs = malloc(sizeof *theirs * (size_t)nb);
    for (int64_t i = 0; i < nb; i++) fill_block(r, (int)(i % KINDS), x + 32 * i);
    char in[4200], out[4200], per_row[32];
    snprintf(in, sizeof in, "%s/mxfp4_floats.f32", g_work);
    snprintf(out, sizeof out, "%s/mxfp4_ggml.bin", g_work);
    snprintf(per_row, sizeof per_row, "%d", PER_ROW);
    CHECK(write_file(in, x, sizeof(float) * (size_t)n) == 0, "cannot write %s", in);
    if (peer("quantize", in, out, per_row) == 0) {
        CHECK(read_file(out, theirs, sizeof *theirs * (size_t)nb) == 0, "%s: missing or not %lld blocks", out,
              (long long)nb);
        for (int64_t row = 0; row < n / PER_ROW; row++)
            CHECK(moex_quantize_row(MOEX_TYPE_MXFP4, x + row * PER_ROW, ours + row * (PER_ROW / 32), PER_ROW, NULL) == 0,
                  "moex_quantize_row failed");
        int64_t bad = 0, bad_kind[KINDS] = {0};
        for (int64_t i = 0; i < nb; i++) {
            if (!memcmp(&ours[i], &theirs[i], sizeof ours[i])) continue;
            bad_kind[i % KINDS]++;
            if (bad++ < 5) {
                printf("  block %lld (kind %d): MoEx e %d, ggml e %d; first values", (long long)i, (int)(i % KINDS),
                       ours[i].e, theirs[i].e);
                for (int j = 0; j < 4; j++) printf(" %a", x[32 * i + j]);
                printf("\n");
            }
        }
        for (int k = 0; k < KINDS; k++)
            if (bad_kind[k]) printf("  kind %d: %lld blocks differ\n", k, (long long)bad_kind[k]);
        CHECK(bad == 0, "quantize: %lld of %lld blocks differ from ggml's", (long long)bad, (long long)nb);
        printf("quantize: %lld blocks of %d kinds equal to ggml's quantize_row_mxfp4_ref byte for byte: %s\n",
               (long long)nb, KINDS, bad ? "NO" : "yes");
    }
    free(x);
    free(ours);
    free(theirs);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: test_peer_mxfp4 SETUP_PEER_SH PEER_DIR WORKDIR [seed]\n");
        return 2;
    }
    const char *peer_dir = getenv("MOEX_PEER_DIR") ? getenv("MOEX_PEER_DIR") : argv[2];
    char cmd[3 * 4096];
    snprintf(cmd, sizeof cmd, "MOEX_PEER_DIR='%s' sh '%s'", peer_dir, argv[1]);
    const int rc = run(cmd);
    if (rc == 77) {
        printf("llama.cpp peer unavailable: skipped\n");
        return 77;
    }
    if (rc != 0) {
        fprintf(stderr, "setup_peer.sh failed (exit %d)\n", rc);
        return 1;
    }
    snprintf(g_peer, sizeof g_peer, "%s/bin/llama_peer", peer_dir);
    snprintf(g_work, sizeof g_work, "%s", argv[3]);
    mkdir(g_work, 0777);
    const uint64_t seed = argc > 4 ? strtoull(argv[4], NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    printf("seed %llu (rerun with this as the 4th argument to reproduce)\n", (unsigned long long)seed);
    rng r = {seed};
    test_dequant(&r);
    test_quantize(&r);
    if (g_failures) {
        printf("%d failure(s)\n", g_failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
