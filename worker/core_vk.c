/* The worker core on Vulkan: held experts stay resident in one device-local
 * allocation of equal slots, and a batch of DISPATCHes (tokens routed to one
 * expert each) runs in one submission of moex_vk_op_experts, where every
 * token row picks its dispatch's slot as its single expert, weighted by its
 * gate.
 *
 * Slot layout: gate at 0, up at off_up, down at off_down, slot_bytes apart,
 * sized for the model's largest expert matrices so that any expert fits any
 * slot; the kernels index slots as experts (expert_stride = slot_bytes).
 *
 * A batch keeps views of its dispatches' rows and converts them to f32
 * straight into the host-visible io buffer at run time: one pass over the
 * activations from the received message to the GPU's input.
 *
 * Numerics: activation rounding is on, so x is rounded to the weights' 8-bit
 * partner exactly as the CPU core (core.c) rounds it, and most token rows
 * agree with the CPU to ~3e-7. The GPU kernels sum the gate/up products in
 * f32 though (the CPU sums int8 products exactly), so h moves by some ulps
 * and, in a few percent of rows, one h value crosses a rounding step before
 * the down product: that row is then off by ~5e-3 (tests/test_worker_vk.c).
 * Like the CPU core: no sockets, no threads. */
#include <stdlib.h>
#include <string.h>

#include "worker/worker.h"

#define SLOT_ALIGN 256
#define OP_MAX_TOKENS 256   /* token rows per op: bounds the rounding buffer and the scratch */
#define OP_MAX_SLOTS 512    /* experts one op can index (the kernels' grouping arrays) */
#define IO_ALIGN 256

typedef struct vk_slot {
    int layer, expert;           /* -1 when free */
    moex_expert_weights shape;   /* types and shapes of the resident copy (data: the host copy) */
} vk_slot;

/* One moex_vk_op_experts: rows [r0, r0 + n), slots within [lo, hi]; each:
 * every row on one token's matrix-vector kernels (MOEX_VK_EACH), else the
 * kernels by row count (the prompt's tiles past 8 rows). */
typedef struct vk_op {
    int64_t r0, n;
    int lo, hi;
    bool each;
} vk_op;

/* Every row takes one token's kernels, however many rows its expert has in
 * the batch: a row's values are then the same bits in any batch, so a
 * sequence decoding beside another's prompt (or 15 others) gets the tokens it
 * gets alone (the API's continuous batching promises it). Each row streams
 * its expert's weights (from L2 when its neighbour did); on a GPU shared with
 * the hub this measured no slower than the prompt's tiles even for 512-token
 * prompts (docs/PERF.md). moex_worker_vk_create's each_rows = N takes the
 * tiles for an op of more than N rows an expert (0: always the kernels by row
 * count), to compare. */

/* A dispatch of the batch: its rows [row0, row0 + n) read from the view at
 * run time (values NULL: zero rows, for the warm-up). */
typedef struct vk_dispatch {
    int slot;
    int64_t row0, n;
    moex_proto_tensor_view v;
} vk_dispatch;

/* Offsets into the host-visible io buffer and the device-local act buffer (same layout). */
typedef struct io_plan {
    size_t x, gates, ids, y, total;
} io_plan;

struct moex_worker_vk {
    moex_vk *vk;
    int n_layers, n_experts, hidden;
    int64_t ff_max;
    size_t off_up, off_down, slot_bytes;
    int max_span;                /* slots one op may span: OP_MAX_SLOTS, fewer when 4 GiB comes first */
    moex_vk_buffer *pool;        /* capacity slots */
    int capacity, n_held, first_free;
    vk_slot *slots;
    int *slot_of;                /* n_layers x n_experts: slot, or -1 */
    /* the batch being built: its dispatches' views, converted into io at run time */
    vk_dispatch *disp;
    int n_disp, cap_disp;
    int64_t n_rows, cap_rows;
    int32_t *row_slot;
    vk_op *ops;
    int n_ops, cap_ops;
    /* device side of a batch, grown to the largest batch seen */
    moex_vk_cmd *cmd;
    moex_vk_buffer *io, *act, *scratch;
    int64_t cap_tokens;
    io_plan plan;
    double stage_s, gpu_s;       /* the last run's two parts */
    int each_rows;               /* MOEX_WORKER_VK_EACH_ALWAYS, or N (tests) */
};

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static size_t matrix_bytes(const moex_matrix *m) { return (size_t)m->rows * m->row_bytes; }

