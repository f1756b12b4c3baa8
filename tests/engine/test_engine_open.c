/* moex_engine_open, the one constructor every program uses, on the shipped
 * model (argv[1]):
 *   - the CPU engine it opens (warmed up: a token run through first) gives
 *     the logits of a state assembled by hand (the local executor, the same
 *     wire rounding), bit for bit;
 *   - options.experts is what computes the experts (a counting executor sees
 *     every MoE layer of every forward), and record_routes records each token;
 *   - bad options fail with a reason and leave nothing open (ASan sees leaks);
 *   - on Vulkan (lavapipe in CI): KV slots and the batched forward, the GPU
 *     argmax equal to the argmax of the logits it reads back, and the experts
 *     sent to options.experts with their weights left off the GPU. */
#include <string.h>

#include "engine/engine.h"
#if MOEX_HAVE_VULKAN
#include "engine/vk/engine_vk.h"
#endif

#include "tests/test_util.h"

static const int32_t TOKENS[] = {1, 40, 300, 7, 1200, 55};
enum { N_TOK = 6, N_CTX = 32 };

typedef struct counting {
    moex_expert_executor inner;
    int64_t calls, rows;
} counting;

static int counting_run(void *ctx, const moex_moe_request *req, moex_error *err) {
    counting *c = ctx;
    c->calls++;
    c->rows += req->n_tokens;
    return c->inner.run(c->inner.ctx, req, err);
}

/* The engine moex_engine_open gives equals the state assembled by hand. */
static void cpu_matches_hand_built(const moex_model *m, moex_pool *pool) {
    const int64_t V = m->hp.n_vocab;
    float *a = malloc((size_t)V * sizeof *a), *b = malloc((size_t)V * sizeof *b);
    moex_error err = {0};
    moex_engine eng;
    CHECK(!moex_engine_open(m, &(moex_engine_options){.n_ctx = N_CTX, .n_batch = 8, .pool = pool,
                                                      .wire_dtype = MOEX_WIRE_DEFAULT, .warm_up = true}, &eng, &err),
          "open: %s", err.msg);
    CHECK(eng.n_ctx == N_CTX && eng.n_batch == 8 && eng.n_seq == 1, "sizes %lld %lld %d", (long long)eng.n_ctx,
          (long long)eng.n_batch, eng.n_seq);
    CHECK(!strncmp(moex_engine_backend_name(&eng), "cpu (", 5), "backend %s", moex_engine_backend_name(&eng));
    CHECK(!eng.forward(eng.ctx, TOKENS, N_TOK, 0, false, a, &err), "forward: %s", err.msg);

    moex_local_executor *le = moex_local_executor_create(m, pool, MOEX_WIRE_DEFAULT);
    moex_state *s = moex_state_create(m, N_CTX, 8, pool, moex_local_executor_iface(le), &err);
    CHECK(s && !moex_forward(m, s, TOKENS, N_TOK, 0, false, b, &err), "hand-built: %s", err.msg);
    CHECK(!memcmp(a, b, (size_t)V * sizeof *a), "the opened engine's logits differ from the hand-built state's");
    moex_state_free(s);
    moex_local_executor_free(le);
    moex_engine_close(&eng);
    moex_engine_close(&eng); /* closing twice is harmless */
    free(a), free(b);
}

/* options.experts computes the experts; record_routes records every token. */
static void experts_and_routes(const moex_model *m, moex_pool *pool) {
    moex_error err = {0};
    moex_local_executor *le = moex_local_executor_create(m, pool, MOEX_WIRE_DEFAULT);
    counting c = {.inner = moex_local_executor_iface(le)};
    moex_engine eng;
    CHECK(!moex_engine_open(m, &(moex_engine_options){.n_ctx = N_CTX, .n_batch = 8, .pool = pool,
                                                      .experts = {.ctx = &c, .run = counting_run},
                                                      .record_routes = true}, &eng, &err),
          "open: %s", err.msg);
    float *logits = malloc((size_t)m->hp.n_vocab * sizeof *logits);
    CHECK(!eng.forward(eng.ctx, TOKENS, 3, 0, false, logits, &err), "forward: %s", err.msg);
    CHECK(c.calls >= m->hp.n_layer && c.calls % m->hp.n_layer == 0, "the executor ran %lld times for %d layers",
          (long long)c.calls, m->hp.n_layer);
    CHECK(moex_engine_routes(&eng) != NULL, "no routing recorder");
    CHECK(moex_route_recorder_tokens(moex_engine_routes(&eng)) == c.rows / m->hp.n_layer,
          "recorded %lld tokens, the executor saw %lld rows", (long long)moex_route_recorder_tokens(moex_engine_routes(&eng)),
          (long long)c.rows);
    moex_engine_close(&eng);
    CHECK(moex_engine_routes(&eng) == NULL, "routes after close");
    moex_local_executor_free(le);
    free(logits);
}

