/* Per-token discrete-event simulation of MoEx decoding (eqs. 10-12 with the
 * protocol of §4): for each of L layers the hub computes, sends each of k
 * experts to h replicas (one-way network rtt/2), workers run the FFN one
 * dispatch at a time, the first result per expert wins and the other copies
 * are cancelled (the cancel also travels rtt/2 and frees the worker), an
 * expert without a result after the timeout is re-dispatched to another
 * replica, and workers may die (their work never returns). Tokens run one
 * after another. Events sit in a binary heap ordered by (time, sequence). */
#include "sim/sim.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/heap.h"

#define MAX_REDISPATCH 64 /* per expert; beyond this the expert is unservable */
#define WINDOW 256        /* adaptive hedging: recent expert latencies kept */
#define WINDOW_REFRESH 128

void moex_token_config_default(moex_token_config *c) {
    memset(c, 0, sizeof *c);
    c->layers = 48;
    c->experts = 128;
    c->k = 8;
    c->workers = 16;
    c->replicas = 2;
    c->h = 1;
    c->h_max = 2;
    c->tail_ratio = 2.0;
    c->hub_ms = 1.5;
    c->rtt_ms = 0.5;
    c->ffn_median = 0.7;
    c->queueing = 1;
    c->select = MOEX_SELECT_RANDOM;
    c->timeout_ms = 500;
    c->unhealthy_after = 3;
    c->tokens = 200;
    c->seed = 1;
}

int moex_token_config_check(const moex_token_config *c, moex_error *err) {
    if (c->layers < 1) return moex_fail(err, "layers must be >= 1 (got %d)", c->layers);
    if (c->experts < 1) return moex_fail(err, "experts must be >= 1 (got %d)", c->experts);
    if (c->k < 1 || c->k > c->experts)
        return moex_fail(err, "k must be in [1, experts=%d] (got %d)", c->experts, c->k);
    if (c->workers < 1) return moex_fail(err, "workers must be >= 1 (got %d)", c->workers);
    if (c->replicas < 1 || c->replicas > c->workers)
        return moex_fail(err, "replicas must be in [1, workers=%d] (got %d)", c->workers, c->replicas);
    if (c->h < 1 || c->h > c->replicas)
        return moex_fail(err, "h must be in [1, replicas=%d] (got %d)", c->replicas, c->h);
    if (c->adaptive && (c->h_max < c->h || c->h_max > c->replicas))
        return moex_fail(err, "h_max must be in [h=%d, replicas=%d] (got %d)", c->h, c->replicas, c->h_max);
    if (c->adaptive && !(c->tail_ratio > 1))
        return moex_fail(err, "tail ratio must be > 1 (got %g)", c->tail_ratio);
    if (c->messages && !c->queueing)
        return moex_fail(err, "--messages models workers that compute one batch at a time: it needs queueing");
    if (!(c->hub_ms >= 0) || !isfinite(c->hub_ms)) return moex_fail(err, "hub time must be >= 0 (got %g)", c->hub_ms);
    if (!(c->rtt_ms >= 0) || !isfinite(c->rtt_ms)) return moex_fail(err, "RTT must be >= 0 (got %g)", c->rtt_ms);
    if (!(c->rtt_sigma >= 0) || c->rtt_sigma > 5) return moex_fail(err, "RTT sigma must be in [0, 5] (got %g)", c->rtt_sigma);
    if (!c->trace && (!(c->ffn_median > 0) || !isfinite(c->ffn_median)))
        return moex_fail(err, "FFN median must be > 0 (got %g)", c->ffn_median);
    if (!(c->ffn_sigma >= 0) || c->ffn_sigma > 5) return moex_fail(err, "FFN sigma must be in [0, 5] (got %g)", c->ffn_sigma);
    if (c->trace && c->trace_len < 1) return moex_fail(err, "the FFN trace is empty");
    for (int i = 0; c->trace && i < c->trace_len; i++)
        if (!(c->trace[i] >= 0) || !isfinite(c->trace[i]))
            return moex_fail(err, "FFN trace entry %d is not a time >= 0 (%g)", i, c->trace[i]);
    for (int w = 0; c->speed && w < c->workers; w++)
        if (!(c->speed[w] > 0) || !isfinite(c->speed[w]))
            return moex_fail(err, "worker %d speed multiplier must be > 0 (got %g)", w, c->speed[w]);
    if (c->unhealthy_after < 1) return moex_fail(err, "unhealthy_after must be >= 1 (got %d)", c->unhealthy_after);
    for (int i = 0; i < c->n_fails; i++) {
        if (c->fails[i].worker < 0 || c->fails[i].worker >= c->workers)
            return moex_fail(err, "failure %d names worker %d, but there are %d workers", i, c->fails[i].worker, c->workers);
        if (!(c->fails[i].at_ms >= 0)) return moex_fail(err, "failure %d time must be >= 0", i);
    }
    if (c->placement) {
        size_t n = (size_t)c->layers * c->experts * c->replicas;
        for (size_t i = 0; i < n; i++)
            if (c->placement[i] < 0 || c->placement[i] >= c->workers)
                return moex_fail(err, "placement entry %zu names worker %d, but there are %d workers", i, c->placement[i], c->workers);
    }
    if (c->routes && c->route_tokens < 1) return moex_fail(err, "the routing trace is empty");
    for (size_t i = 0; c->routes && i < (size_t)c->route_tokens * c->layers * c->k; i++)
        if (c->routes[i] < 0 || c->routes[i] >= c->experts)
            return moex_fail(err, "routing trace entry %zu names expert %d, but there are %d", i, c->routes[i], c->experts);
    if (c->tokens < 1) return moex_fail(err, "tokens must be >= 1 (got %d)", c->tokens);
    return 0;
}

