/* Runs a libFuzzer target's entry point (linked in beside this file) over its
 * seed inputs and deterministic mutations of them: every truncation, every
 * byte set to 0x00 / 0xff / +1 / -1, and EDITS random multi-byte edits per
 * seed. Catches in every build (ASan/UBSan included) what the fuzzer checks
 * in fuzz builds. A target with an LLVMFuzzerInitialize has it called first.
 * usage: REPLAY SEED_DIR MIN_SEEDS EDITS */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_SEED (1 << 16)

static uint32_t next_u32(uint64_t *rng) {
    *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17;
    return (uint32_t)(*rng >> 32);
}

/* Each input in its own allocation of exactly its size, so ASan sees overreads. */
static long run(const uint8_t *data, size_t n) {
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy) abort();
    memcpy(copy, data, n);
    LLVMFuzzerTestOneInput(copy, n);
    free(copy);
    return 1;
}

static long mutate_all(const uint8_t *seed, size_t n, long edits_per_seed, uint64_t *rng) {
    long count = 0;
    uint8_t *buf = malloc(n + 8);
    if (!buf) abort();
    for (size_t len = 0; len <= n; len++) count += run(seed, len);
    static const int deltas[] = {0x00, 0xff, 1, -1};
    for (size_t i = 0; i < n; i++)
        for (int d = 0; d < 4; d++) {
            memcpy(buf, seed, n);
            buf[i] = d < 2 ? (uint8_t)deltas[d] : (uint8_t)(buf[i] + deltas[d]);
            count += run(buf, n);
        }
    for (long k = 0; k < edits_per_seed; k++) {
        memcpy(buf, seed, n);
        const int edits = 1 + (int)(next_u32(rng) % 4);
        for (int e = 0; e < edits; e++) buf[next_u32(rng) % n] = (uint8_t)next_u32(rng);
        size_t len = next_u32(rng) % 8 ? n : next_u32(rng) % (n + 8);
        if (len > n) memset(buf + n, 0, len - n);
        count += run(buf, len);
    }
    free(buf);
    return count;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s SEED_DIR MIN_SEEDS EDITS\n", argv[0]);
        return 2;
    }
    const char *where = argv[1];
    const long min_seeds = atol(argv[2]), edits = atol(argv[3]);
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    DIR *dir = opendir(where);
    if (!dir) {
        fprintf(stderr, "cannot open %s\n", where);
        return 2;
    }
    static uint8_t seed[MAX_SEED];
    uint64_t rng = 0x853c49e6748fea9bull;
    long inputs = 0, seeds = 0;
    struct dirent *de;
    while ((de = readdir(dir))) {
        if (de->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", where, de->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        const size_t n = fread(seed, 1, sizeof seed, f);
        fclose(f);
        if (n == 0) continue;
        inputs += mutate_all(seed, n, edits, &rng);
        seeds++;
    }
    closedir(dir);
    printf("replayed %ld inputs from %ld seeds in %s\n", inputs, seeds, where);
    if (seeds < min_seeds) {
        fprintf(stderr, "expected at least %ld seeds in %s (their generator writes them), found %ld\n", min_seeds,
                where, seeds);
        return 1;
    }
    return 0;
}
