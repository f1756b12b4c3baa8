/* Token sampling: greedy (temp 0), temperature, top-k, top-p, min-p, seeded.
 * Part of the common module's API (common/common.h). */
#ifndef MOEX_SAMPLER_H
#define MOEX_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

typedef struct moex_sampler_params {
    float temp;     /* <= 0: greedy argmax */
    int top_k;      /* <= 0: off */
    float top_p;    /* >= 1: off */
    float min_p;    /* <= 0: off */
    uint64_t seed;
} moex_sampler_params;

typedef struct moex_sampler moex_sampler;

moex_sampler *moex_sampler_create(const moex_sampler_params *p, int32_t n_vocab);
void moex_sampler_free(moex_sampler *s);
/* Picks the next token from raw logits (not modified). */
int32_t moex_sampler_sample(moex_sampler *s, const float *logits);
/* True when every pick is the argmax of the row (temperature 0), whatever
 * the logits: an engine may then pick on its device instead. */
bool moex_sampler_is_greedy(const moex_sampler *s);

/* For speculative decoding's acceptance rule (engine/speculate.c): */
/* The distribution moex_sampler_sample draws from for these logits, as n_vocab
 * probabilities (0 outside the filters' candidates; greedy: 1 at the argmax). */
void moex_sampler_dist(moex_sampler *s, const float *logits, float *probs);
/* A uniform number in [0, 1) from the sampler's generator. */
double moex_sampler_uniform(moex_sampler *s);
/* Draws an id in proportion to n_vocab non-negative weights (any total);
 * -1 when every weight is 0. */
int32_t moex_sampler_draw(moex_sampler *s, const float *weights);

#endif