/* ---- Event queue ---- */

enum { EV_HUB_DONE, EV_ARRIVE, EV_FINISH, EV_RESULT, EV_CANCEL, EV_TIMEOUT, EV_FAIL };

typedef struct event {
    double t;
    uint64_t seq; /* ties: first scheduled, first served (deterministic) */
    int kind;
    int id;       /* job, slot or worker, by kind */
    uint32_t gen; /* the generation the event was scheduled for: stale if changed */
} event;

static bool ev_before(const event *a, const event *b) { return a->t < b->t || (a->t == b->t && a->seq < b->seq); }

/* event_queue, event_queue_push, _pop and _free (common/heap.h). */
MOEX_HEAP_DEFINE(event_queue, event, ev_before)

/* ---- Simulation state ---- */

enum { J_FREE, J_TRAVEL, J_QUEUED, J_RUNNING, J_HELD, J_RETURNING };

typedef struct job {
    uint32_t gen; /* bumped whenever the job is freed: old events go stale */
    int state;
    int worker, slot;
    uint64_t layer_seq;
    int cancelled; /* cancel arrived while the dispatch was still travelling */
    uint64_t msg;  /* --messages: the message it travelled in (one per worker and layer) */
    double sent_at, arrived_at, started_at, service;
    int next; /* worker FIFO link, or free-list link */
} job;

typedef struct worker {
    int alive, healthy, timeouts_in_row;
    double speed, estimate; /* median multiplier; EWMA of observed round trips */
    int running;            /* job id, -1 when idle (queueing mode only) */
    int qhead, qtail;       /* FIFO of waiting jobs */
    /* --messages: this layer's message to the worker (its id and one-way
     * delay), the batch being computed and its finished jobs held back */
    uint64_t layer_seq, msg, running_msg;
    double msg_delay;
    int held_head;
} worker;

typedef struct dispatched {
    int job;
    uint32_t gen;
    int worker;
    int timed_out; /* already counted against its worker */
} dispatched;

/* One active expert of the current layer and every dispatch made for it. */
typedef struct slot {
    int expert, done;
    uint32_t timer;
    int n, cap;
    dispatched *d;
} slot;

