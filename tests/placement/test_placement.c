/* Placement: distinct replicas, balance, minimal movement on join / leave,
 * weights, determinism, diff consistency and rejection of bad input. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "placement/placement.h"

#include "tests/test_util.h"

enum { LAYERS = 48, EXPERTS = 128, R = 2 };

static moex_placement *build(const moex_worker_spec *w, uint32_t n, uint32_t r) {
    moex_placement_config cfg = {.n_layers = LAYERS, .n_experts = EXPERTS, .replicas = r};
    moex_error err = {{0}};
    moex_placement *p = moex_placement_build(w, n, &cfg, &err);
    if (!p) fprintf(stderr, "build failed: %s\n", err.msg);
    return p;
}

static void uniform_workers(moex_worker_spec *w, uint32_t n, uint32_t first_id) {
    for (uint32_t i = 0; i < n; i++) w[i] = (moex_worker_spec){first_id + i * 7919u, 1.0f};
}

/* Every expert has r distinct, known workers; loads add up. */
static void check_invariants(const moex_placement *p, const moex_worker_spec *w, uint32_t n) {
    uint32_t r = moex_placement_replicas(p);
    size_t total = 0;
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t e = 0; e < EXPERTS; e++) {
            const uint32_t *ids = moex_placement_lookup(p, l, e);
            for (uint32_t a = 0; a < r; a++) {
                int known = 0;
                for (uint32_t i = 0; i < n; i++) known |= w[i].id == ids[a];
                CHECK(known, "(%u,%u) replica %u on unknown worker %u", l, e, a, ids[a]);
                for (uint32_t b = a + 1; b < r; b++)
                    CHECK(ids[a] != ids[b], "(%u,%u) replicas %u and %u both on worker %u", l, e, a, b, ids[a]);
            }
        }
    for (uint32_t i = 0; i < n; i++) total += moex_placement_load(p, w[i].id);
    CHECK(total == (size_t)LAYERS * EXPERTS * r, "loads sum to %zu", total);
}

static double max_over_mean(const moex_placement *p, const moex_worker_spec *w, uint32_t n) {
    double sum = 0, mx = 0;
    for (uint32_t i = 0; i < n; i++) {
        double l = (double)moex_placement_load(p, w[i].id) / w[i].weight;
        sum += l;
        if (l > mx) mx = l;
    }
    return mx / (sum / n);
}

static void test_balance_and_distinct(void) {
    moex_worker_spec w[16];
    uniform_workers(w, 16, 100);
    moex_placement *p = build(w, 16, R);
    check_invariants(p, w, 16);
    double ratio = max_over_mean(p, w, 16);
    printf("16 workers, r=2: max/mean load %.3f\n", ratio);
    CHECK(ratio <= 1.25, "max/mean %.3f", ratio);
    /* other sizes too: the bound is not tuned to one case */
    for (uint32_t n = 4; n <= 64; n *= 2) {
        moex_worker_spec ws[64];
        uniform_workers(ws, n, 1);
        moex_placement *q = build(ws, n, R);
        check_invariants(q, ws, n);
        double rq = max_over_mean(q, ws, n);
        printf("%u workers, r=2: max/mean %.3f\n", n, rq);
        CHECK(rq <= 1.25 + (n >= 32 ? 0.1 : 0.0), "%u workers: max/mean %.3f", n, rq);
        moex_placement_free(q);
    }
    moex_placement_free(p);
}

static void test_deterministic_and_order_free(void) {
    moex_worker_spec w[16], shuffled[16];
    uniform_workers(w, 16, 100);
    for (int i = 0; i < 16; i++) shuffled[i] = w[(i * 5 + 3) % 16];
    moex_placement *a = build(w, 16, R), *b = build(shuffled, 16, R), *c = build(w, 16, R);
    int same_ab = 1, same_ac = 1;
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t e = 0; e < EXPERTS; e++) {
            same_ab &= !memcmp(moex_placement_lookup(a, l, e), moex_placement_lookup(b, l, e), R * 4);
            same_ac &= !memcmp(moex_placement_lookup(a, l, e), moex_placement_lookup(c, l, e), R * 4);
        }
    CHECK(same_ab, "placement depends on the order of the worker list");
    CHECK(same_ac, "two builds differ");
    moex_placement_config cfg = {.n_layers = LAYERS, .n_experts = EXPERTS, .replicas = R, .seed = 1};
    moex_placement *d = moex_placement_build(w, 16, &cfg, NULL);
    int diff = 0;
    for (uint32_t e = 0; e < EXPERTS; e++) diff += moex_placement_lookup(a, 0, e)[0] != moex_placement_lookup(d, 0, e)[0];
    CHECK(diff > EXPERTS / 2, "seed barely changes the layout (%d of %d primaries differ)", diff, EXPERTS);
    moex_placement_free(a);
    moex_placement_free(b);
    moex_placement_free(c);
    moex_placement_free(d);
}

