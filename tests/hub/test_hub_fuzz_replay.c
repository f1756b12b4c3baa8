/* Runs fuzz_hub's entry point (hub/fuzz_hub.c: the registry and the remote
 * executor under frame sequences from fake workers) over its seed sessions
 * and deterministic mutations of them: every truncation, every byte set to
 * 0x00 / 0xff / +1 / -1, and random multi-byte edits. Catches in every build
 * (ASan/UBSan included) what the fuzzer checks in fuzz builds.
 * usage: test_hub_fuzz_replay SEED_DIR (MOEX_FUZZ_HUB_MODEL names the model) */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t rng = 0x853c49e6748fea9bull;
static uint32_t next_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

/* Each input in its own allocation of exactly its size, so ASan sees overreads. */
static long run(const uint8_t *data, size_t n) {
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, data, n);
    LLVMFuzzerTestOneInput(copy, n);
    free(copy);
    return 1;
}

static long mutate_all(const uint8_t *seed, size_t n) {
    long count = 0;
    uint8_t *buf = malloc(n + 8);
    for (size_t len = 0; len <= n; len++) count += run(seed, len);
    static const int deltas[] = {0x00, 0xff, 1, -1};
    for (size_t i = 0; i < n; i++)
        for (int d = 0; d < 4; d++) {
            memcpy(buf, seed, n);
            buf[i] = d < 2 ? (uint8_t)deltas[d] : (uint8_t)(buf[i] + deltas[d]);
            count += run(buf, n);
        }
    for (int k = 0; k < 300; k++) {
        memcpy(buf, seed, n);
        const int edits = 1 + (int)(next_u32() % 4);
        for (int e = 0; e < edits; e++) buf[next_u32() % n] = (uint8_t)next_u32();
        size_t len = next_u32() % 8 ? n : next_u32() % (n + 8);
        if (len > n) memset(buf + n, 0, len - n);
        count += run(buf, len);
    }
    free(buf);
    return count;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s SEED_DIR\n", argv[0]);
        return 2;
    }
    LLVMFuzzerInitialize(&argc, &argv);
    DIR *dir = opendir(argv[1]);
    if (!dir) {
        fprintf(stderr, "cannot open %s\n", argv[1]);
        return 2;
    }
    long inputs = 0, seeds = 0;
    struct dirent *de;
    while ((de = readdir(dir))) {
        if (de->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[1], de->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        uint8_t seed[1 << 12];
        const size_t n = fread(seed, 1, sizeof seed, f);
        fclose(f);
        if (n == 0) continue;
        inputs += mutate_all(seed, n);
        seeds++;
    }
    closedir(dir);
    printf("replayed %ld inputs from %ld seed sessions\n", inputs, seeds);
    if (seeds < 5) {
        fprintf(stderr, "expected the seed sessions of tests/hub/fuzz_hub_seeds.py, found %ld\n", seeds);
        return 1;
    }
    return 0;
}