typedef struct sim {
    const moex_token_config *c;
    moex_rng rng;
    event_queue q;
    uint64_t event_seq; /* events scheduled so far: the next one's tie-breaker */
    job *jobs;
    int n_jobs, free_job;
    worker *w;
    int *placement; /* owned copy or drawn table [L][E][r] */
    int *expert_perm, *cand;
    slot *slots;
    int token, layer, h_now, slots_done;
    uint64_t layer_seq;
    uint32_t timer_gen;
    uint64_t msg_seq;
    double token_start, now;
    double window[WINDOW];
    int win_n, win_pos, win_new;
    double *per_token;
    /* accounting */
    double busy, used_work, queue_wait, h_sum;
    uint64_t started, layers_run;
    moex_token_result *r;
} sim;

static double one_way(sim *s) { return moex_rng_lognormal(&s->rng, 0.5 * s->c->rtt_ms, s->c->rtt_sigma); }

static double ffn_time(sim *s, int w) {
    const moex_token_config *c = s->c;
    double base = c->trace ? c->trace[moex_rng_below(&s->rng, (uint32_t)c->trace_len)]
                           : moex_rng_lognormal(&s->rng, c->ffn_median, c->ffn_sigma);
    return base * s->w[w].speed;
}

static int push(sim *s, double t, int kind, int id, uint32_t gen, moex_error *err) {
    const event e = {.t = t, .seq = s->event_seq++, .kind = kind, .id = id, .gen = gen};
    if (event_queue_push(&s->q, e)) return moex_fail(err, "out of memory for the event queue");
    return 0;
}

static int job_alloc(sim *s, moex_error *err) {
    if (s->free_job < 0) {
        int n = s->n_jobs ? 2 * s->n_jobs : 256;
        job *j = realloc(s->jobs, (size_t)n * sizeof *j);
        if (!j) return moex_fail(err, "out of memory for jobs");
        for (int i = s->n_jobs; i < n; i++) j[i] = (job){.gen = 0, .state = J_FREE, .next = i + 1 < n ? i + 1 : -1};
        s->jobs = j;
        s->free_job = s->n_jobs;
        s->n_jobs = n;
    }
    int id = s->free_job;
    s->free_job = s->jobs[id].next;
    return id;
}

static void job_free(sim *s, int id) {
    job *j = &s->jobs[id];
    j->gen++;
    j->state = J_FREE;
    j->next = s->free_job;
    s->free_job = id;
}

static int job_live(const sim *s, int id, uint32_t gen) { return s->jobs[id].gen == gen && s->jobs[id].state != J_FREE; }

/* ---- Placement and replica choice ---- */

static const int *replicas_of(const sim *s, int layer, int expert) {
    return s->placement + ((size_t)layer * s->c->experts + expert) * s->c->replicas;
}

/* r distinct random workers per (layer, expert): what a consistent-hash ring
 * approximates. Drawn from its own stream so it only depends on the seed. */
static int draw_placement(sim *s, moex_error *err) {
    const moex_token_config *c = s->c;
    size_t n = (size_t)c->layers * c->experts * c->replicas;
    s->placement = malloc(n * sizeof *s->placement);
    int *perm = malloc((size_t)c->workers * sizeof *perm);
    if (!s->placement || !perm) {
        free(perm);
        return moex_fail(err, "out of memory for the placement table");
    }
    if (c->placement) {
        memcpy(s->placement, c->placement, n * sizeof *s->placement);
        free(perm);
        return 0;
    }
    moex_rng prng;
    moex_rng_seed(&prng, c->seed ^ 0x706c6163656d656eULL);
    for (int w = 0; w < c->workers; w++) perm[w] = w;
    for (size_t base = 0; base < n; base += c->replicas)
        for (int j = 0; j < c->replicas; j++) {
            int pick = j + (int)moex_rng_below(&prng, (uint32_t)(c->workers - j));
            int t = perm[j];
            perm[j] = perm[pick];
            perm[pick] = t;
            s->placement[base + j] = perm[j];
        }
    free(perm);
    return 0;
}