/* Applying the diff to the old holdings gives the new ones, for every worker. */
static void check_diff_applies(const moex_placement *from, const moex_placement *to, const moex_placement_diff *d) {
    size_t cap = (size_t)LAYERS * EXPERTS;
    unsigned char *held = malloc(cap);
    moex_expert_ref *refs = malloc(sizeof *refs * cap);
    for (uint32_t i = 0; i < d->n_workers; i++) {
        const moex_placement_change *c = &d->workers[i];
        memset(held, 0, cap);
        size_t n = moex_placement_held(from, c->worker_id, refs, cap);
        for (size_t k = 0; k < n; k++) held[refs[k].layer * EXPERTS + refs[k].expert] = 1;
        for (uint32_t k = 0; k < c->n_drop; k++) {
            CHECK(held[c->drop[k].layer * EXPERTS + c->drop[k].expert] == 1, "worker %u drops what it lacks", c->worker_id);
            held[c->drop[k].layer * EXPERTS + c->drop[k].expert] = 0;
        }
        for (uint32_t k = 0; k < c->n_load; k++) {
            CHECK(held[c->load[k].layer * EXPERTS + c->load[k].expert] == 0, "worker %u loads what it has", c->worker_id);
            held[c->load[k].layer * EXPERTS + c->load[k].expert] = 1;
        }
        n = moex_placement_held(to, c->worker_id, refs, cap);
        size_t count = 0;
        for (size_t k = 0; k < cap; k++) count += held[k];
        CHECK(count == n, "worker %u: after the diff holds %zu, the new placement says %zu", c->worker_id, count, n);
        for (size_t k = 0; k < n; k++)
            CHECK(held[refs[k].layer * EXPERTS + refs[k].expert], "worker %u misses (%u,%u)", c->worker_id,
                  refs[k].layer, refs[k].expert);
    }
    free(held);
    free(refs);
}

static void test_join_and_leave(void) {
    enum { N = 16 };
    moex_worker_spec w[N + 1];
    uniform_workers(w, N + 1, 100);
    const double slots = (double)LAYERS * EXPERTS * R;
    moex_placement *before = build(w, N, R), *joined = build(w, N + 1, R);
    moex_placement_diff d;
    moex_error err;
    CHECK(moex_placement_diff_build(before, joined, &d, &err) == 0, "%s", err.msg);
    double frac = d.moved / slots;
    printf("join: %.4f of replica slots move (2/(N+1) = %.4f, ideal 1/(N+1) = %.4f)\n", frac, 2.0 / (N + 1),
           1.0 / (N + 1));
    CHECK(frac <= 2.0 / (N + 1), "join moves %.4f of slots", frac);
    CHECK(d.moved > 0, "the new worker got nothing");
    for (uint32_t i = 0; i < d.n_workers; i++) {
        const moex_placement_change *c = &d.workers[i];
        if (c->worker_id == w[N].id) CHECK(c->n_drop == 0 && c->n_load == d.moved, "joiner loads %u", c->n_load);
        else CHECK(c->n_load == 0, "worker %u loads %u experts when another joins", c->worker_id, c->n_load);
    }
    check_diff_applies(before, joined, &d);
    moex_placement_diff_free(&d);

    /* leave: worker 5 goes away */
    moex_worker_spec left[N - 1];
    for (int i = 0, k = 0; i < N; i++)
        if (i != 5) left[k++] = w[i];
    moex_placement *after = build(left, N - 1, R);
    CHECK(moex_placement_diff_build(before, after, &d, &err) == 0, "%s", err.msg);
    frac = d.moved / slots;
    printf("leave: %.4f of replica slots move (2/N = %.4f, ideal 1/N = %.4f)\n", frac, 2.0 / N, 1.0 / N);
    CHECK(frac <= 2.0 / N, "leave moves %.4f of slots", frac);
    for (uint32_t i = 0; i < d.n_workers; i++) {
        const moex_placement_change *c = &d.workers[i];
        if (c->worker_id == w[5].id)
            CHECK(c->n_load == 0 && c->n_drop == moex_placement_load(before, w[5].id), "leaver drops %u", c->n_drop);
        else
            CHECK(c->n_drop == 0, "worker %u drops %u experts when another leaves", c->worker_id, c->n_drop);
    }
    check_diff_applies(before, after, &d);
    moex_placement_diff_free(&d);

    /* replication factor change: r=2 -> r=3 only adds */
    moex_placement *r3 = build(w, N, 3);
    CHECK(moex_placement_diff_build(before, r3, &d, &err) == 0, "%s", err.msg);
    CHECK(d.moved == (uint64_t)LAYERS * EXPERTS, "r 2->3 loads %llu", (unsigned long long)d.moved);
    check_diff_applies(before, r3, &d);
    moex_placement_diff_free(&d);

    moex_placement_free(before);
    moex_placement_free(joined);
    moex_placement_free(after);
    moex_placement_free(r3);
}