/* ---- creation: slot layout from the model's expert shapes ---- */

static int check_model(const moex_model *m, moex_error *err) {
    const moex_hparams *hp = &m->hp;
    if (!moex_hparams_is_moe(hp) || !m->layers)
        return moex_fail(err, "worker vulkan: the model has no experts");
    if (hp->n_embd % 32 || hp->n_ff_exp % 32)
        return moex_fail(err, "worker vulkan: hidden (%d) and expert FFN (%d) sizes must be multiples of 32", hp->n_embd,
                         hp->n_ff_exp);
    for (int l = 0; l < hp->n_layer; l++)
        for (int e = 0; e < hp->n_expert; e++) {
            const moex_expert_weights *w = &m->layers[l].experts[e];
            const moex_matrix *mm[3] = {&w->gate, &w->up, &w->down};
            for (int i = 0; i < 3; i++)
                if (!moex_vk_type_supported(mm[i]->type))
                    return moex_fail(err, "worker vulkan: expert (%d, %d) has type %s, which the GPU kernels do not read",
                                     l, e, moex_type_get(mm[i]->type)->name);
        }
    return 0;
}

static void plan_slots(moex_worker_vk *g, const moex_model *m) {
    size_t gate = 0, up = 0, down = 0;
    int64_t ff = 0;
    for (int l = 0; l < m->hp.n_layer; l++)
        for (int e = 0; e < m->hp.n_expert; e++) {
            const moex_expert_weights *w = &m->layers[l].experts[e];
            if (matrix_bytes(&w->gate) > gate) gate = matrix_bytes(&w->gate);
            if (matrix_bytes(&w->up) > up) up = matrix_bytes(&w->up);
            if (matrix_bytes(&w->down) > down) down = matrix_bytes(&w->down);
            if (w->gate.rows > ff) ff = w->gate.rows;
        }
    g->off_up = align_up(gate, SLOT_ALIGN);
    g->off_down = g->off_up + align_up(up, SLOT_ALIGN);
    g->slot_bytes = g->off_down + align_up(down, SLOT_ALIGN);
    g->ff_max = ff;
    const uint64_t span4g = (uint64_t)UINT32_MAX / g->slot_bytes;
    g->max_span = span4g < OP_MAX_SLOTS ? (int)span4g : OP_MAX_SLOTS;
}

/* Scratch for the largest op: OP_MAX_TOKENS rows over OP_MAX_SLOTS experts. */
static size_t scratch_bytes(const moex_worker_vk *g) {
    const moex_vk_experts e = {.gate = {.rows = g->ff_max, .cols = g->hidden},
                               .up = {.rows = g->ff_max, .cols = g->hidden},
                               .down = {.rows = g->hidden, .cols = g->ff_max},
                               .n_expert = OP_MAX_SLOTS};
    const size_t a = moex_vk_experts_scratch(&e, OP_MAX_TOKENS, 1), b = moex_vk_experts_scratch(&e, 1, 1);
    return a > b ? a : b;
}