static void shuffle(sim *s, int *v, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)moex_rng_below(&s->rng, (uint32_t)(i + 1));
        int t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

/* Orders the candidate workers best first: healthy before unhealthy, then by
 * policy (random, or lowest latency estimate with random tie-break). */
static void rank_candidates(sim *s, int *v, int n) {
    shuffle(s, v, n);
    for (int i = 1; i < n; i++) {
        int x = v[i], j = i;
        while (j > 0) {
            const worker *a = &s->w[v[j - 1]], *b = &s->w[x];
            int worse = a->healthy < b->healthy ||
                        (a->healthy == b->healthy && s->c->select == MOEX_SELECT_FASTEST && a->estimate > b->estimate);
            if (!worse) break;
            v[j] = v[j - 1];
            j--;
        }
        v[j] = x;
    }
}

static int used_by_slot(const slot *sl, int w) {
    for (int i = 0; i < sl->n; i++)
        if (sl->d[i].worker == w) return 1;
    return 0;
}

/* ---- Actions ---- */

static int send_job(sim *s, int slot_id, int w, moex_error *err) {
    slot *sl = &s->slots[slot_id];
    if (sl->n >= sl->cap)
        return moex_fail(err, "expert %d of layer %d could not be served after %d dispatches: every replica failed",
                         sl->expert, s->layer, sl->n);
    int id = job_alloc(s, err);
    if (id < 0) return -1;
    job *j = &s->jobs[id];
    j->state = J_TRAVEL;
    j->worker = w;
    j->slot = slot_id;
    j->layer_seq = s->layer_seq;
    j->cancelled = 0;
    j->sent_at = s->now;
    j->next = -1;
    sl->d[sl->n++] = (dispatched){id, j->gen, w, 0};
    s->r->dispatches++;
    double delay;
    if (s->c->messages) { /* every dispatch of this layer to w travels in one message */
        worker *wk = &s->w[w];
        if (wk->layer_seq != s->layer_seq || wk->msg == 0) {
            wk->layer_seq = s->layer_seq;
            wk->msg = ++s->msg_seq;
            wk->msg_delay = one_way(s);
        }
        j->msg = wk->msg;
        delay = wk->msg_delay;
    } else {
        delay = one_way(s);
    }
    return push(s, s->now + delay, EV_ARRIVE, id, j->gen, err);
}

static int arm_timer(sim *s, int slot_id, moex_error *err) {
    if (s->c->timeout_ms <= 0) return 0;
    s->slots[slot_id].timer = ++s->timer_gen;
    return push(s, s->now + s->c->timeout_ms, EV_TIMEOUT, slot_id, s->timer_gen, err);
}

/* Adaptive hedging: keep hedging more while the observed expert latency tail
 * ratio p99/p50 is above the threshold, hedge less once it is well below. */
static void adapt_h(sim *s) {
    const moex_token_config *c = s->c;
    if (!c->adaptive || s->win_n < WINDOW || s->win_new < WINDOW_REFRESH) return;
    double tmp[WINDOW];
    memcpy(tmp, s->window, sizeof tmp);
    double p50 = moex_quantile(tmp, WINDOW, 0.50), p99 = moex_quantile(tmp, WINDOW, 0.99);
    double ratio = p50 > 0 ? p99 / p50 : 1.0;
    if (ratio > c->tail_ratio && s->h_now < c->h_max) s->h_now++, s->win_new = 0;
    else if (ratio < 1.0 + 0.5 * (c->tail_ratio - 1.0) && s->h_now > 1) s->h_now--, s->win_new = 0;
}