static void test_weights(void) {
    moex_worker_spec w[16];
    uniform_workers(w, 16, 100);
    w[3].weight = 2.0f;
    w[9].weight = 0.5f;
    moex_placement *p = build(w, 16, R);
    check_invariants(p, w, 16);
    double mean1 = 0;
    for (int i = 0; i < 16; i++)
        if (i != 3 && i != 9) mean1 += moex_placement_load(p, w[i].id) / 14.0;
    double r2 = moex_placement_load(p, w[3].id) / mean1, rh = moex_placement_load(p, w[9].id) / mean1;
    printf("weights: weight 2 gets %.2fx, weight 0.5 gets %.2fx the load of weight 1\n", r2, rh);
    CHECK(r2 > 1.7 && r2 < 2.3, "weight 2 gets %.2fx", r2);
    CHECK(rh > 0.35 && rh < 0.65, "weight 0.5 gets %.2fx", rh);
    moex_placement_free(p);
}

static void test_queries(void) {
    moex_worker_spec w[4];
    uniform_workers(w, 4, 1);
    moex_placement *p = build(w, 4, R);
    CHECK(moex_placement_lookup(p, LAYERS, 0) == NULL, "layer out of range");
    CHECK(moex_placement_lookup(p, 0, EXPERTS) == NULL, "expert out of range");
    CHECK(moex_placement_load(p, 424242) == 0, "unknown worker has load");
    CHECK(moex_placement_n_workers(p) == 4 && moex_placement_worker(p, 0).id == 1, "worker list");
    size_t n = moex_placement_held(p, w[2].id, NULL, 0);
    CHECK(n == moex_placement_load(p, w[2].id), "held %zu vs load %zu", n, moex_placement_load(p, w[2].id));
    moex_expert_ref refs[4];
    size_t m = moex_placement_held(p, w[2].id, refs, 4);
    CHECK(m == n, "held count independent of cap");
    for (int k = 0; k < 4; k++) {
        const uint32_t *ids = moex_placement_lookup(p, refs[k].layer, refs[k].expert);
        CHECK(ids[0] == w[2].id || ids[1] == w[2].id, "held (%u,%u) not on the worker", refs[k].layer, refs[k].expert);
    }
    moex_placement_free(p);
}

static void expect_build_error(const moex_worker_spec *w, uint32_t n, moex_placement_config cfg, const char *what) {
    moex_error err = {{0}};
    moex_placement *p = moex_placement_build(w, n, &cfg, &err);
    CHECK(p == NULL && err.msg[0], "%s was accepted", what);
    if (!p) printf("rejected %s: %s\n", what, err.msg);
    moex_placement_free(p);
}

static void test_bad_input(void) {
    moex_worker_spec w[4];
    uniform_workers(w, 4, 1);
    moex_placement_config ok = {.n_layers = 2, .n_experts = 8, .replicas = 2};
    moex_placement_config c = ok;
    c.replicas = 5;
    expect_build_error(w, 4, c, "more replicas than workers");
    c = ok;
    c.replicas = 0;
    expect_build_error(w, 4, c, "zero replicas");
    c = ok;
    c.n_layers = 0;
    expect_build_error(w, 4, c, "zero layers");
    c = ok;
    c.n_experts = 70000;
    expect_build_error(w, 4, c, "too many experts");
    c = ok;
    c.vnodes_per_weight = 1u << 30;
    expect_build_error(w, 4, c, "a ring too large");
    expect_build_error(NULL, 4, ok, "a NULL worker list");
    moex_worker_spec bad[4];
    memcpy(bad, w, sizeof w);
    bad[2].id = bad[1].id;
    expect_build_error(bad, 4, ok, "duplicate ids");
    memcpy(bad, w, sizeof w);
    bad[0].weight = 0.0f;
    expect_build_error(bad, 4, ok, "zero weight");
    bad[0].weight = NAN;
    expect_build_error(bad, 4, ok, "NaN weight");
    bad[0].weight = -1.0f;
    expect_build_error(bad, 4, ok, "negative weight");
    /* diffs between placements of different models */
    moex_placement *a = moex_placement_build(w, 4, &ok, NULL);
    c = ok;
    c.n_experts = 16;
    moex_placement *b = moex_placement_build(w, 4, &c, NULL);
    moex_placement_diff d;
    moex_error err = {{0}};
    CHECK(moex_placement_diff_build(a, b, &d, &err) != 0 && err.msg[0], "diff across models accepted");
    moex_placement_free(a);
    moex_placement_free(b);
}

int main(void) {
    test_balance_and_distinct();
    test_deterministic_and_order_free();
    test_join_and_leave();
    test_weights();
    test_queries();
    test_bad_input();
    if (g_failures) fprintf(stderr, "%d check(s) failed\n", g_failures);
    else printf("all placement checks passed\n");
    return g_failures != 0;
}