moex_worker_vk *moex_worker_vk_create(const moex_model *m, const moex_vk_options *opt, int each_rows,
                                      moex_error *err) {
    if (check_model(m, err)) return NULL;
    const moex_hparams *hp = &m->hp;
    moex_worker_vk *g = calloc(1, sizeof *g);
    if (g) g->slot_of = malloc((size_t)hp->n_layer * (size_t)hp->n_expert * sizeof *g->slot_of);
    if (!g || !g->slot_of) {
        free(g);
        moex_fail(err, "worker vulkan: out of memory");
        return NULL;
    }
    for (size_t i = 0; i < (size_t)hp->n_layer * (size_t)hp->n_expert; i++) g->slot_of[i] = -1;
    g->n_layers = hp->n_layer;
    g->n_experts = hp->n_expert;
    g->hidden = hp->n_embd;
    g->each_rows = each_rows;
    plan_slots(g, m);
    if (g->max_span < 1) {
        moex_fail(err, "worker vulkan: an expert of %zu bytes is over the kernels' 4 GiB", g->slot_bytes);
        moex_worker_vk_free(g);
        return NULL;
    }
    const int64_t widest = g->ff_max > g->hidden ? g->ff_max : g->hidden;
    if (!(g->vk = moex_vk_create(opt, err)) ||
        moex_vk_set_activation_rounding(g->vk, (size_t)OP_MAX_TOKENS * (size_t)widest, err) ||
        !(g->cmd = moex_vk_cmd_create(g->vk, err)) ||
        !(g->scratch = moex_vk_buffer_create(g->vk, scratch_bytes(g), MOEX_VK_MEM_DEVICE, err))) {
        moex_worker_vk_free(g);
        return NULL;
    }
    return g;
}

void moex_worker_vk_free(moex_worker_vk *g) {
    if (!g) return;
    moex_vk_cmd_free(g->cmd);
    moex_vk_buffer_free(g->pool);
    moex_vk_buffer_free(g->io);
    moex_vk_buffer_free(g->act);
    moex_vk_buffer_free(g->scratch);
    moex_vk_free(g->vk);
    free(g->slots);
    free(g->slot_of);
    free(g->disp);
    free(g->row_slot);
    free(g->ops);
    free(g);
}

const char *moex_worker_vk_device_name(const moex_worker_vk *g) { return moex_vk_get_info(g->vk)->name; }
size_t moex_worker_vk_slot_bytes(const moex_worker_vk *g) { return g->slot_bytes; }
int moex_worker_vk_capacity(const moex_worker_vk *g) { return g->capacity; }
int moex_worker_vk_n_held(const moex_worker_vk *g) { return g->n_held; }

/* ---- slots ---- */

int moex_worker_vk_reserve(moex_worker_vk *g, int n_slots, moex_error *err) {
    if (n_slots <= g->capacity) return 0;
    vk_slot *slots = realloc(g->slots, (size_t)n_slots * sizeof *slots);
    if (!slots) return moex_fail(err, "worker vulkan: out of memory for %d slots", n_slots);
    g->slots = slots;
    moex_vk_buffer *pool = moex_vk_buffer_create(g->vk, (size_t)n_slots * g->slot_bytes, MOEX_VK_MEM_DEVICE, err);
    if (!pool) return -1;
    if (g->n_held) { /* growing keeps the resident experts: one copy on the GPU */
        if (moex_vk_cmd_begin(g->cmd, err)) goto fail;
        moex_vk_copy(g->cmd, pool, 0, g->pool, 0, (size_t)g->capacity * g->slot_bytes);
        if (moex_vk_cmd_run(g->cmd, err)) goto fail;
    }
    moex_vk_buffer_free(g->pool);
    g->pool = pool;
    for (int i = g->capacity; i < n_slots; i++) g->slots[i] = (vk_slot){.layer = -1, .expert = -1};
    g->capacity = n_slots;
    return 0;
fail:
    moex_vk_buffer_free(pool);
    return -1;
}

static bool in_range(const moex_worker_vk *g, int layer, int expert) {
    return layer >= 0 && layer < g->n_layers && expert >= 0 && expert < g->n_experts;
}

static int *slot_ref(const moex_worker_vk *g, int layer, int expert) {
    return &g->slot_of[(size_t)layer * (size_t)g->n_experts + (size_t)expert];
}

bool moex_worker_vk_holds(const moex_worker_vk *g, int layer, int expert) {
    return in_range(g, layer, expert) && *slot_ref(g, layer, expert) >= 0;
}