static void pick_experts(sim *s) {
    int E = s->c->experts;
    if (s->c->routes) { /* replay the measured choice of this token and layer */
        const moex_token_config *c = s->c;
        const int *ids = c->routes + ((size_t)(s->r->tokens_done % c->route_tokens) * c->layers + s->layer) * c->k;
        memcpy(s->expert_perm, ids, (size_t)c->k * sizeof *ids);
        return;
    }
    for (int i = 0; i < s->c->k; i++) {
        int j = i + (int)moex_rng_below(&s->rng, (uint32_t)(E - i));
        int t = s->expert_perm[i];
        s->expert_perm[i] = s->expert_perm[j];
        s->expert_perm[j] = t;
    }
}

/* Healthy workers outside the replica set take over when no replica is left
 * (the hub re-assigns the expert, §5.3). */
static int fallback_worker(sim *s, const slot *sl) {
    int W = s->c->workers, start = (int)moex_rng_below(&s->rng, (uint32_t)W);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < W; i++) {
            int w = (start + i) % W;
            if ((pass == 1 || s->w[w].healthy) && !used_by_slot(sl, w)) return w;
        }
    return start; /* every worker already tried: retry one */
}

static int dispatch_layer(sim *s, moex_error *err) {
    const moex_token_config *c = s->c;
    adapt_h(s);
    s->layer_seq++;
    s->slots_done = 0;
    s->h_sum += s->h_now;
    s->layers_run++;
    pick_experts(s);
    for (int i = 0; i < c->k; i++) {
        slot *sl = &s->slots[i];
        sl->expert = s->expert_perm[i];
        sl->done = 0;
        sl->n = 0;
        memcpy(s->cand, replicas_of(s, s->layer, sl->expert), (size_t)c->replicas * sizeof *s->cand);
        rank_candidates(s, s->cand, c->replicas);
        int healthy = 0;
        for (int j = 0; j < c->replicas; j++) healthy += s->w[s->cand[j]].healthy;
        if (healthy == 0) {
            s->r->reassigned++;
            if (send_job(s, i, fallback_worker(s, sl), err)) return -1;
        }
        for (int j = 0; j < s->h_now && j < healthy; j++)
            if (send_job(s, i, s->cand[j], err)) return -1;
        if (arm_timer(s, i, err)) return -1;
    }
    return 0;
}

static int start_layer(sim *s, moex_error *err) {
    return push(s, s->now + s->c->hub_ms, EV_HUB_DONE, 0, 0, err);
}

static int start_job(sim *s, int id, moex_error *err) {
    job *j = &s->jobs[id];
    j->state = J_RUNNING;
    j->started_at = s->now;
    j->service = ffn_time(s, j->worker);
    s->queue_wait += s->now - j->arrived_at;
    s->started++;
    if (s->c->queueing) s->w[j->worker].running = id;
    if (s->c->messages) s->w[j->worker].running_msg = j->msg;
    return push(s, s->now + j->service, EV_FINISH, id, j->gen, err);
}

static int start_next_queued(sim *s, int w, moex_error *err) {
    worker *wk = &s->w[w];
    wk->running = -1;
    if (wk->qhead < 0) return 0;
    int id = wk->qhead;
    wk->qhead = s->jobs[id].next;
    if (wk->qhead < 0) wk->qtail = -1;
    return start_job(s, id, err);
}

static void unlink_queued(sim *s, int w, int id) {
    worker *wk = &s->w[w];
    int prev = -1;
    for (int cur = wk->qhead; cur >= 0; prev = cur, cur = s->jobs[cur].next) {
        if (cur != id) continue;
        if (prev < 0) wk->qhead = s->jobs[cur].next;
        else s->jobs[prev].next = s->jobs[cur].next;
        if (wk->qtail == id) wk->qtail = prev;
        return;
    }
}

static void record_latency(sim *s, double ms) {
    s->window[s->win_pos] = ms;
    s->win_pos = (s->win_pos + 1) % WINDOW;
    if (s->win_n < WINDOW) s->win_n++;
    s->win_new++;
}

