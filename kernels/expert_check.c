/* What an honest expert result is (kernels.h, "checking results computed
 * elsewhere"; docs/PROTOCOL.md, "Verification").
 *
 * Every backend (the CPU's portable, AVX2 and VNNI paths, WASM, Vulkan,
 * WebGPU) computes one token's expert the same way:
 *
 *   xa = Q(x)                      x rounded to the gate/up weights' partner type (Q8_K, Q8_0, Q8_1; f32: none)
 *   g = Wg xa, u = Wu xa           sums of products in f32, in the backend's own order
 *   h = silu(g) * u                its own exp and division
 *   ha = Q(h)                      rounded to the down weights' partner type
 *   y = gate * (Wd ha)
 *
 * The quantizers are the same everywhere (same scales, correctly rounded),
 * so two honest backends differ only by float rounding in the sums and in
 * silu, and by what that rounding does to Q: an element whose scaled value
 * lies within the rounding noise of a half step may round either way (a
 * near tie), and that one step then reaches y through one column of Wd.
 *
 * So the hub evaluates the chain exactly (double, on the dequantized
 * weights) and bounds, element by element, how far an honest f32 result can
 * be from it: the float-rounding bound of each sum, carried through silu;
 * one step wherever Q's input lies close enough to a half step that the
 * carried error could cross it, and the step's effect through the weights.
 * A result outside that bound is wrong for every backend. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_internal.h"

/* Relative rounding bound of a dot product of n f32 terms summed in any
 * order, against the sum of the terms' magnitudes. The CPU sums whole
 * blocks as integers (n / 32 float additions); a GPU may add every term in
 * f32 (n additions), whose errors add up like a random walk: 8 standard
 * deviations of it (sqrt(n) half-ulps each), plus the blocks' worst case,
 * plus the few roundings of each term's scale products. */
static double dot_eps(int64_t n) { return ldexp(8.0 * sqrt((double)n) + (double)n / 32 + 16.0, -24); }

/* silu(g) * u in f32: exp may be off by 3 + 2|g| ulp (Vulkan's and WGSL's
 * precision), the division 2.5 ulp, the products one each. */
static double silu_eps(double g) { return ldexp(16.0 + 4.0 * fabs(g), -24); }

/* A scaled value within this many steps of a half step may round either
 * way: backends divide by the scale or multiply by its reciprocal, each
 * within an ulp of a value below 128 (2^-17), and round halves away from
 * zero or to even. Four times that. */
#define TIE_STEPS 0x1p-15

static double silu(double g) { return g / (1.0 + exp(-g)); }

/* ---- one token's chain, with its bound ---- */

struct moex_expert_check {
    const void *key[3];          /* the weights whose dequantized rows are held */
    float *wg, *wu, *wd;         /* [n_ff x hidden], [n_ff x hidden], [hidden x n_ff] */
    int64_t cap_w;               /* floats of each */
    double *x, *xa, *dx;         /* [hidden]: x, as the products see it, how far an honest backend's may be */
    double *g, *u, *eg, *eu;     /* [n_ff]: the sums and their bounds */
    double *h, *dh, *ha, *dha;   /* [n_ff]: silu(g) u and its bound; as down sees it, and that bound */
    int64_t cap_v;
};

moex_expert_check *moex_expert_check_create(void) { return calloc(1, sizeof(moex_expert_check)); }

void moex_expert_check_free(moex_expert_check *c) {
    if (!c) return;
    free(c->wg);
    free(c->wu);
    free(c->wd);
    double **v[] = {&c->x, &c->xa, &c->dx, &c->g, &c->u, &c->eg, &c->eu, &c->h, &c->dh, &c->ha, &c->dha};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) free(*v[i]);
    free(c);
}

static int dequantize_matrix(const moex_matrix *m, float *out, moex_error *err) {
    for (int64_t r = 0; r < m->rows; r++)
        if (moex_dequantize_row(m->type, (const uint8_t *)m->data + r * m->row_bytes, out + r * m->cols, m->cols, err))
            return -1;
    return 0;
}

