/* The worker core's RESULT for each DISPATCH frame, computed one at a time:
 * the reference test_worker_session.py holds a live worker's batched
 * RESULTs against (they must be the same bytes).
 *
 * usage: worker_ref MODEL.gguf < DISPATCH frames > RESULT frames
 * (frames back to back; every expert of the model is held; one thread). */
#include <stdio.h>
#include <stdlib.h>

#include "worker/worker.h"

static uint8_t *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16;
    uint8_t *buf = malloc(cap);
    *len = 0;
    for (size_t n; buf && (n = fread(buf + *len, 1, cap - *len, f)) > 0;) {
        *len += n;
        if (*len == cap) {
            uint8_t *grown = realloc(buf, cap *= 2);
            if (!grown) free(buf);
            buf = grown;
        }
    }
    return buf;
}

static int answer_all(moex_worker_core *core, const moex_proto_limits *lim, const uint8_t *in, size_t len) {
    size_t off = 0, n;
    moex_error err;
    int rc;
    while ((rc = moex_proto_next_frame(in, len, &off, lim, &n, &err)) == 1) {
        moex_proto_msg msg;
        if (moex_proto_decode(in + off, n, lim, NULL, 0, &msg, &err)) break;
        const size_t cap = moex_worker_result_bytes(&msg);
        uint8_t *out = malloc(cap ? cap : 1);
        size_t out_len = 0;
        rc = out ? moex_worker_core_compute(core, &msg, out, cap, &out_len, &err) : -1;
        if (!rc) fwrite(out, 1, out_len, stdout);
        free(out);
        if (rc) break;
        off += n;
    }
    if (rc) fprintf(stderr, "worker_ref: frame at byte %zu: %s\n", off, err.msg);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.gguf < dispatches > results\n", argv[0]);
        return 2;
    }
    moex_error err;
    moex_model *m = moex_model_load(argv[1], &err);
    if (!m) {
        fprintf(stderr, "worker_ref: cannot load %s: %s\n", argv[1], err.msg);
        return 1;
    }
    moex_pool *pool = moex_pool_create(1);
    moex_worker_core *core = moex_worker_core_create(m->hp.n_layer, m->hp.n_expert, m->hp.n_embd, pool, &err);
    int rc = core ? 0 : 1;
    for (int l = 0; !rc && l < m->hp.n_layer; l++)
        for (int e = 0; !rc && e < m->hp.n_expert; e++)
            rc = moex_worker_core_hold(core, l, e, &m->layers[l].experts[e], &err) ? 1 : 0;
    size_t len = 0;
    uint8_t *in = rc ? NULL : read_all(stdin, &len);
    if (rc || !in) {
        fprintf(stderr, "worker_ref: %s\n", rc ? err.msg : "out of memory");
        rc = 1;
    } else {
        moex_proto_limits lim = moex_proto_default_limits();
        rc = answer_all(core, &lim, in, len);
    }
    free(in);
    moex_worker_core_free(core);
    moex_pool_destroy(pool);
    moex_model_free(m);
    return rc;
}
