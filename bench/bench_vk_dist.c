/* Per-layer cost of the distributed hub's GPU part (engine/vk/forward_vk_dist.c)
 * on a model file: greedy decode after a short prompt with
 *   local       the whole model on the GPU (moex_vk_forward, experts on the GPU);
 *   dist_zero   the distributed path with an executor that writes zeros
 *               (costs ~nothing: isolates the GPU part and the synchronisation);
 *   dist_cpu    the distributed path with the experts on this machine's CPU
 *               (moex_local_executor, f16 at the expert boundary as the wire).
 * Prints "key value" lines. Per variant V:
 *   V_tok_s, V_ms_per_token     decode speed (median of the repetitions)
 *   V_layer_us (dist only)      host time per middle layer segment, from the
 *                               host submitting segment l (layer l-1's result
 *                               written) until layer l's ids, gates
 *                               and xn are readable on the host: the GPU's
 *                               residual add, attention, FFN norm, router and
 *                               readback copies plus the host<->GPU latency
 *   V_first_us, V_head_us       the same for segment 0 (embedding + layer 0)
 *                               and for the head (last result -> logits/argmax)
 *   V_exec_us (dist only)       time in exec.run per layer
 * --idle-us N,M,...: dist_sleepN and dist_spinN, the zero executor taking N us
 * a layer (sleeping, spinning) before it answers: the segment's time after
 * the GPU idled that long, as it does while the experts are on the network.
 * and, on an empty recording,
 *   roundtrip_fence_us          vkQueueSubmit + fence wait of an empty command buffer
 *   local_layer_us              local ms per token / n_layer (experts included)
 * usage: bench_vk_dist MODEL.gguf [--device N] [-p 16] [-n 64] [-r 3] [--skip-cpu] [--idle-us N,...] */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/vk/engine_vk.h"
#define BENCH_NAME "bench_vk_dist"
#include "bench_util.h"

static moex_error err;

/* The zero executor; idle_us > 0: it first takes that long, sleeping or
 * spinning (the GPU idles meanwhile, as it does while a layer's experts are
 * on the network), to tell the GPU's cost of waking from idle apart from the
 * host thread's. */
typedef struct zero_exec {
    int64_t n_embd;
    int idle_us;
    bool spin;
} zero_exec;

static int zero_run(void *ctx, const moex_moe_request *req, moex_error *e) {
    (void)e;
    const zero_exec *z = ctx;
    if (z->idle_us > 0 && z->spin) {
        const double until = moex_time_s() + 1e-6 * z->idle_us;
        while (moex_time_s() < until) {}
    } else if (z->idle_us > 0) {
        struct timespec ts = {0, 1000L * z->idle_us};
        nanosleep(&ts, NULL);
    }
    memset(req->out, 0, (size_t)req->n_tokens * (size_t)z->n_embd * sizeof(float));
    return 0;
}

typedef struct bench {
    const moex_model *m;
    moex_vk_state *s;
    int32_t *prompt;
    int n_prompt, n_gen, reps;
} bench;

/* Seconds per decode token (median over reps), each rep: prompt at 0, 2 untimed tokens, n_gen timed. */
static double decode_s(bench *b, bool dist, moex_vk_dist_stats *st) {
    double t[16];
    moex_vk_dist_stats acc = {0};
    for (int r = 0; r < b->reps; r++) {
        MUST(moex_vk_forward(b->m, b->s, b->prompt, b->n_prompt, 0, false, NULL, &err));
        int32_t tok = moex_vk_last_argmax(b->s);
        int64_t pos = b->n_prompt;
        for (int i = 0; i < 2; i++, pos++) {
            MUST(moex_vk_forward(b->m, b->s, &tok, 1, pos, false, NULL, &err));
            tok = moex_vk_last_argmax(b->s);
        }
        moex_vk_dist_stats skip;
        if (dist) moex_vk_state_dist_stats(b->s, &skip, true);
        const double t0 = moex_time_s();
        for (int i = 0; i < b->n_gen; i++, pos++) {
            MUST(moex_vk_forward(b->m, b->s, &tok, 1, pos, false, NULL, &err));
            tok = moex_vk_last_argmax(b->s);
        }
        t[r] = (moex_time_s() - t0) / b->n_gen;
        if (dist) {
            moex_vk_dist_stats one;
            moex_vk_state_dist_stats(b->s, &one, true);
            acc.forwards += one.forwards, acc.segments += one.segments;
            acc.gpu_s += one.gpu_s, acc.first_s += one.first_s, acc.head_s += one.head_s, acc.exec_s += one.exec_s;
        }
    }
    if (st) *st = acc;
    return median(t, b->reps);
}

static void report(const char *name, double s_tok, const moex_vk_dist_stats *st, int n_layer) {
    printf("%s_tok_s %.2f\n%s_ms_per_token %.3f\n", name, 1.0 / s_tok, name, 1e3 * s_tok);
    if (!st) return;
    const double f = st->forwards ? (double)st->forwards : 1;
    printf("%s_layer_us %.2f\n%s_first_us %.2f\n%s_head_us %.2f\n%s_exec_us %.2f\n", name,
           1e6 * st->gpu_s / (double)(st->segments ? st->segments : 1), name, 1e6 * st->first_s / f, name,
           1e6 * st->head_s / f, name, 1e6 * st->exec_s / (f * n_layer));
}

