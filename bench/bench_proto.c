/* Benchmark of the wire format (figures for docs/PERF.md; not a test).
 *
 *   bench_proto [--acts FILE --hidden N] [--seconds S]
 *
 * 1. Encode + decode throughput of DISPATCH frames per dtype, against memcpy
 *    of the same number of bytes, for a decode step (1 token) and a prefill
 *    batch (512 tokens).
 * 2. LZ4 ratio and time on f16 / bf16 activations. With --acts, FILE holds
 *    raw little-endian float32 hidden states, N per row (e.g. dumped by the
 *    engine); without it, activations are synthetic (see synth_activations). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lz4.h>

#include "common/error.h"
#include "proto/proto.h"

static double g_seconds = 0.25;

static uint64_t rng = 0x2545f4914f6cdd1dull;
static double uniform(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return ((rng >> 11) + 0.5) / 9007199254740992.0;
}
static double normal(void) { return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()); }

/* Synthetic stand-in for the normalised hidden states a hub dispatches:
 * per-channel RMSNorm gains ~ lognormal(0, 0.4), heavy-tailed per-token
 * values (Student t, 4 dof, unit RMS), and 4 outlier channels 30x larger
 * ("massive activations"), which is what such states look like in practice. */
static void synth_activations(float *x, uint32_t tokens, uint32_t hidden) {
    float *gain = malloc(sizeof *gain * hidden);
    for (uint32_t c = 0; c < hidden; c++) gain[c] = (float)exp(0.4 * normal());
    for (int k = 0; k < 4; k++) gain[(k * 7919u + 11) % hidden] *= 30.0f;
    for (uint32_t t = 0; t < tokens; t++)
        for (uint32_t c = 0; c < hidden; c++) {
            double chi2 = 0;
            for (int k = 0; k < 4; k++) { double z = normal(); chi2 += z * z; }
            double tval = normal() / sqrt(chi2 / 4) / sqrt(2.0); /* t(4) has variance 2 */
            x[(size_t)t * hidden + c] = (float)(tval * gain[c]);
        }
    free(gain);
}

static float *load_activations(const char *path, uint32_t hidden, uint32_t *rows) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    *rows = (uint32_t)(bytes / 4 / hidden);
    float *x = malloc((size_t)*rows * hidden * 4 + 4);
    if (!x || fread(x, 4, (size_t)*rows * hidden, f) != (size_t)*rows * hidden) *rows = 0;
    fclose(f);
    return x;
}

/* Repeats fn until g_seconds have passed; returns seconds per call. */
#define TIME_IT(result, body)                                                \
    do {                                                                     \
        long iters_ = 0;                                                     \
        double t0_ = moex_time_s(), el_;                                     \
        do {                                                                 \
            for (int k_ = 0; k_ < 16; k_++) { body; }                        \
            iters_ += 16;                                                    \
            el_ = moex_time_s() - t0_;                                       \
        } while (el_ < g_seconds);                                           \
        result = el_ / iters_;                                               \
    } while (0)

static volatile float sink;

static void bench_frames(const float *x, uint32_t tokens, uint32_t hidden) {
    static const int dtypes[] = {MOEX_DT_F16, MOEX_DT_BF16, MOEX_DT_INT8, MOEX_DT_F32};
    float *gates = malloc(sizeof *gates * tokens), *row = malloc(sizeof *row * hidden);
    for (uint32_t t = 0; t < tokens; t++) gates[t] = 0.125f;
    moex_proto_limits lim = moex_proto_default_limits();
    printf("\nDISPATCH %u token(s) x %u hidden\n", tokens, hidden);
    printf("%-5s %9s | %12s %12s %12s %12s | %12s\n", "dtype", "bytes", "enc f32 GB/s", "enc raw GB/s",
           "decode GB/s", "dec+f32 GB/s", "memcpy GB/s");
    for (int d = 0; d < 4; d++) {
        moex_proto_tensor_msg m = {.type = MOEX_MSG_DISPATCH, .seq = 1, .n_tokens = tokens, .hidden = (uint16_t)hidden,
                                   .dtype = (uint8_t)dtypes[d]};
        size_t cap = moex_proto_tensor_frame_bytes(&m), n = 0;
        uint8_t *frame = malloc(cap), *frame2 = malloc(cap), *copy = malloc(cap);
        moex_proto_encode_tensor_f32(&m, x, gates, frame, cap, &n, NULL);
        moex_proto_tensor_layout lay;
        moex_proto_compute_layout(m.type, m.dtype, tokens, hidden, &lay);
        const uint8_t *p = frame + 28;
        double t_enc, t_raw, t_dec, t_decf, t_cpy;
        TIME_IT(t_enc, moex_proto_encode_tensor_f32(&m, x, gates, frame2, cap, &n, NULL));
        TIME_IT(t_raw, moex_proto_encode_tensor_raw(&m, p + lay.values_off, m.dtype == MOEX_DT_INT8 ? p : NULL,
                                                    p + lay.gates_off, frame2, cap, &n, NULL));
        moex_proto_msg msg;
        TIME_IT(t_dec, moex_proto_decode(frame, cap, &lim, NULL, 0, &msg, NULL); sink = msg.u.tensor.values[0]);
        TIME_IT(t_decf, {
            moex_proto_decode(frame, cap, &lim, NULL, 0, &msg, NULL);
            for (uint32_t t = 0; t < tokens; t++) moex_proto_tensor_row_f32(&msg.u.tensor, t, row);
            sink = row[0];
        });
        TIME_IT(t_cpy, memcpy(copy, frame, cap); sink = copy[cap / 2]);
        double gb = cap / 1e9;
        printf("%-5s %9zu | %12.2f %12.2f %12.1f %12.2f | %12.2f\n", moex_proto_dtype_name(m.dtype), cap, gb / t_enc,
               gb / t_raw, gb / t_dec, gb / t_decf, gb / t_cpy);
        free(frame);
        free(frame2);
        free(copy);
    }
    free(gates);
    free(row);
}

