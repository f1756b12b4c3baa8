/* Elementwise kernels: RMSNorm, RoPE, softmax, SwiGLU.
 *
 * Plain C written so gcc -O3 vectorises it: reductions use 8 independent
 * accumulators (C forbids reassociating one float sum, so a single
 * accumulator would stay scalar). */
#include "kernels/kernels.h"

#include <math.h>

enum { N_ACC = 8 };

static float sum_of_squares(const float *x, int64_t n) {
    float acc[N_ACC] = {0};
    int64_t i = 0;
    for (; i + N_ACC <= n; i += N_ACC)
        for (int k = 0; k < N_ACC; k++) acc[k] += x[i + k] * x[i + k];
    float s = 0.0f;
    for (; i < n; i++) s += x[i] * x[i];
    for (int k = 0; k < N_ACC; k++) s += acc[k];
    return s;
}

void moex_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    if (n <= 0) return;
    const float inv = 1.0f / sqrtf(sum_of_squares(x, n) / (float)n + eps);
    if (w) {
        for (int64_t i = 0; i < n; i++) out[i] = x[i] * inv * w[i];
    } else {
        for (int64_t i = 0; i < n; i++) out[i] = x[i] * inv;
    }
}

/* Rotates the pair (*a, *b) by the angle whose cosine/sine are c/s. */
static inline void rotate_pair(float *a, float *b, float c, float s) {
    const float x0 = *a, x1 = *b;
    *a = x0 * c - x1 * s;
    *b = x0 * s + x1 * c;
}

/* theta_i = pos * base^(-2i/rope_dim), computed the way ggml does (float,
 * iterative multiplication) so the result tracks llama.cpp bit-closely rather
 * than an exact reference. The angle for pair i is shared by all heads. */
void moex_rope(float *x, int n_heads, int head_dim, int rope_dim, int64_t pos, float freq_base, bool neox) {
    if (rope_dim > head_dim) rope_dim = head_dim;
    const int half = rope_dim / 2;
    const float theta_scale = powf(freq_base, -2.0f / (float)rope_dim);
    float theta = (float)pos;
    for (int i = 0; i < half; i++, theta *= theta_scale) {
        const float c = cosf(theta), s = sinf(theta);
        const int i0 = neox ? i : 2 * i;
        const int i1 = neox ? i + half : 2 * i + 1;
        for (int h = 0; h < n_heads; h++) {
            float *head = x + (int64_t)h * head_dim;
            rotate_pair(&head[i0], &head[i1], c, s);
        }
    }
}

static float max_of(const float *x, int64_t n) {
    float m = x[0];
    for (int64_t i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

void moex_softmax(float *x, int64_t n) {
    if (n <= 0) return;
    const float m = max_of(x, n);
    if (m == -INFINITY) {   /* everything masked: uniform rather than NaN */
        for (int64_t i = 0; i < n; i++) x[i] = 1.0f / (float)n;
        return;
    }
    /* The sum is kept in double: over a vocabulary-sized row f32 partial
     * sums would drift by ~1e-5 relative, and every output inherits it. */
    double acc[4] = {0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) {
            x[i + k] = expf(x[i + k] - m);
            acc[k] += x[i + k];
        }
    double sum = acc[0] + acc[1] + acc[2] + acc[3];
    for (; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    const float inv = (float)(1.0 / sum);
    for (i = 0; i < n; i++) x[i] *= inv;
}

/* silu(g) * u. For g -> -inf, expf(-g) overflows to inf and g/inf = -0: the
 * correct limit, no special case needed. */
void moex_swiglu(float *out, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}