static int finish_layer(sim *s, moex_error *err) {
    if (++s->layer < s->c->layers) return start_layer(s, err);
    double lat = s->now - s->token_start;
    s->per_token[s->token] = lat;
    s->r->tokens_done++;
    s->layer = 0;
    s->token_start = s->now;
    if (++s->token < s->c->tokens) return start_layer(s, err);
    return 0;
}

/* ---- Event handlers ---- */

static int on_arrive(sim *s, int id, moex_error *err) {
    job *j = &s->jobs[id];
    worker *wk = &s->w[j->worker];
    j->arrived_at = s->now;
    if (!wk->alive) {
        s->r->lost++;
        job_free(s, id);
        return 0;
    }
    if (j->cancelled) { /* the cancel overtook the dispatch (network jitter) */
        job_free(s, id);
        return 0;
    }
    if (s->c->queueing && wk->running >= 0) {
        j->state = J_QUEUED;
        j->next = -1;
        if (wk->qtail >= 0) s->jobs[wk->qtail].next = id;
        else wk->qhead = id;
        wk->qtail = id;
        return 0;
    }
    return start_job(s, id, err);
}

/* --messages: the batch ended; its results travel back together. */
static int send_batch_results(sim *s, worker *wk, int last, moex_error *err) {
    const double at = s->now + one_way(s);
    for (int id = wk->held_head, next; id >= 0; id = next) {
        next = s->jobs[id].next;
        s->jobs[id].state = J_RETURNING;
        if (push(s, at, EV_RESULT, id, s->jobs[id].gen, err)) return -1;
    }
    wk->held_head = -1;
    s->jobs[last].state = J_RETURNING;
    return push(s, at, EV_RESULT, last, s->jobs[last].gen, err);
}

static int on_finish(sim *s, int id, moex_error *err) {
    job *j = &s->jobs[id];
    s->busy += j->service;
    if (s->c->messages) {
        worker *wk = &s->w[j->worker];
        const int next = wk->qhead;
        if (next >= 0 && s->jobs[next].msg == j->msg) { /* the batch goes on: hold the result */
            j->state = J_HELD;
            j->next = wk->held_head;
            wk->held_head = id;
        } else if (send_batch_results(s, wk, id, err)) {
            return -1;
        }
        return start_next_queued(s, j->worker, err);
    }
    j->state = J_RETURNING;
    if (push(s, s->now + one_way(s), EV_RESULT, id, j->gen, err)) return -1;
    return s->c->queueing ? start_next_queued(s, j->worker, err) : 0;
}

static int cancel_others(sim *s, slot *sl, int winner, moex_error *err) {
    for (int i = 0; i < sl->n; i++) {
        dispatched *d = &sl->d[i];
        if (d->job == winner || !job_live(s, d->job, d->gen)) continue;
        if (s->jobs[d->job].state == J_RETURNING || s->jobs[d->job].state == J_HELD) continue; /* computed */
        if (push(s, s->now + one_way(s), EV_CANCEL, d->job, d->gen, err)) return -1;
    }
    return 0;
}

static int on_result(sim *s, int id, moex_error *err) {
    job *j = &s->jobs[id];
    worker *wk = &s->w[j->worker];
    double rtt = s->now - j->sent_at;
    wk->timeouts_in_row = 0;
    wk->healthy = 1;
    wk->estimate = wk->estimate > 0 ? 0.8 * wk->estimate + 0.2 * rtt : rtt;
    slot *sl = &s->slots[j->slot];
    int wins = j->layer_seq == s->layer_seq && !sl->done;
    double service = j->service;
    job_free(s, id);
    if (!wins) return 0;
    record_latency(s, rtt);
    s->used_work += service;
    sl->done = 1;
    if (cancel_others(s, sl, id, err)) return -1;
    if (++s->slots_done < s->c->k) return 0;
    return finish_layer(s, err);
}

