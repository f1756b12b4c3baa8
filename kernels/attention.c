/* Causal GQA attention over an f32 KV cache.
 *
 * Flash-attention style online softmax over tiles of ATTN_TILE positions:
 * no score buffer the size of the context, so decode allocates nothing. A
 * tile's scores live on the stack; each head's running output is rescaled
 * once per tile when its maximum grows. A head's result depends only on its
 * inputs, never on which thread ran it or how heads were blocked, so any
 * thread count gives bit-identical output. */
#include "kernels/kernels.h"

#include <math.h>

enum {
    ATTN_TILE = 32,               /* positions per step: a tile of K or V rows stays in L1 */
    ATTN_MAX_HEAD_DIM = 512,      /* bounds the per-head stack state */
    ATTN_MAX_BLOCK = 8,           /* q heads processed together: <= 33 KiB of stack */
};

/* The two tile-level primitives attention spends its time in. Rows are
 * cache rows `stride` floats apart. */
typedef struct attn_vec_ops {
    /* s[r] = scale * dot(q, k_r) for r < nt */
    void (*scores)(float *s, const float *q, const float *k, int64_t stride, int nt, int d, float scale);
    /* acc = acc * carry + sum_r w[r] * v_r for r < nt */
    void (*accumulate)(float *acc, float carry, const float *w, const float *v, int64_t stride, int nt, int d);
} attn_vec_ops;

static float dot_portable(const float *a, const float *b, int n) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
    float s = 0.0f;
    for (; i < n; i++) s += a[i] * b[i];
    for (int k = 0; k < 8; k++) s += acc[k];
    return s;
}

static void scores_portable(float *s, const float *q, const float *k, int64_t stride, int nt, int d, float scale) {
    for (int r = 0; r < nt; r++) s[r] = scale * dot_portable(q, k + r * stride, d);
}

static void accumulate_portable(float *acc, float carry, const float *w, const float *v, int64_t stride, int nt,
                                int d) {
    for (int i = 0; i < d; i++) acc[i] *= carry;
    for (int r = 0; r < nt; r++) {
        const float *vr = v + r * stride;
        for (int i = 0; i < d; i++) acc[i] += w[r] * vr[i];
    }
}

static const attn_vec_ops vec_portable = {scores_portable, accumulate_portable};

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ATTN_HAVE_AVX2 1

#define AVX2 __attribute__((target("avx2,fma")))

AVX2 static float hsum_avx2(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* Four rows per pass: each q chunk is loaded once and the four FMA chains
 * are independent, which hides FMA latency. */
AVX2 static void scores_avx2(float *s, const float *q, const float *k, int64_t stride, int nt, int d, float scale) {
    int r = 0;
    for (; r + 4 <= nt; r += 4) {
        const float *k0 = k + r * stride, *k1 = k0 + stride, *k2 = k1 + stride, *k3 = k2 + stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int i = 0;
        for (; i + 8 <= d; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + i), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + i), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + i), a3);
        }
        float t0 = hsum_avx2(a0), t1 = hsum_avx2(a1), t2 = hsum_avx2(a2), t3 = hsum_avx2(a3);
        for (; i < d; i++) {
            t0 += q[i] * k0[i], t1 += q[i] * k1[i];
            t2 += q[i] * k2[i], t3 += q[i] * k3[i];
        }
        s[r] = scale * t0, s[r + 1] = scale * t1, s[r + 2] = scale * t2, s[r + 3] = scale * t3;
    }
    for (; r < nt; r++) {
        const float *kr = k + r * stride;
        __m256 a = _mm256_setzero_ps();
        int i = 0;
        for (; i + 8 <= d; i += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(kr + i), a);
        float t = hsum_avx2(a);
        for (; i < d; i++) t += q[i] * kr[i];
        s[r] = scale * t;
    }
}

/* Folds four V rows per pass over acc, so acc is loaded and stored a
 * quarter as often; weights are broadcast once per pass. The carry is
 * applied with the first pass. */