static int check_weights(const moex_worker_vk *g, const moex_expert_weights *w, moex_error *err) {
    const int64_t d = g->hidden, f = w->gate.rows;
    if (w->gate.cols != d || w->up.cols != d || w->up.rows != f || w->down.rows != d || w->down.cols != f || f <= 0 ||
        f % 32 || w->gate.type != w->up.type || !w->gate.data || !w->up.data || !w->down.data)
        return moex_fail(err, "expert weights do not fit hidden %lld (gate %lldx%lld, up %lldx%lld, down %lldx%lld)",
                         (long long)d, (long long)w->gate.rows, (long long)w->gate.cols, (long long)w->up.rows,
                         (long long)w->up.cols, (long long)w->down.rows, (long long)w->down.cols);
    if (matrix_bytes(&w->gate) > g->off_up || matrix_bytes(&w->up) > g->off_down - g->off_up ||
        matrix_bytes(&w->down) > g->slot_bytes - g->off_down)
        return moex_fail(err, "expert weights are larger than the model's experts the slots were sized for");
    if (!moex_vk_type_supported(w->gate.type) || !moex_vk_type_supported(w->down.type))
        return moex_fail(err, "the GPU kernels do not read type %s/%s", moex_type_get(w->gate.type)->name,
                         moex_type_get(w->down.type)->name);
    return 0;
}

static int upload_expert(moex_worker_vk *g, int slot, const moex_expert_weights *w, moex_error *err) {
    const size_t base = (size_t)slot * g->slot_bytes;
    if (moex_vk_upload(g->vk, g->pool, base, w->gate.data, matrix_bytes(&w->gate), err) ||
        moex_vk_upload(g->vk, g->pool, base + g->off_up, w->up.data, matrix_bytes(&w->up), err) ||
        moex_vk_upload(g->vk, g->pool, base + g->off_down, w->down.data, matrix_bytes(&w->down), err))
        return -1;
    return 0;
}

int moex_worker_vk_hold(moex_worker_vk *g, int layer, int expert, const moex_expert_weights *w, moex_error *err) {
    if (!in_range(g, layer, expert))
        return moex_fail(err, "expert (%d, %d) outside %d layers x %d experts", layer, expert, g->n_layers, g->n_experts);
    if (!w) return moex_fail(err, "expert (%d, %d): no weights", layer, expert);
    if (moex_worker_vk_holds(g, layer, expert)) return 0;
    if (check_weights(g, w, err)) return -1;
    int s = g->first_free;
    while (s < g->capacity && g->slots[s].layer >= 0) s++;
    if (s >= g->capacity)
        return moex_fail(err, "expert (%d, %d): all %d GPU slots are taken", layer, expert, g->capacity);
    if (upload_expert(g, s, w, err)) return -1;
    g->slots[s] = (vk_slot){.layer = layer, .expert = expert, .shape = *w};
    *slot_ref(g, layer, expert) = s;
    g->first_free = s + 1;
    g->n_held++;
    return 0;
}

void moex_worker_vk_drop(moex_worker_vk *g, int layer, int expert) {
    if (!moex_worker_vk_holds(g, layer, expert)) return;
    int *ref = slot_ref(g, layer, expert);
    g->slots[*ref] = (vk_slot){.layer = -1, .expert = -1};
    if (*ref < g->first_free) g->first_free = *ref;
    *ref = -1;
    g->n_held--;
}

/* ---- batches ---- */

void moex_worker_vk_batch_begin(moex_worker_vk *g) {
    g->n_disp = 0;
    g->n_rows = 0;
}

static int reserve_rows(moex_worker_vk *g, int64_t rows) {
    if (rows <= g->cap_rows) return 0;
    int64_t cap = g->cap_rows ? g->cap_rows : 64;
    while (cap < rows) cap *= 2;
    int32_t *rs = realloc(g->row_slot, (size_t)cap * sizeof *rs);
    if (!rs) return -1;
    g->row_slot = rs;
    g->cap_rows = cap;
    return 0;
}