static int on_cancel(sim *s, int id, moex_error *err) {
    job *j = &s->jobs[id];
    switch (j->state) {
    case J_TRAVEL:
        j->cancelled = 1;
        s->r->cancelled++;
        return 0;
    case J_QUEUED:
        if (s->c->messages && j->msg == s->w[j->worker].running_msg && s->w[j->worker].running >= 0)
            return 0; /* part of the batch being computed: it cannot be stopped */
        unlink_queued(s, j->worker, id);
        s->r->cancelled++;
        job_free(s, id);
        return 0;
    case J_RUNNING: {
        if (s->c->messages) return 0; /* a batch that started runs to its end */
        int w = j->worker;
        s->busy += s->now - j->started_at;
        s->r->cancelled++;
        job_free(s, id);
        return s->c->queueing ? start_next_queued(s, w, err) : 0;
    }
    default:
        return 0;
    }
}

static int on_timeout(sim *s, int slot_id, uint32_t gen, moex_error *err) {
    slot *sl = &s->slots[slot_id];
    if (sl->timer != gen || sl->done) return 0;
    s->r->timeouts++;
    /* No dispatch of this expert has answered (or it would be done). */
    for (int i = 0; i < sl->n; i++) {
        if (sl->d[i].timed_out) continue;
        sl->d[i].timed_out = 1;
        worker *wk = &s->w[sl->d[i].worker];
        if (++wk->timeouts_in_row >= s->c->unhealthy_after) wk->healthy = 0;
    }
    const moex_token_config *c = s->c;
    memcpy(s->cand, replicas_of(s, s->layer, sl->expert), (size_t)c->replicas * sizeof *s->cand);
    rank_candidates(s, s->cand, c->replicas);
    int target = -1;
    for (int j = 0; j < c->replicas && target < 0; j++)
        if (s->w[s->cand[j]].healthy && !used_by_slot(sl, s->cand[j])) target = s->cand[j];
    if (target < 0) {
        target = fallback_worker(s, sl);
        s->r->reassigned++;
    }
    if (send_job(s, slot_id, target, err)) return -1;
    return arm_timer(s, slot_id, err);
}

static void on_fail(sim *s, int w) {
    worker *wk = &s->w[w];
    if (!wk->alive) return;
    wk->alive = 0;
    for (int id = wk->qhead; id >= 0;) {
        int next = s->jobs[id].next;
        s->r->lost++;
        job_free(s, id);
        id = next;
    }
    wk->qhead = wk->qtail = -1;
    for (int id = wk->held_head; id >= 0;) { /* --messages: a batch's finished, unsent results */
        int next = s->jobs[id].next;
        s->r->lost++;
        job_free(s, id);
        id = next;
    }
    wk->held_head = -1;
    /* A running job (either mode) dies with the worker. */
    for (int id = 0; id < s->n_jobs; id++)
        if (s->jobs[id].state == J_RUNNING && s->jobs[id].worker == w) {
            s->busy += s->now - s->jobs[id].started_at;
            s->r->lost++;
            job_free(s, id);
        }
    wk->running = -1;
}

static int handle(sim *s, const event *e, moex_error *err) {
    s->now = e->t;
    switch (e->kind) {
    case EV_HUB_DONE: return dispatch_layer(s, err);
    case EV_TIMEOUT: return on_timeout(s, e->id, e->gen, err);
    case EV_FAIL: on_fail(s, e->id); return 0;
    default: break;
    }
    if (!job_live(s, e->id, e->gen)) return 0; /* cancelled, lost or already handled */
    switch (e->kind) {
    case EV_ARRIVE: return on_arrive(s, e->id, err);
    case EV_FINISH: return on_finish(s, e->id, err);
    case EV_RESULT: return on_result(s, e->id, err);
    case EV_CANCEL: return on_cancel(s, e->id, err);
    }
    return 0;
}

/* ---- Driver ---- */

