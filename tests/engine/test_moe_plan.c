/* The MoE plan both executors share: grouping of random requests (every pair
 * in exactly one group, groups by ascending expert, tokens in order within a
 * group), combine against a direct per-token sum in slot order, refusal of
 * bad expert ids, and reuse across batch sizes. */
#include <string.h>

#include "engine/engine.h"
#include "tests/test_util.h"

static void check_request(moex_moe_plan *p, rng *r, int64_t n_tokens, int k, int n_expert, int64_t dim) {
    const int64_t n_pairs = n_tokens * k;
    int32_t *ids = malloc((size_t)n_pairs * sizeof *ids);
    float *gw = malloc((size_t)n_pairs * sizeof *gw);
    float *results = malloc((size_t)n_pairs * dim * sizeof *results);
    float *out = malloc((size_t)n_tokens * dim * sizeof *out);
    for (int64_t t = 0; t < n_tokens; t++)
        for (int j = 0; j < k; j++) { /* k distinct experts per token, as a router picks */
            int32_t e;
            bool dup;
            do {
                e = (int32_t)(rng_next(r) % (uint64_t)n_expert);
                dup = false;
                for (int i = 0; i < j; i++) dup |= ids[t * k + i] == e;
            } while (dup);
            ids[t * k + j] = e;
            gw[t * k + j] = (float)rng_uniform(r);
        }
    moex_moe_request req = {.layer = 0, .n_tokens = n_tokens, .n_used = k, .expert_ids = ids, .gate_weights = gw,
                            .out = out};
    CHECK(moex_moe_plan_build(p, &req, n_expert, NULL) == 0, "build %lld x %d", (long long)n_tokens, k);
    CHECK(p->n_pairs == n_pairs && p->group_first[p->n_groups] == n_pairs, "all pairs grouped");
    for (int g = 0; g < p->n_groups; g++) {
        CHECK(g == 0 || p->group_expert[g] > p->group_expert[g - 1], "groups by ascending expert");
        CHECK(p->group_first[g + 1] > p->group_first[g], "no empty group");
        for (int32_t i = p->group_first[g] + 1; i < p->group_first[g + 1]; i++)
            CHECK(p->rows[i] > p->rows[i - 1], "tokens in order within a group");
    }
    /* each pair's slot holds its token, gate and a group of its expert */
    for (int64_t i = 0; i < n_pairs; i++) {
        const int32_t s = p->slot_of_pair[i];
        int g = 0;
        while (p->group_first[g + 1] <= s) g++;
        CHECK(p->rows[s] == i / k && p->gates[s] == gw[i] && p->group_expert[g] == ids[i], "pair %lld", (long long)i);
    }
    for (int64_t i = 0; i < n_pairs * dim; i++) results[i] = rng_gauss(r);
    moex_moe_plan_combine(p, &req, results, dim);
    for (int64_t t = 0; t < n_tokens; t++)
        for (int64_t c = 0; c < dim; c++) {
            float want = results[(size_t)p->slot_of_pair[t * k] * dim + c];
            for (int j = 1; j < k; j++) want += results[(size_t)p->slot_of_pair[t * k + j] * dim + c];
            CHECK(out[t * dim + c] == want, "combine t %lld c %lld: the sum in slot order", (long long)t, (long long)c);
            if (out[t * dim + c] != want) goto done;
        }
done: { /* in token ranges (the hub's pool splits a prompt's batch so): the same bits */
        float *parts = malloc((size_t)n_tokens * (size_t)dim * sizeof *parts);
        req.out = parts;
        for (int64_t t0 = 0; t0 < n_tokens; t0 += 3)
            moex_moe_plan_combine_tokens(p, &req, results, dim, t0, t0 + 3 < n_tokens ? t0 + 3 : n_tokens);
        CHECK(memcmp(parts, out, (size_t)n_tokens * (size_t)dim * sizeof *parts) == 0, "combine in ranges of 3 tokens");
        req.out = out;
        free(parts);
    }
    ids[n_pairs / 2] = n_expert; /* a bad id: refused, named */
    moex_error err = {0};
    CHECK(moex_moe_plan_build(p, &req, n_expert, &err) != 0 && strstr(err.msg, "expert"), "bad id refused: %s", err.msg);
    ids[n_pairs / 2] = -1;
    CHECK(moex_moe_plan_build(p, &req, n_expert, NULL) != 0, "negative id refused");
    free(ids);
    free(gw);
    free(results);
    free(out);
}

int main(void) {
    rng r = test_rng("test_moe_plan");
    moex_moe_plan p = {0};
    check_request(&p, &r, 1, 8, 128, 16);     /* one decode token, Qwen3-30B-A3B's k and experts */
    check_request(&p, &r, 37, 4, 16, 8);      /* a prefill batch: many tokens per expert */
    check_request(&p, &r, 2, 2, 4, 4);        /* back to a smaller batch: buffers reused */
    check_request(&p, &r, 300, 1, 3, 2);
    moex_moe_plan_free(&p);
    if (g_failures) fprintf(stderr, "%d check(s) failed\n", g_failures);
    else printf("moe plan checks passed\n");
    return g_failures != 0;
}