/* Options that cannot work: a reason, and nothing open (eng zeroed). */
static void bad_options(const moex_model *m, moex_pool *pool) {
    moex_error err = {0};
    moex_engine eng;
    CHECK(moex_engine_open(m, &(moex_engine_options){.n_ctx = N_CTX, .n_batch = 8, .pool = pool, .n_seq = 2}, &eng,
                           &err) && strstr(err.msg, "batched") && !eng.parts && !eng.forward,
          "two slots without the batched forward: '%s'", err.msg);
    err = (moex_error){0};
    CHECK(moex_engine_open(m, &(moex_engine_options){.n_ctx = N_CTX, .n_batch = 8}, &eng, &err) &&
              strstr(err.msg, "pool") && !eng.parts,
          "CPU without threads: '%s'", err.msg);
    err = (moex_error){0};
    CHECK(moex_engine_open(m, &(moex_engine_options){.n_ctx = 0, .n_batch = 8, .pool = pool}, &eng, &err) &&
              err.msg[0] && !eng.parts,
          "no context: '%s'", err.msg);
#if !MOEX_HAVE_VULKAN
    err = (moex_error){0};
    CHECK(moex_engine_open(m, &(moex_engine_options){.backend = MOEX_ENGINE_VULKAN, .n_ctx = N_CTX, .n_batch = 8},
                           &eng, &err) && strstr(err.msg, "Vulkan"),
          "Vulkan in a build without it: '%s'", err.msg);
#endif
}

#if MOEX_HAVE_VULKAN
static int32_t argmax_of(const float *v, int64_t n) {
    int32_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = (int32_t)i;
    return best;
}

static void vulkan(const moex_model *m, moex_pool *pool) {
    const int64_t V = m->hp.n_vocab;
    moex_error err = {0};
    moex_engine eng;
    CHECK(moex_engine_open(m, &(moex_engine_options){.backend = MOEX_ENGINE_VULKAN, .vk = {.device = -1},
                                                     .n_ctx = N_CTX, .n_batch = 8, .record_routes = true},
                           &eng, &err) && strstr(err.msg, "routes"),
          "routes on a whole-model Vulkan engine: '%s'", err.msg);
    err = (moex_error){0};
    CHECK(moex_engine_open(m, &(moex_engine_options){.backend = MOEX_ENGINE_VULKAN, .vk = {.device = -1},
                                                     .n_ctx = N_CTX, .n_batch = 8, .pool = pool, .cpu_moe = true,
                                                     .record_routes = true},
                           &eng, &err) && strstr(err.msg, "routes") && !eng.parts,
          "routes with --cpu-moe (the GPU computes a prompt's experts): '%s'", err.msg);
    err = (moex_error){0};
    if (moex_engine_open(m, &(moex_engine_options){.backend = MOEX_ENGINE_VULKAN, .vk = {.device = -1},
                                                   .n_ctx = N_CTX, .n_batch = 8, .n_seq = 2, .batched = true,
                                                   .warm_up = true},
                         &eng, &err)) {
        CHECK(0, "Vulkan open: %s", err.msg);
        return;
    }
    CHECK(moex_engine_vk_state(&eng) && !strcmp(moex_engine_backend_name(&eng), "vulkan") && eng.n_seq == 2 &&
              eng.forward_batch && eng.last_argmax,
          "the Vulkan engine lacks its parts");
    float *logits = malloc((size_t)V * sizeof *logits);
    CHECK(!eng.forward(eng.ctx, TOKENS, N_TOK, 0, false, logits, &err), "forward: %s", err.msg);
    CHECK(eng.last_argmax(eng.ctx) == argmax_of(logits, V), "GPU argmax %d, the logits' %d", eng.last_argmax(eng.ctx),
          argmax_of(logits, V));
    const int64_t read = moex_vk_state_logits_rows_read(moex_engine_vk_state(&eng));
    CHECK(read == 1, "%lld logits rows read back after the warm-up and one forward, want 1", (long long)read);
    CHECK(!eng.forward(eng.ctx, TOKENS, 1, N_TOK, false, NULL, &err), "greedy forward: %s", err.msg);
    CHECK(moex_vk_state_logits_rows_read(moex_engine_vk_state(&eng)) == read, "a forward without logits read some back");
    moex_engine_close(&eng);

    /* experts on an executor: the GPU keeps attention, router and head */
    moex_local_executor *le = moex_local_executor_create(m, pool, MOEX_WIRE_DEFAULT);
    counting c = {.inner = moex_local_executor_iface(le)};
    CHECK(!moex_engine_open(m, &(moex_engine_options){.backend = MOEX_ENGINE_VULKAN, .vk = {.device = -1},
                                                      .n_ctx = N_CTX, .n_batch = 8, .pool = pool,
                                                      .experts = {.ctx = &c, .run = counting_run},
                                                      .record_routes = true}, &eng, &err),
          "Vulkan with remote experts: %s", err.msg);
    if (eng.forward) {
        const int64_t before = c.calls;
        CHECK(!eng.forward(eng.ctx, TOKENS, 3, 0, false, logits, &err), "forward: %s", err.msg);
        CHECK(c.calls - before == m->hp.n_layer, "the executor ran %lld times for %d layers",
              (long long)(c.calls - before), m->hp.n_layer);
        CHECK(moex_route_recorder_tokens(moex_engine_routes(&eng)) >= 3, "routes not recorded");
    }
    moex_engine_close(&eng);
    moex_local_executor_free(le);
    free(logits);
}
#endif

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_engine_open MODEL.gguf\n");
        return 2;
    }
    moex_error err = {0};
    moex_model *m = moex_model_load(argv[1], &err);
    if (!m) {
        fprintf(stderr, "cannot load %s: %s\n", argv[1], err.msg);
        return 1;
    }
    moex_pool *pool = moex_pool_create(2);
    cpu_matches_hand_built(m, pool);
    experts_and_routes(m, pool);
    bad_options(m, pool);
#if MOEX_HAVE_VULKAN
    vulkan(m, pool);
#endif
    moex_pool_destroy(pool);
    moex_model_free(m);
    if (g_failures) return 1;
    printf("test_engine_open: ok\n");
    return 0;
}