static int check_dispatch(const moex_worker_vk *g, const moex_proto_msg *d, moex_error *err) {
    if (d->h.type != MOEX_MSG_DISPATCH) return moex_fail(err, "message type %u is not a DISPATCH", d->h.type);
    if (d->h.hidden != g->hidden)
        return moex_fail(err, "dispatch %u: hidden %u, the model's is %d", d->h.seq, d->h.hidden, g->hidden);
    if (d->h.n_tokens == 0 || d->u.tensor.n_tokens != d->h.n_tokens || !d->u.tensor.values || !d->u.tensor.gates)
        return moex_fail(err, "dispatch %u: no tokens or no gates", d->h.seq);
    if (!moex_worker_vk_holds(g, d->h.layer, d->h.expert))
        return moex_fail(err, "dispatch %u: expert (%u, %u) is not on this worker's GPU", d->h.seq, d->h.layer,
                         d->h.expert);
    return 0;
}

/* Appends n rows for slot, read from v at run time (NULL: zeros); returns the first row or -1. */
static int64_t add_rows(moex_worker_vk *g, int slot, int64_t n, const moex_proto_tensor_view *v) {
    const int64_t r0 = g->n_rows;
    if (g->n_disp == g->cap_disp) {
        const int cap = g->cap_disp ? 2 * g->cap_disp : 16;
        vk_dispatch *p = realloc(g->disp, (size_t)cap * sizeof *p);
        if (!p) return -1;
        g->disp = p;
        g->cap_disp = cap;
    }
    if (reserve_rows(g, r0 + n)) return -1;
    for (int64_t t = 0; t < n; t++) g->row_slot[r0 + t] = slot;
    g->disp[g->n_disp++] = (vk_dispatch){.slot = slot, .row0 = r0, .n = n, .v = v ? *v : (moex_proto_tensor_view){0}};
    g->n_rows = r0 + n;
    return r0;
}

int moex_worker_vk_batch_add(moex_worker_vk *g, const moex_proto_msg *dispatch, moex_error *err) {
    if (check_dispatch(g, dispatch, err)) return -1;
    const int64_t n = dispatch->u.tensor.n_tokens;
    if (add_rows(g, *slot_ref(g, dispatch->h.layer, dispatch->h.expert), n, &dispatch->u.tensor) < 0)
        return moex_fail(err, "dispatch %u: out of memory for %lld tokens", dispatch->h.seq, (long long)n);
    return 0;
}

/* Each dispatch's rows and gates as f32, straight into the mapped io buffer. */
static void write_inputs(moex_worker_vk *g) {
    char *io = moex_vk_buffer_map(g->io);
    float *x = (float *)(io + g->plan.x), *gates = (float *)(io + g->plan.gates);
    const int64_t d = g->hidden;
    for (int i = 0; i < g->n_disp; i++) {
        const vk_dispatch *dp = &g->disp[i];
        if (!dp->v.values) {
            memset(x + dp->row0 * d, 0, (size_t)(dp->n * d) * sizeof *x);
            memset(gates + dp->row0, 0, (size_t)dp->n * sizeof *gates);
            continue;
        }
        for (int64_t t = 0; t < dp->n; t++) {
            moex_proto_tensor_row_f32(&dp->v, (uint32_t)t, x + (dp->row0 + t) * d);
            gates[dp->row0 + t] = moex_proto_tensor_gate(&dp->v, (uint32_t)t);
        }
    }
}

/* Grows io (host-visible) and act (device-local) to the batch's rows (in
 * powers of two, so that a growing prefill does not reallocate every time). */
