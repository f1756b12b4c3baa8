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

/* What a request may change in the logits before sampling, in llama.cpp's
 * order: its repeat penalty over the last tokens (a recent token's positive
 * logit divided by it, a negative one multiplied), OpenAI's presence and
 * frequency penalties over the tokens generated so far (a token seen c
 * times: logit - presence - c x frequency), and a bias per token id (added). */
typedef struct moex_logit_rules {
    float presence, frequency;   /* 0: off */
    float repeat;                /* 1: off */
    const int32_t *bias_id;      /* n_bias ids and their biases */
    const float *bias;
    int n_bias;
} moex_logit_rules;

/* Applies rules to logits[0..n_vocab) in place. seen: the generated tokens
 * (for presence and frequency), recent: the last tokens (for repeat; may
 * overlap seen). counts: n_vocab ints of scratch, zero on entry and on return. */
void moex_logits_apply(float *logits, int32_t n_vocab, const moex_logit_rules *r, const int32_t *seen, int64_t n_seen,
                       const int32_t *recent, int64_t n_recent, int32_t *counts);

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