static int reserve(moex_expert_check *c, int64_t n_w, int64_t n_v, moex_error *err) {
    if (n_w > c->cap_w) {
        float **w[3] = {&c->wg, &c->wu, &c->wd};
        for (int i = 0; i < 3; i++) {
            free(*w[i]);
            *w[i] = malloc((size_t)n_w * sizeof(float));
        }
        c->cap_w = c->wg && c->wu && c->wd ? n_w : 0;
        memset(c->key, 0, sizeof c->key);
    }
    if (n_v > c->cap_v) {
        double **v[] = {&c->x, &c->xa, &c->dx, &c->g, &c->u, &c->eg, &c->eu, &c->h, &c->dh, &c->ha, &c->dha};
        bool ok = true;
        for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
            free(*v[i]);
            ok &= (*v[i] = malloc((size_t)n_v * sizeof(double))) != NULL;
        }
        c->cap_v = ok ? n_v : 0;
    }
    if (!c->cap_w || !c->cap_v) return moex_fail(err, "out of memory for an expert check");
    return 0;
}

/* The weights' dequantized rows, kept while the same expert is checked. */
static int load_weights(moex_expert_check *c, const moex_expert_weights *w, moex_error *err) {
    const void *key[3] = {w->gate.data, w->up.data, w->down.data};
    if (!memcmp(key, c->key, sizeof key)) return 0;
    memset(c->key, 0, sizeof c->key);
    if (dequantize_matrix(&w->gate, c->wg, err) || dequantize_matrix(&w->up, c->wu, err) ||
        dequantize_matrix(&w->down, c->wd, err))
        return -1;
    memcpy(c->key, key, sizeof key);
    return 0;
}

/* The interval of a block's scale d = amax / 127 over amax in [lo, hi]
 * (rounded as f32, widened by an ulp either way). */
static void scale_range(double amax_lo, double amax_hi, double *d_lo, double *d_hi) {
    *d_lo = nextafterf((float)(amax_lo / 127.0), 0.0f);
    *d_hi = nextafterf((float)(amax_hi / 127.0), FLT_MAX);
    if (*d_lo < 0) *d_lo = 0;
}

/* The f16 value a Q8_0 / Q8_1 block stores its scale as (round to nearest). */
static double f16_scale(double d) { return moex_f16_to_f32(moex_f32_to_f16((float)d)); }

/* Q(v) for one block of n values known within err[i] of v[i] (err NULL:
 * exactly): out[i] the reference's dequantized value, dout[i] how far an
 * honest backend's may be from it (its rounding may land on any level the
 * interval reaches, with any scale the block's extreme allows). at: the
 * activation type. */
static void quantize_block(int at, const double *v, const double *err, int64_t n, double *out, double *dout) {
    double amax = 0, lo = 0, hi = 0;
    for (int64_t i = 0; i < n; i++) {
        const double a = fabs(v[i]), e = err ? err[i] : 0;
        if (a > amax) amax = a;
        if (a - e > lo) lo = a - e;
        if (a + e > hi) hi = a + e;
    }
    const bool k_quant = at == MOEX_TYPE_Q8_K;
    /* the scale as the reference computes it, and the range honest ones can have */
    const double d = (float)(amax / 127.0);
    double d_lo = d, d_hi = d; /* an exact input's scale is every backend's (a correctly rounded division) */
    if (err) scale_range(lo, hi, &d_lo, &d_hi);
    const double s = k_quant ? d : f16_scale(d), s_lo = k_quant ? d_lo : f16_scale(d_lo),
                 s_hi = k_quant ? d_hi : f16_scale(d_hi);
    for (int64_t i = 0; i < n; i++) {
        if (d == 0 && d_hi == 0) { /* an all-zero block: every backend gives zeros */
            out[i] = dout[i] = 0;
            continue;
        }
        const double e = err ? err[i] : 0;
        const double q = d > 0 ? nearbyint(v[i] / d) : 0;
        out[i] = q * s;
        /* the levels an honest rounding can reach: v within e, the scale within [d_lo, d_hi] */
        const double vlo = v[i] - e, vhi = v[i] + e, dl = fmax(d_lo, DBL_MIN);
        const double tlo = vlo >= 0 ? vlo / d_hi : vlo / dl, thi = vhi >= 0 ? vhi / dl : vhi / d_hi;
        double qlo = fmax(-127, nearbyint(tlo - TIE_STEPS)), qhi = fmin(127, nearbyint(thi + TIE_STEPS));
        if (d_lo == 0) qlo = fmin(qlo, 0), qhi = fmax(qhi, 0); /* a zero scale gives zeros */
        const double c[4] = {qlo * s_lo, qlo * s_hi, qhi * s_lo, qhi * s_hi};
        double worst = 0;
        for (int k = 0; k < 4; k++) worst = fmax(worst, fabs(c[k] - out[i]));
        dout[i] = worst;
    }
}