static int sim_init(sim *s, const moex_token_config *c, moex_token_result *r, double *per_token, moex_error *err) {
    memset(s, 0, sizeof *s);
    s->c = c;
    s->r = r;
    s->free_job = -1;
    s->h_now = c->h;
    moex_rng_seed(&s->rng, c->seed);
    s->w = calloc((size_t)c->workers, sizeof *s->w);
    s->expert_perm = malloc((size_t)c->experts * sizeof *s->expert_perm);
    s->cand = malloc((size_t)c->replicas * sizeof *s->cand);
    s->slots = calloc((size_t)c->k, sizeof *s->slots);
    s->per_token = per_token ? per_token : malloc((size_t)c->tokens * sizeof *s->per_token);
    if (!s->w || !s->expert_perm || !s->cand || !s->slots || !s->per_token)
        return moex_fail(err, "out of memory for the token simulation");
    for (int i = 0; i < c->k; i++) {
        s->slots[i].cap = c->replicas + MAX_REDISPATCH;
        s->slots[i].d = malloc((size_t)s->slots[i].cap * sizeof *s->slots[i].d);
        if (!s->slots[i].d) return moex_fail(err, "out of memory for the token simulation");
    }
    for (int e = 0; e < c->experts; e++) s->expert_perm[e] = e;
    for (int w = 0; w < c->workers; w++)
        s->w[w] = (worker){.alive = 1, .healthy = 1, .speed = c->speed ? c->speed[w] : 1.0,
                           .running = -1, .qhead = -1, .qtail = -1, .held_head = -1};
    if (draw_placement(s, err)) return -1;
    for (int i = 0; i < c->n_fails; i++)
        if (push(s, c->fails[i].at_ms, EV_FAIL, c->fails[i].worker, 0, err)) return -1;
    return 0;
}

static void sim_free(sim *s, double *per_token) {
    event_queue_free(&s->q);
    free(s->jobs);
    free(s->w);
    free(s->placement);
    free(s->expert_perm);
    free(s->cand);
    for (int i = 0; s->slots && i < s->c->k; i++) free(s->slots[i].d);
    free(s->slots);
    if (s->per_token != per_token) free(s->per_token);
}

static void summarize(sim *s) {
    moex_token_result *r = s->r;
    int n = r->tokens_done;
    double *tmp = malloc((size_t)n * sizeof *tmp);
    r->mean_ms = moex_mean(s->per_token, (size_t)n);
    r->min_ms = r->max_ms = s->per_token[0];
    for (int i = 0; i < n; i++) {
        if (s->per_token[i] < r->min_ms) r->min_ms = s->per_token[i];
        if (s->per_token[i] > r->max_ms) r->max_ms = s->per_token[i];
    }
    if (tmp) {
        memcpy(tmp, s->per_token, (size_t)n * sizeof *tmp);
        r->p50_ms = moex_quantile(tmp, (size_t)n, 0.50);
        r->p99_ms = moex_quantile(tmp, (size_t)n, 0.99);
        free(tmp);
    }
    r->tokens_per_s = r->mean_ms > 0 ? 1000.0 / r->mean_ms : INFINITY;
    r->mean_h = s->layers_run ? s->h_sum / (double)s->layers_run : 0;
    r->queue_wait_ms = s->started ? s->queue_wait / (double)s->started : 0;
    r->wasted_work = s->busy > 0 ? 1.0 - s->used_work / s->busy : 0;
}

int moex_token_simulate(const moex_token_config *c, moex_token_result *out, double *per_token, moex_error *err) {
    if (moex_token_config_check(c, err)) return -1;
    memset(out, 0, sizeof *out);
    sim s;
    int rc = sim_init(&s, c, out, per_token, err);
    if (!rc) rc = start_layer(&s, err);
    while (!rc && s.q.n > 0 && out->tokens_done < c->tokens) {
        event e = event_queue_pop(&s.q);
        out->events++;
        rc = handle(&s, &e, err);
    }
    if (!rc && out->tokens_done < c->tokens)
        rc = moex_fail(err, "simulation stalled after %d of %d tokens", out->tokens_done, c->tokens);
    if (!rc) summarize(&s);
    sim_free(&s, per_token);
    return rc;
}