AVX2 static void accumulate_avx2(float *acc, float carry, const float *w, const float *v, int64_t stride, int nt,
                                 int d) {
    float c = carry;
    int r = 0;
    for (; r + 4 <= nt; r += 4, c = 1.0f) {
        const float *v0 = v + r * stride, *v1 = v0 + stride, *v2 = v1 + stride, *v3 = v2 + stride;
        const __m256 vc = _mm256_set1_ps(c), w0 = _mm256_set1_ps(w[r]), w1 = _mm256_set1_ps(w[r + 1]),
                     w2 = _mm256_set1_ps(w[r + 2]), w3 = _mm256_set1_ps(w[r + 3]);
        int i = 0;
        for (; i + 8 <= d; i += 8) {
            __m256 a = _mm256_mul_ps(_mm256_loadu_ps(acc + i), vc);
            a = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0 + i), a);
            a = _mm256_fmadd_ps(w1, _mm256_loadu_ps(v1 + i), a);
            a = _mm256_fmadd_ps(w2, _mm256_loadu_ps(v2 + i), a);
            a = _mm256_fmadd_ps(w3, _mm256_loadu_ps(v3 + i), a);
            _mm256_storeu_ps(acc + i, a);
        }
        for (; i < d; i++) acc[i] = acc[i] * c + w[r] * v0[i] + w[r + 1] * v1[i] + w[r + 2] * v2[i] + w[r + 3] * v3[i];
    }
    for (; r < nt; r++, c = 1.0f) {
        const float *vr = v + r * stride;
        const __m256 vc = _mm256_set1_ps(c), wr = _mm256_set1_ps(w[r]);
        int i = 0;
        for (; i + 8 <= d; i += 8)
            _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(wr, _mm256_loadu_ps(vr + i), _mm256_mul_ps(_mm256_loadu_ps(acc + i), vc)));
        for (; i < d; i++) acc[i] = acc[i] * c + w[r] * vr[i];
    }
}

#undef AVX2

static const attn_vec_ops vec_avx2 = {scores_avx2, accumulate_avx2};
#endif

static const attn_vec_ops *pick_vec_ops(void) {
#ifdef ATTN_HAVE_AVX2
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return &vec_avx2;
#endif
    return &vec_portable;
}

/* A job unit is (token, kv head, block of the q heads sharing that kv head):
 * each tile of cached K and V rows is used by all heads of the block while
 * it is hot in L1, instead of every q head streaming the whole cache from
 * memory again (an 8x traffic cut for GQA 8). Blocks are made smaller only
 * when there would be fewer units than threads. Per head the arithmetic is
 * the same whatever the blocking, so results never depend on it. */
typedef struct attn_job {
    const float *q, *k, *v;
    float *out;
    int64_t n, pos0;
    int n_head, n_head_kv, head_dim;
    int group;         /* q heads per kv head */
    int block;         /* q heads per unit; divides group */
    float scale;
    const attn_vec_ops *ops;
} attn_job;

/* Online softmax state of one q head: acc = sum_j exp(s_j - m) v_j,
 * l = sum_j exp(s_j - m). */
typedef struct head_state {
    float m, l;
    float q[ATTN_MAX_HEAD_DIM];
    float acc[ATTN_MAX_HEAD_DIM];
    float s[ATTN_TILE];
} head_state;

/* Folds cache positions [j0, j0 + nt) into the states of heads. The tile
 * of K (then V) rows is reused from L1 by every head of the block. */
static void attend_tile(const attn_job *a, head_state *hs, int nh, int kvh, int64_t j0, int nt) {
    const int d = a->head_dim;
    const int64_t stride = (int64_t)a->n_head_kv * d;   /* floats per cache position */
    const float *k = a->k + j0 * stride + (int64_t)kvh * d;
    const float *v = a->v + j0 * stride + (int64_t)kvh * d;
    for (int h = 0; h < nh; h++) {
        head_state *st = &hs[h];
        a->ops->scores(st->s, st->q, k, stride, nt, d, a->scale);
        float tile_max = -INFINITY;
        for (int r = 0; r < nt; r++) tile_max = st->s[r] > tile_max ? st->s[r] : tile_max;
        float carry = 1.0f;   /* rescales what was accumulated under the old max */
        if (tile_max > st->m) {
            carry = st->l > 0.0f ? expf(st->m - tile_max) : 0.0f;
            st->l *= carry;
            st->m = tile_max;
        }
        for (int r = 0; r < nt; r++) {
            st->s[r] = expf(st->s[r] - st->m);   /* score -> weight, in place */
            st->l += st->s[r];
        }
        a->ops->accumulate(st->acc, carry, st->s, v, stride, nt, d);
    }
}