/* What LZ4 would achieve on the same payload with the two bytes of every
 * 16-bit value split into two planes (not part of the protocol: a measurement
 * of whether a byte-shuffle flag would pay). */
static double shuffled_ratio(const uint8_t *payload, size_t bytes) {
    size_t half = bytes / 2;
    uint8_t *planes = malloc(bytes), *z = malloc((size_t)LZ4_compressBound((int)bytes));
    for (size_t i = 0; i < half; i++) planes[i] = payload[2 * i], planes[half + i] = payload[2 * i + 1];
    int zn = LZ4_compress_default((const char *)planes, (char *)z, (int)bytes, LZ4_compressBound((int)bytes));
    free(planes);
    free(z);
    return (double)bytes / zn;
}

static void bench_lz4(const float *x, uint32_t tokens, uint32_t hidden) {
    static const int dtypes[] = {MOEX_DT_F16, MOEX_DT_BF16};
    moex_proto_limits lim = moex_proto_default_limits();
    printf("\nLZ4 on RESULT payloads, %u token(s) x %u hidden\n", tokens, hidden);
    printf("%-5s %10s %10s %7s | %11s %11s | %13s | %14s\n", "dtype", "raw B", "lz4 B", "ratio", "compress us",
           "decomp us", "compress MB/s", "shuffled ratio");
    for (int d = 0; d < 2; d++) {
        moex_proto_tensor_msg m = {.type = MOEX_MSG_RESULT, .n_tokens = tokens, .hidden = (uint16_t)hidden,
                                   .dtype = (uint8_t)dtypes[d]};
        size_t cap = moex_proto_tensor_frame_bytes(&m), n, zcap = moex_proto_compress_bound(cap), zn = 0;
        uint8_t *frame = malloc(cap), *z = malloc(zcap), *scratch = malloc(cap);
        moex_proto_encode_tensor_f32(&m, x, NULL, frame, cap, &n, NULL);
        moex_proto_compress(frame, cap, z, zcap, &zn, NULL);
        double t_c, t_d;
        TIME_IT(t_c, moex_proto_compress(frame, cap, z, zcap, &zn, NULL));
        moex_proto_msg msg;
        TIME_IT(t_d, moex_proto_decode(z, zn, &lim, scratch, cap, &msg, NULL); sink = msg.payload[0]);
        printf("%-5s %10zu %10zu %7.3f | %11.1f %11.1f | %13.0f | %14.3f\n", moex_proto_dtype_name(m.dtype), cap - 28,
               zn - 28, (double)(cap - 28) / (zn - 28), t_c * 1e6, t_d * 1e6, (cap - 28) / t_c / 1e6,
               shuffled_ratio(frame + 28, cap - 28));
        free(frame);
        free(z);
        free(scratch);
    }
}

int main(int argc, char **argv) {
    const char *acts = NULL;
    uint32_t hidden = 2048, rows = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--acts") && i + 1 < argc) acts = argv[++i];
        else if (!strcmp(argv[i], "--hidden") && i + 1 < argc) hidden = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) g_seconds = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_proto [--acts FILE --hidden N] [--seconds S]\n");
            return 2;
        }
    }
    if (hidden < 1 || hidden > 65535) {
        fprintf(stderr, "bench_proto: hidden must be in 1..65535\n");
        return 2;
    }
    uint32_t want = 512;
    float *x;
    if (acts) {
        x = load_activations(acts, hidden, &rows);
        if (!x || rows == 0) {
            fprintf(stderr, "bench_proto: cannot read float32 rows of %u from %s\n", hidden, acts);
            return 1;
        }
        printf("activations: %u rows of %u from %s\n", rows, hidden, acts);
        if (rows < want) want = rows;
    } else {
        x = malloc(sizeof *x * want * hidden);
        synth_activations(x, want, hidden);
        rows = want;
        printf("activations: synthetic (lognormal channel gains, t(4) values, 4 outlier channels), hidden %u\n", hidden);
    }
    bench_frames(x, 1, hidden);
    bench_frames(x, want, hidden);
    bench_lz4(x, 1, hidden);
    bench_lz4(x, want < 64 ? want : 64, hidden);
    bench_lz4(x, want, hidden);
    free(x);
    return 0;
}