/* x (f32) or h (with its error bound) as the products read it, block by block. */
static void quantize_row(int at, const double *v, const double *err, int64_t n, double *out, double *dout) {
    if (at == MOEX_TYPE_F32) {
        for (int64_t i = 0; i < n; i++) out[i] = v[i], dout[i] = err ? err[i] : 0;
        return;
    }
    const int64_t bs = moex_type_get(at)->block_elems;
    for (int64_t b = 0; b < n; b += bs) quantize_block(at, v + b, err ? err + b : NULL, bs, out + b, dout + b);
}

/* x's near ties: an exact input whose value may round to either of two
 * levels. Each is a branch of its own (the chain is evaluated for each way
 * it rounds) as long as there are few; past that, their step joins the
 * bound like h's. Returns how many there are; idx/alt: up to max of them. */
static int x_ties(const double *xa, const double *dx, int64_t n, int64_t *idx, double *alt, int max) {
    int m = 0;
    for (int64_t j = 0; j < n; j++) {
        if (dx[j] == 0) continue;
        if (m < max) idx[m] = j, alt[m] = xa[j];
        m++;
    }
    return m;
}

/* A Q8_1 block also stores s = f16(sum(q) d), which a Q4_1 / Q5_1 dot
 * multiplies by the weights' block minimum m instead of summing m over the
 * values: the dot is off from sum(w a) by m (s - sum(a)), a half f16 ulp of
 * the block's sum at most, with |m| at most the block's largest |w|. */
static double q8_1_extra(int at, const float *w, const double *a, const double *da, int64_t n) {
    if (at != MOEX_TYPE_Q8_1) return 0;
    double extra = 0;
    for (int64_t b = 0; b < n; b += 32) {
        double wmax = 0, sum = 0, dsum = 0;
        for (int64_t i = b; i < b + 32; i++) wmax = fmax(wmax, fabs(w[i])), sum += a[i], dsum += da[i];
        extra += wmax * (fabs(sum) + dsum) * 0x1p-11 * (1 + 0x1p-10);
    }
    return extra;
}

/* sum w[i] a[i] exactly enough (double), and the bound on an honest f32
 * backend's value: its rounding, plus each a[i]'s own uncertainty. */
static double dot_bounded(const float *w, const double *a, const double *da, int64_t n, int at, double *bound) {
    double s = 0, mag = 0, flip = 0;
    for (int64_t i = 0; i < n; i++) {
        const double p = (double)w[i] * a[i];
        s += p;
        mag += fabs(p);
        flip += fabs((double)w[i]) * da[i];
    }
    *bound = dot_eps(n) * (mag + flip) + flip + q8_1_extra(at, w, a, da, n);
    return s;
}

/* The chain from xa (with dx, its uncertainty) to y: ref and tol, one token. */
static void chain(moex_expert_check *c, const moex_expert_weights *w, int ax, int ah, float gate, double *ref,
                  double *tol) {
    const int64_t d = w->gate.cols, f = w->gate.rows;
    /* g, u and their bounds; h = silu(g) u and how far an honest h may be */
    for (int64_t k = 0; k < f; k++) {
        c->g[k] = dot_bounded(c->wg + k * d, c->xa, c->dx, d, ax, &c->eg[k]);
        c->u[k] = dot_bounded(c->wu + k * d, c->xa, c->dx, d, ax, &c->eu[k]);
        const double g = c->g[k], u = c->u[k], eg = c->eg[k], eu = c->eu[k], sg = silu(g);
        c->h[k] = sg * u;
        /* silu' is within [-0.1, 1.1]: g off by eg moves silu(g) by at most 1.1 eg */
        const double sg_max = fabs(sg) + 1.1 * eg, u_max = fabs(u) + eu;
        c->dh[k] = 1.1 * eg * u_max + fabs(sg) * eu + silu_eps(fabs(g) + eg) * sg_max * u_max;
    }
    quantize_row(ah, c->h, c->dh, f, c->ha, c->dha);

    /* y = gate * Wd ha */
    const double gt = gate;
    for (int64_t i = 0; i < d; i++) {
        double b;
        const double y = dot_bounded(c->wd + i * f, c->ha, c->dha, f, ah, &b);
        ref[i] = gt * y;
        /* the product by the gate, in f32; then 1/64 more than derived: the derivation's own slack (a step
         * that flipped lands at its full bound by construction, with only the float terms to spare) */
        tol[i] = (fabs(gt) * b + fabs(ref[i]) * 0x1p-23) * (1 + 0x1p-6);
    }
}