static int reserve_tokens(moex_worker_vk *g, int64_t rows_needed, moex_error *err) {
    if (rows_needed <= g->cap_tokens) return 0;
    int64_t n = 64;
    while (n < rows_needed) n *= 2;
    moex_vk_buffer_free(g->io);
    moex_vk_buffer_free(g->act);
    g->io = g->act = NULL;
    g->cap_tokens = 0;
    const size_t rows = (size_t)n, d = (size_t)g->hidden;
    io_plan p;
    p.x = 0;
    p.gates = align_up(p.x + rows * d * 4, IO_ALIGN);
    p.ids = align_up(p.gates + rows * 4, IO_ALIGN);
    p.y = align_up(p.ids + rows * 4, IO_ALIGN);
    p.total = p.y + rows * d * 4;
    if (!(g->io = moex_vk_buffer_create(g->vk, p.total, MOEX_VK_MEM_HOST, err)) ||
        !(g->act = moex_vk_buffer_create(g->vk, p.total, MOEX_VK_MEM_DEVICE, err)))
        return -1;
    if (!moex_vk_buffer_map(g->io)) return moex_fail(err, "worker vulkan: the host buffer is not mapped");
    g->plan = p;
    g->cap_tokens = n;
    return 0;
}

/* Whether two slots' experts run on the same kernels (types and shapes). */
static bool same_kernels(const vk_slot *a, const vk_slot *b) {
    return a->shape.gate.type == b->shape.gate.type && a->shape.down.type == b->shape.down.type &&
           a->shape.gate.rows == b->shape.gate.rows;
}

/* Whether an op over slots [lo, hi] may take slot s. */
static bool op_fits(const moex_worker_vk *g, int lo, int hi, int s) {
    const int nlo = s < lo ? s : lo, nhi = s > hi ? s : hi;
    return nhi - nlo < g->max_span && same_kernels(&g->slots[s], &g->slots[lo]);
}

/* Writes the ids of rows [r0, r0 + n), whose slots lie in [lo, hi], relative to lo. */
static void write_ids(moex_worker_vk *g, const vk_op *op) {
    int32_t *ids = (int32_t *)((char *)moex_vk_buffer_map(g->io) + g->plan.ids);
    for (int64_t r = op->r0; r < op->r0 + op->n; r++) ids[r] = g->row_slot[r] - op->lo;
}

static int grow_ops(moex_worker_vk *g) {
    const int cap = g->cap_ops ? 2 * g->cap_ops : 16;
    vk_op *p = realloc(g->ops, (size_t)cap * sizeof *p);
    if (!p) return -1;
    g->ops = p;
    g->cap_ops = cap;
    return 0;
}

/* Cuts the rows into ops (at most OP_MAX_TOKENS rows, slots within the
 * kernels' span, one weight type) and writes their ids. */
static int plan_ops(moex_worker_vk *g, moex_error *err) {
    g->n_ops = 0;
    for (int64_t r0 = 0; r0 < g->n_rows;) {
        int lo = g->row_slot[r0], hi = lo;
        int64_t r = r0 + 1;
        for (; r < g->n_rows && r - r0 < OP_MAX_TOKENS && op_fits(g, lo, hi, g->row_slot[r]); r++) {
            const int s = g->row_slot[r];
            if (s < lo) lo = s;
            if (s > hi) hi = s;
        }
        if (g->n_ops == g->cap_ops && grow_ops(g)) return moex_fail(err, "worker vulkan: out of memory");
        int experts = 1; /* a dispatch's rows are adjacent: count the slot changes */
        for (int64_t i = r0 + 1; i < r; i++) experts += g->row_slot[i] != g->row_slot[i - 1];
        g->ops[g->n_ops] = (vk_op){.r0 = r0, .n = r - r0, .lo = lo, .hi = hi,
                                   .each = g->each_rows < 0 || r - r0 <= (int64_t)g->each_rows * experts};
        write_ids(g, &g->ops[g->n_ops++]);
        r0 = r;
    }
    return 0;
}