/* Query token t, q heads h0 .. h0+nh-1 (all mapped to kv head kvh). */
static void attend_block(const attn_job *a, int64_t t, int kvh, int h0, int nh) {
    const int d = a->head_dim;
    head_state hs[ATTN_MAX_BLOCK];
    for (int h = 0; h < nh; h++) {
        /* Copied so that out may alias q. */
        const float *q = a->q + (t * a->n_head + h0 + h) * (int64_t)d;
        for (int i = 0; i < d; i++) {
            hs[h].q[i] = q[i];
            hs[h].acc[i] = 0.0f;
        }
        hs[h].m = -INFINITY;
        hs[h].l = 0.0f;
    }
    const int64_t n_ctx = a->pos0 + t + 1;   /* causal: positions 0 .. pos0+t */
    for (int64_t j0 = 0; j0 < n_ctx; j0 += ATTN_TILE) {
        const int nt = (int)(n_ctx - j0 < ATTN_TILE ? n_ctx - j0 : ATTN_TILE);
        attend_tile(a, hs, nh, kvh, j0, nt);
    }
    for (int h = 0; h < nh; h++) {
        float *o = a->out + (t * a->n_head + h0 + h) * (int64_t)d;
        const float inv = hs[h].l > 0.0f ? 1.0f / hs[h].l : 0.0f;
        for (int i = 0; i < d; i++) o[i] = hs[h].acc[i] * inv;
    }
}

/* Units are dealt round-robin: with causal masking later tokens cost more,
 * and interleaving spreads them evenly over threads. */
static void attention_task(void *ctx, int ith, int nth) {
    const attn_job *a = ctx;
    const int blocks_per_kv = a->group / a->block;
    const int64_t n_units = a->n * a->n_head_kv * blocks_per_kv;
    for (int64_t u = ith; u < n_units; u += nth) {
        const int64_t t = u / (a->n_head_kv * blocks_per_kv);
        const int rest = (int)(u % (a->n_head_kv * blocks_per_kv));
        const int kvh = rest / blocks_per_kv, b = rest % blocks_per_kv;
        attend_block(a, t, kvh, kvh * a->group + b * a->block, a->block);
    }
}

/* Largest divisor of group that is at most ATTN_MAX_BLOCK and still leaves
 * at least one unit per thread (when the shape allows it). */
static int pick_block(int group, int64_t units_per_head_block, int n_threads) {
    int best = 1;
    for (int b = 1; b <= group && b <= ATTN_MAX_BLOCK; b++)
        if (group % b == 0 && (b == 1 || units_per_head_block * (group / b) >= n_threads)) best = b;
    return best;
}

int moex_attention(moex_pool *pool, const float *q, const float *k_cache, const float *v_cache, float *out,
                   int64_t n, int64_t pos0, int n_head, int n_head_kv, int head_dim, float scale, moex_error *err) {
    if (n <= 0) return 0;
    if (!q || !k_cache || !v_cache || !out)
        return moex_fail(err, "attention without q, the K or V cache or an output");
    if (pos0 < 0 || n_head <= 0 || n_head_kv <= 0 || head_dim <= 0)
        return moex_fail(err, "bad attention shape (n_head %d, n_head_kv %d, head_dim %d, first position %lld)",
                         n_head, n_head_kv, head_dim, (long long)pos0);
    if (n_head % n_head_kv != 0)
        return moex_fail(err, "%d query heads are not a multiple of %d KV heads", n_head, n_head_kv);
    if (head_dim > ATTN_MAX_HEAD_DIM)
        return moex_fail(err, "head_dim %d exceeds the %d the CPU attention supports", head_dim, ATTN_MAX_HEAD_DIM);
    const int group = n_head / n_head_kv;
    const int n_threads = pool ? moex_pool_size(pool) : 1;
    attn_job job = {q, k_cache, v_cache, out, n, pos0, n_head, n_head_kv, head_dim, group,
                    pick_block(group, n * n_head_kv, n_threads), scale, pick_vec_ops()};
    if (pool)
        moex_pool_run(pool, attention_task, &job);
    else
        attention_task(&job, 0, 1);
    return 0;
}