int moex_expert_check_token(moex_expert_check *c, const moex_expert_weights *w, const float *x, float gate, double *ref,
                            double *tol, moex_error *err) {
    const int64_t d = w->gate.cols, f = w->gate.rows;
    if (w->up.rows != f || w->up.cols != d || w->down.rows != d || w->down.cols != f)
        return moex_fail(err, "expert check: shapes disagree");
    const int ax = moex_vec_dot_type(w->gate.type), ah = moex_vec_dot_type(w->down.type);
    if (ax < 0 || ah < 0 || moex_vec_dot_type(w->up.type) != ax)
        return moex_fail(err, "expert check: weight types %d/%d/%d are not checked", w->gate.type, w->up.type,
                         w->down.type);
    if (reserve(c, d * f, d > f ? d : f, err) || load_weights(c, w, err)) return -1;

    /* xa = Q(x): an exact input, so an honest xa differs only at a near tie, where it takes the other level */
    for (int64_t j = 0; j < d; j++) c->x[j] = x[j];
    quantize_row(ax, c->x, NULL, d, c->xa, c->dx);
    enum { MAX_TIES = 2 }; /* 2^MAX_TIES = MOEX_EXPERT_CHECK_VARIANTS */
    int64_t idx[MAX_TIES];
    double base[MAX_TIES], other[MAX_TIES];
    const int m = x_ties(c->xa, c->dx, d, idx, base, MAX_TIES);
    if (m > MAX_TIES) { /* too many to branch on: their steps join the bound */
        chain(c, w, ax, ah, gate, ref, tol);
        return 1;
    }
    for (int k = 0; k < m; k++) {
        const double step = c->dx[idx[k]], v = c->x[idx[k]];
        other[k] = v > base[k] ? base[k] + step : base[k] - step; /* the level on the tie's other side */
        c->dx[idx[k]] = 0;
    }
    const int n_var = 1 << m;
    for (int var = 0; var < n_var; var++) {
        for (int k = 0; k < m; k++) c->xa[idx[k]] = var >> k & 1 ? other[k] : base[k];
        chain(c, w, ax, ah, gate, ref + var * d, tol + var * d);
    }
    return n_var;
}

/* ---- the largest result an expert can give ---- */

static double max_row_l1(const moex_matrix *m, float *row, moex_error *err, int *rc) {
    double best = 0;
    for (int64_t r = 0; r < m->rows && !*rc; r++) {
        if (moex_dequantize_row(m->type, (const uint8_t *)m->data + r * m->row_bytes, row, m->cols, err)) {
            *rc = -1;
            break;
        }
        double s = 0;
        for (int64_t i = 0; i < m->cols; i++) s += fabsf(row[i]);
        best = fmax(best, s);
    }
    return best;
}

int moex_expert_norms_of(const moex_expert_weights *w, moex_expert_norms *out, moex_error *err) {
    const int64_t cols = w->gate.cols > w->down.cols ? w->gate.cols : w->down.cols;
    float *row = malloc((size_t)cols * sizeof *row);
    if (!row) return moex_fail(err, "out of memory for an expert's norms");
    int rc = 0;
    out->gate = max_row_l1(&w->gate, row, err, &rc);
    out->up = max_row_l1(&w->up, row, err, &rc);
    out->down = max_row_l1(&w->down, row, err, &rc);
    free(row);
    return rc;
}

/* |g|, |u| <= norm * max|xa| with max|xa| <= max|x| (1 + 2^-7) (half a step
 * of 127, the f16 scale's rounding); |silu(g)| <= |g| + 0.28; the same again
 * for ha and down; 1 % on top for every sum's rounding. */
double moex_expert_result_max(const moex_expert_norms *n, double x_absmax, double gate) {
    const double xa = x_absmax * 1.01, g = n->gate * xa * 1.01, u = n->up * xa * 1.01;
    const double h = (g + 0.2785) * u * 1.01 * 1.01;
    return fabs(gate) * n->down * h * 1.01 * 1.01;
}