/* One op: the experts' tensors start at slot lo, ids index from there. */
static int record_op(moex_worker_vk *g, const vk_op *op, moex_error *err) {
    const moex_expert_weights *w = &g->slots[op->lo].shape;
    const moex_vk_ptr base = moex_vk_buffer_ptr(g->pool) + (size_t)op->lo * g->slot_bytes,
                      act = moex_vk_buffer_ptr(g->act);
    const size_t stride = g->slot_bytes, d4 = (size_t)g->hidden * 4, r0 = (size_t)op->r0;
    const moex_vk_experts e = {
        .gate = {w->gate.type, w->gate.rows, w->gate.cols, w->gate.row_bytes, base, stride},
        .up = {w->up.type, w->up.rows, w->up.cols, w->up.row_bytes, base + g->off_up, stride},
        .down = {w->down.type, w->down.rows, w->down.cols, w->down.row_bytes, base + g->off_down, stride},
        .n_expert = op->hi - op->lo + 1};
    const moex_vk_ptr y = act + g->plan.y + r0 * d4;
    if (moex_vk_op_experts_pick(g->cmd, op->each ? MOEX_VK_EACH : MOEX_VK_BY_N, &e, act + g->plan.x + r0 * d4, op->n,
                                1, act + g->plan.ids + r0 * 4, act + g->plan.gates + r0 * 4, y, y,
                                moex_vk_buffer_ptr(g->scratch), err))
        return -1;
    moex_vk_barrier(g->cmd); /* the next op reuses the scratch and the rounding buffer */
    return 0;
}

/* Inputs in, y zeroed (each row's one expert adds into it), the ops, y out. */
static int record_batch(moex_worker_vk *g, moex_error *err) {
    const size_t rows = (size_t)g->n_rows, xb = rows * (size_t)g->hidden * 4;
    if (moex_vk_cmd_begin(g->cmd, err)) return -1;
    moex_vk_copy(g->cmd, g->act, g->plan.x, g->io, g->plan.x, xb);
    moex_vk_copy(g->cmd, g->act, g->plan.gates, g->io, g->plan.gates, rows * 4);
    moex_vk_copy(g->cmd, g->act, g->plan.ids, g->io, g->plan.ids, rows * 4);
    moex_vk_fill(g->cmd, g->act, g->plan.y, xb, 0);
    moex_vk_barrier(g->cmd);
    for (int i = 0; i < g->n_ops; i++)
        if (record_op(g, &g->ops[i], err)) return -1;
    moex_vk_copy(g->cmd, g->io, g->plan.y, g->act, g->plan.y, xb);
    return 0;
}

int moex_worker_vk_batch_run(moex_worker_vk *g, moex_error *err) {
    g->stage_s = g->gpu_s = 0;
    if (g->n_rows == 0) return 0;
    const double t0 = moex_time_s();
    if (reserve_tokens(g, g->n_rows, err) || plan_ops(g, err)) return -1;
    write_inputs(g);
    if (record_batch(g, err)) {
        moex_vk_cmd_end(g->cmd, NULL); /* leaves the command buffer ready for the next batch */
        return -1;
    }
    const double t1 = moex_time_s();
    const int rc = moex_vk_cmd_run(g->cmd, err);
    g->stage_s = t1 - t0;
    g->gpu_s = moex_time_s() - t1;
    return rc;
}

void moex_worker_vk_batch_times(const moex_worker_vk *g, double *stage_s, double *gpu_s) {
    *stage_s = g->stage_s;
    *gpu_s = g->gpu_s;
}

int moex_worker_vk_batch_count(const moex_worker_vk *g) { return g->n_disp; }

float *moex_worker_vk_batch_values(const moex_worker_vk *g, int i) {
    if (i < 0 || i >= g->n_disp || !g->io) return NULL;
    return (float *)((char *)moex_vk_buffer_map(g->io) + g->plan.y) + g->disp[i].row0 * g->hidden;
}

/* Rows of batch buffers made at the warm-up: a prompt's layer brings a worker
 * a few hundred rows at a time, and growing the buffers then costs that
 * layer a reallocation (~10 ms on an H200) on top of its kernels. */
#define WARM_ROWS 1024

/* Records one op of n rows on slot s, picked as each (or by row count)
 * without running it: between moex_vk_warm_begin and moex_vk_warm_end this
 * only notes the pipelines it would use. */
