/* llama.cpp's Vulkan backend (npm @node-llama-cpp/linux-x64-vulkan) on the
 * same file and the same measurements as bench_vk: pp (one batch of -p),
 * tg from an empty context, tg after the -p prompt. All layers on the GPU,
 * context defaults otherwise (as llama-bench). Built by bench/vk/bench_h200.sh's
 * caller (see that script); not part of the CMake build.
 * usage: llama_bench_vk BACKEND_DIR MODEL [-p 512] [-n 128] [-r 3] */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-backend.h"
#include "llama.h"
#include "../bench_util.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void quiet_log(enum ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    if (getenv("LLAMA_VERBOSE") || level >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

static int decode(struct llama_context *ctx, const llama_token *toks, int n, int pos0) {
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = toks[i];
        b.pos[i] = pos0 + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = (int8_t)(i == n - 1);
    }
    b.n_tokens = n;
    int rc = llama_decode(ctx, b);
    llama_batch_free(b);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: llama_bench_vk BACKEND_DIR MODEL [-p 512] [-n 128] [-r 3]\n");
        return 2;
    }
    int n_p = 512, n_g = 128, reps = 3;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-p")) n_p = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-n")) n_g = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-r")) reps = atoi(argv[i + 1]);
    }
    if (n_p < 1 || n_g < 1 || reps < 1 || reps > 64) return 2;
    llama_log_set(quiet_log, NULL);
    ggml_backend_load_all_from_path(argv[1]);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 999;
    double t0 = now_s();
    struct llama_model *m = llama_model_load_from_file(argv[2], mp);
    if (!m) {
        fprintf(stderr, "llama_bench_vk: cannot load %s\n", argv[2]);
        return 1;
    }
    printf("llama_load_s %.2f\n", now_s() - t0);
    for (size_t i = 0; i < ggml_backend_dev_count(); i++)
        printf("llama_device %s (%s)\n", ggml_backend_dev_name(ggml_backend_dev_get(i)),
               ggml_backend_dev_description(ggml_backend_dev_get(i)));
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n_p + n_g + 8);
    cp.n_batch = cp.n_ubatch = (uint32_t)n_p;
    cp.no_perf = 1;
    struct llama_context *ctx = llama_init_from_model(m, cp);
    if (!ctx) return 1;
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(m));
    llama_token *toks = malloc((size_t)n_p * sizeof *toks);
    for (int i = 0; i < n_p; i++) toks[i] = (llama_token)((i * 7919 + 13) % n_vocab);
    double pp[64], tg0[64], tgd[64];
    llama_memory_t mem = llama_get_memory(ctx);
    int rc = decode(ctx, toks, n_p, 0) || decode(ctx, toks, 1, n_p);   /* warm-up */
    for (int r = 0; r < reps && !rc; r++) {
        llama_memory_clear(mem, 1);
        llama_token t = toks[0];
        double ts = now_s();
        for (int i = 0; i < n_g && !rc; i++, t = (t + 1) % n_vocab) rc |= decode(ctx, &t, 1, i);
        llama_synchronize(ctx);
        tg0[r] = n_g / (now_s() - ts);
        llama_memory_clear(mem, 1);
        ts = now_s();
        rc |= decode(ctx, toks, n_p, 0);
        llama_synchronize(ctx);
        pp[r] = n_p / (now_s() - ts);
        ts = now_s();
        for (int i = 0; i < n_g && !rc; i++, t = (t + 1) % n_vocab) rc |= decode(ctx, &t, 1, n_p + i);
        llama_synchronize(ctx);
        tgd[r] = n_g / (now_s() - ts);
        fprintf(stderr, "llama_bench_vk: rep %d: pp%d %.1f, tg%d %.1f, tg%d@%d %.1f tok/s\n", r + 1, n_p, pp[r], n_g,
                tg0[r], n_g, n_p, tgd[r]);
    }
    if (!rc)
        printf("llama_pp%d_tok_s %.2f\nllama_tg%d_tok_s %.2f\nllama_tg%d_after_pp%d_tok_s %.2f\n", n_p,
               median(pp, reps), n_g, median(tg0, reps), n_g, n_p, median(tgd, reps));
    free(toks);
    llama_free(ctx);
    llama_model_free(m);
    return rc ? 1 : 0;
}
