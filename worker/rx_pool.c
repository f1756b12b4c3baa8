/* The received messages' buffers (session_internal.h's rx_msg): a pool,
 * referenced by the backlog's dispatches (views into the message they came
 * in) and released by the compute thread once their last dispatch is
 * computed or dropped, so that nothing is copied between the lws thread and
 * the compute thread. */
#include <stdlib.h>

#include "worker/session_internal.h"

/* A released message keeps a buffer up to this size for the next one. */
#define RX_KEEP_BYTES ((size_t)4 << 20)

/* Called with mu held: a message whose buffer (if any) gets swapped with the reassembly buffer. */
rx_msg *worker_rx_take(session *s) {
    rx_msg *m = s->rx_free;
    if (m) {
        s->rx_free = m->next_free;
        return m;
    }
    if (s->rx_n_all == s->rx_cap_all) {
        const int cap = s->rx_cap_all ? 2 * s->rx_cap_all : 16;
        rx_msg **all = realloc(s->rx_all, (size_t)cap * sizeof *all);
        if (!all) return NULL;
        s->rx_all = all;
        s->rx_cap_all = cap;
    }
    if (!(m = calloc(1, sizeof *m))) return NULL;
    s->rx_all[s->rx_n_all++] = m;
    return m;
}

void worker_rx_release(session *s, rx_msg *m) {
    if (!m || --m->refs > 0) return;
    if (m->cap > RX_KEEP_BYTES) {
        free(m->bytes);
        m->bytes = NULL;
        m->cap = 0;
    }
    if (m->scratch_cap > RX_KEEP_BYTES) {
        free(m->scratch);
        m->scratch = NULL;
        m->scratch_cap = 0;
    }
    m->len = 0;
    m->next_free = s->rx_free;
    s->rx_free = m;
}

void worker_backlog_drop_all(session *s) {
    moex_worker_item it;
    while (moex_worker_backlog_pop(s->backlog, &it)) worker_rx_release(s, it.owner);
}

void worker_rx_init(session *s) { s->reasm.max_bytes = RX_MESSAGE_MAX; }

void worker_rx_free_all(session *s) {
    for (int i = 0; i < s->rx_n_all; i++) {
        free(s->rx_all[i]->bytes);
        free(s->rx_all[i]->scratch);
        free(s->rx_all[i]);
    }
    free(s->rx_all);
    s->rx_all = NULL;
    s->rx_free = NULL;
    s->rx_n_all = s->rx_cap_all = 0;
    moex_proto_reasm_free(&s->reasm);
    free(s->tail);
    s->tail = NULL;
    s->tail_cap = 0;
}