static int note_op(moex_worker_vk *g, int s, int64_t n, bool each, moex_error *err) {
    moex_worker_vk_batch_begin(g);
    if (add_rows(g, s, n, NULL) < 0 || (g->cap_ops == 0 && grow_ops(g)))
        return moex_fail(err, "worker vulkan: out of memory");
    g->ops[0] = (vk_op){.r0 = 0, .n = n, .lo = s, .hi = s, .each = each};
    g->n_ops = 1;
    write_ids(g, &g->ops[0]);
    const int rc = record_batch(g, err);
    moex_vk_cmd_end(g->cmd, NULL); /* never submitted; the next batch records afresh */
    return rc;
}

/* Every pipeline an op on slot s's kernels can pick: one token's kernels
 * for each row (the same for any row count), and where MOEX_WORKER_EACH_ROWS lets ops take the kernels by
 * row count, those at the sizes where moex_vk_op_experts switches kernels
 * (one row, a few, the batch shapes, the tiles, up to an op's OP_MAX_TOKENS). */
static int note_slot(moex_worker_vk *g, int s, moex_error *err) {
    int64_t sizes[8];
    const int n = g->each_rows < 0 ? 0 : moex_vk_warm_batch_sizes(OP_MAX_TOKENS, sizes);
    for (int i = 0; i < n; i++)
        if (note_op(g, s, sizes[i], false, err)) return -1;
    return note_op(g, s, 1, true, err);
}

/* One 1-row and one 16-row batch on slot s, run: the driver's first submissions. */
static int run_slot(moex_worker_vk *g, int s, moex_error *err) {
    const int64_t sizes[2] = {1, 16};
    for (int i = 0; i < 2; i++) {
        moex_worker_vk_batch_begin(g);
        if (add_rows(g, s, sizes[i], NULL) < 0) return moex_fail(err, "worker vulkan: out of memory");
        if (moex_worker_vk_batch_run(g, err)) return -1;
    }
    return 0;
}

/* A held slot of each kernel set (types and shapes); returns how many. */
static int kernel_sets(const moex_worker_vk *g, int first[16]) {
    int n = 0;
    for (int s = 0; s < g->capacity && n < 16; s++) {
        if (g->slots[s].layer < 0) continue;
        bool seen = false;
        for (int i = 0; i < n && !seen; i++) seen = same_kernels(&g->slots[first[i]], &g->slots[s]);
        if (!seen) first[n++] = s;
    }
    return n;
}

/* Pipelines are compiled together up front (in parallel, moex_vk_warm_end)
 * rather than when a batch first picks one: on a GPU shared by several
 * processes one compilation held a layer's answer for 50-190 ms. */
int moex_worker_vk_warm_up(moex_worker_vk *g, moex_error *err) {
    int first[16];
    const int n = kernel_sets(g, first);
    if (n == 0) return 0;
    if (reserve_tokens(g, WARM_ROWS, err)) return -1;
    if (reserve_rows(g, WARM_ROWS)) return moex_fail(err, "worker vulkan: out of memory");
    moex_vk_warm_begin(g->vk);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) rc = note_slot(g, first[i], err);
    const int rc_end = moex_vk_warm_end(g->vk, rc ? NULL : err);
    for (int i = 0; i < n && !rc && !rc_end; i++) rc = run_slot(g, first[i], err);
    moex_worker_vk_batch_begin(g);
    return rc || rc_end ? -1 : 0;
}

int moex_worker_vk_pipelines(const moex_worker_vk *g) { return moex_vk_pipeline_count(g->vk); }

int moex_worker_vk_run(moex_worker_vk *g, const moex_proto_msg *dispatch, float **values, moex_error *err) {
    moex_worker_vk_batch_begin(g);
    if (moex_worker_vk_batch_add(g, dispatch, err) || moex_worker_vk_batch_run(g, err)) return -1;
    *values = moex_worker_vk_batch_values(g, 0);
    return 0;
}