/* Host <-> GPU round trip on an empty recording (see the header). */
static void roundtrip(moex_vk *vk) {
    enum { ITERS = 200 };
    moex_vk_cmd *c = moex_vk_cmd_create(vk, &err);
    MUST(!c);
    MUST(moex_vk_cmd_begin(c, &err));
    MUST(moex_vk_cmd_end(c, &err));
    double t[ITERS];
    for (int i = 0; i < ITERS; i++) {
        const double t0 = moex_time_s();
        MUST(moex_vk_cmd_run(c, &err));
        t[i] = moex_time_s() - t0;
    }
    printf("roundtrip_fence_us %.2f\n", 1e6 * median(t, ITERS));
    moex_vk_cmd_free(c);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr,
                "usage: bench_vk_dist MODEL.gguf [--device N] [-p 16] [-n 64] [-r 3] [--skip-cpu] [--idle-us N,...]\n");
        return 2;
    }
    int device = -1;
    bench b = {.n_prompt = 16, .n_gen = 64, .reps = 3};
    bool skip_cpu = false;
    const char *idle = NULL;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--skip-cpu")) skip_cpu = true;
        else if (i + 1 < argc && !strcmp(a, "--idle-us")) idle = argv[++i];
        else if (i + 1 < argc && !strcmp(a, "--device")) device = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(a, "-p")) b.n_prompt = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(a, "-n")) b.n_gen = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(a, "-r")) b.reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "bench_vk_dist: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (b.n_prompt < 1 || b.n_gen < 1 || b.reps < 1 || b.reps > 16) {
        fprintf(stderr, "bench_vk_dist: -p, -n >= 1, 1 <= -r <= 16\n");
        return 2;
    }
    moex_model *m = moex_model_load(argv[1], &err);
    MUST(!m);
    b.m = m;
    if (!moex_hparams_is_moe(&m->hp)) {
        fprintf(stderr, "bench_vk_dist: %s is not a MoE model\n", argv[1]);
        return 2;
    }
    char desc[512];
    moex_model_describe(m, desc, sizeof desc);
    printf("model %s\n", desc);
    const int L = m->hp.n_layer;
    const int64_t n_ctx = b.n_prompt + 2 + b.n_gen;
    moex_vk_options o = {.device = device};
    const double t0 = moex_time_s();
    moex_engine eng;
    MUST(moex_engine_open(m, &(moex_engine_options){.backend = MOEX_ENGINE_VULKAN, .vk = o, .n_ctx = n_ctx,
                                                    .n_batch = b.n_prompt}, &eng, &err));
    b.s = moex_engine_vk_state(&eng);
    printf("device %s\nload_s %.2f\nn_layer %d\n", moex_vk_get_info(moex_vk_state_device(b.s))->name,
           moex_time_s() - t0, L);
    b.prompt = malloc((size_t)b.n_prompt * sizeof *b.prompt);
    for (int i = 0; i < b.n_prompt; i++) b.prompt[i] = (int32_t)((1 + 7919 * (int64_t)i) % m->hp.n_vocab);

    roundtrip(moex_vk_state_device(b.s));
    const double local = decode_s(&b, false, NULL);
    report("local", local, NULL, L);
    printf("local_layer_us %.2f\n", 1e6 * local / L);

    zero_exec z = {.n_embd = m->hp.n_embd};
    moex_vk_dist_stats st;
    MUST(moex_vk_state_set_executor(m, b.s, (moex_expert_executor){.ctx = &z, .run = zero_run}, &err));
    report("dist_zero", decode_s(&b, true, &st), &st, L);
    for (const char *p = idle; p && *p;) {
        char *end;
        z.idle_us = (int)strtol(p, &end, 10);
        if (end == p || z.idle_us < 0 || z.idle_us > 1000000) {
            fprintf(stderr, "bench_vk_dist: --idle-us takes microseconds, comma-separated (0..1000000)\n");
            return 2;
        }
        for (int spin = 0; spin < 2; spin++) {
            char name[64];
            z.spin = spin;
            snprintf(name, sizeof name, "dist_%s%d", spin ? "spin" : "sleep", z.idle_us);
            report(name, decode_s(&b, true, &st), &st, L);
        }
        p = *end == ',' ? end + 1 : end;
    }
    z.idle_us = 0;
    if (!skip_cpu) {
        moex_pool *pool = moex_pool_create(0);
        moex_local_executor *le = moex_local_executor_create(m, pool, MOEX_WIRE_DEFAULT);
        MUST(!le);
        MUST(moex_vk_state_set_executor(m, b.s, moex_local_executor_iface(le), &err));
        report("dist_cpu", decode_s(&b, true, &st), &st, L);
        printf("cpu_threads %d\n", moex_pool_size(pool));
        MUST(moex_vk_state_set_executor(m, b.s, (moex_expert_executor){0}, &err));
        moex_local_executor_free(le);
        moex_pool_destroy(pool);
    }
    moex_engine_close(&eng);
    free(b.prompt);
    moex_model_free(m);
    return 0;
}
