/* hub/registry.c through the network thread's routing (hub_route_message),
 * on detached connections whose queues the test reads: the worker-record
 * bound, the JOIN rate, repeated JOINs, a reconnect presenting its session
 * key (same id, same experts), a ban that follows the key and not the name,
 * rejections queued before the close, and latency estimates kept per
 * dispatch size. */
#include <string.h>

#include "hub/registry.h"
#include "hub/server.h"
#include "tests/test_util.h"

#define N_LAYERS 2
#define N_EXPERTS 8
#define MODEL 0x1234567890abcdefull

typedef struct world {
    hub_net *net;
    hub_inbox *inbox;
    hub_registry *reg;
    hub_metrics metrics;
    moex_proto_limits lim;
} world;

typedef struct peer {
    hub_conn *conn;
    hub_worker *w;
} peer;

/* What one peer was sent, read back from its queue. */
typedef struct inbox_of {
    int n_assign, n_errors;
    int32_t errors[16];
    uint32_t worker_id, gen;
    uint64_t session;
    moex_proto_expert experts[N_LAYERS * N_EXPERTS];
    uint32_t n_experts;
} inbox_of;

static void world_init(world *wd) {
    memset(wd, 0, sizeof *wd);
    wd->net = hub_net_create();
    wd->inbox = hub_inbox_create(64, 1 << 20);
    hub_registry_config rc = {.model_hash = MODEL, .n_layers = N_LAYERS, .n_experts = N_EXPERTS, .replicas = 2,
                              .heartbeat_ms = 1000, .dead_after_ms = 3000};
    moex_error err = {0};
    wd->reg = hub_registry_create(&rc, wd->net, wd->inbox, &wd->metrics, &err);
    wd->lim = moex_proto_default_limits();
    wd->lim.max_layers = N_LAYERS;
    wd->lim.max_experts = N_EXPERTS;
}

static void world_free(world *wd) {
    hub_registry_stop(wd->reg);
    hub_registry_free(wd->reg);
    hub_inbox_free(wd->inbox);
    hub_net_free(wd->net);
}

static peer connect_peer(world *wd) {
    peer p = {.conn = hub_conn_create_detached(wd->net, 1 << 20, "test")};
    p.w = hub_registry_connect(wd->reg, p.conn);
    return p;
}

static void close_peer(world *wd, peer *p) {
    hub_conn_closed(p->conn);
    if (p->w) hub_registry_disconnect(wd->reg, p->w, "test: closed");
    hub_conn_unref(p->conn);
    p->conn = NULL;
    p->w = NULL;
}

static void send_msg(world *wd, peer *p, const uint8_t *frame, size_t len) {
    uint8_t *buf = malloc(len);
    memcpy(buf, frame, len);
    hub_route_message(wd->reg, wd->inbox, &wd->lim, p->w, &buf, len);
    free(buf);
}

static void join(world *wd, peer *p, const char *name, uint16_t capacity_centi, uint64_t session) {
    moex_proto_join j = {.proto_min = 1, .proto_max = 1, .capacity_centi = capacity_centi, .model_hash = MODEL,
                         .session = session, .name = name, .name_len = (uint8_t)strlen(name)};
    uint8_t frame[512];
    size_t len;
    if (moex_proto_encode_join(0, &j, NULL, 0, frame, sizeof frame, &len, NULL) == 0) send_msg(wd, p, frame, len);
}

static void ready(world *wd, peer *p, uint32_t gen) {
    moex_proto_heartbeat hb = {.state = MOEX_STATE_READY};
    uint8_t frame[64];
    size_t len;
    if (moex_proto_encode_heartbeat(gen, &hb, frame, sizeof frame, &len, NULL) == 0) send_msg(wd, p, frame, len);
}

/* Reads everything queued for the peer; *in keeps the latest ASSIGN and every ERROR code. */
static void read_queue(peer *p, inbox_of *in) {
    size_t len;
    uint8_t *buf;
    while ((buf = hub_conn_pop(p->conn, &len))) {
        const uint8_t *msg = buf + LWS_PRE;
        size_t off = 0, n;
        while (moex_proto_next_frame(msg, len, &off, NULL, &n, NULL) == 1) {
            moex_proto_msg m;
            if (moex_proto_decode(msg + off, n, NULL, NULL, 0, &m, NULL) == 0) {
                if (m.h.type == MOEX_MSG_ASSIGN) {
                    in->n_assign++;
                    in->worker_id = m.u.assign.info.worker_id;
                    in->session = m.u.assign.info.session;
                    in->gen = m.h.seq;
                    in->n_experts = m.u.assign.experts.count;
                    for (uint32_t i = 0; i < in->n_experts && i < N_LAYERS * N_EXPERTS; i++)
                        in->experts[i] = moex_proto_expert_at(&m.u.assign.experts, i);
                } else if (m.h.type == MOEX_MSG_ERROR && in->n_errors < 16) {
                    in->errors[in->n_errors++] = m.u.error.code;
                }
            }
            off += n;
        }
        free(buf);
    }
}

static void test_record_bound(void) {
    world wd;
    world_init(&wd);
    static peer p[HUB_MAX_WORKERS + 1];
    int live = 0;
    for (int i = 0; i < HUB_MAX_WORKERS + 1; i++) {
        p[i] = connect_peer(&wd);
        live += p[i].w != NULL;
    }
    CHECK(live == HUB_MAX_WORKERS, "%d connections have records, want %d", live, HUB_MAX_WORKERS);
    CHECK(p[HUB_MAX_WORKERS].w == NULL, "the connection past the bound gets no record");
    close_peer(&wd, &p[HUB_MAX_WORKERS]);
    close_peer(&wd, &p[0]);
    p[0] = connect_peer(&wd);
    CHECK(p[0].w != NULL, "a slot freed by a closed connection is reused");
    for (int i = 0; i < HUB_MAX_WORKERS; i++) close_peer(&wd, &p[i]);
    world_free(&wd);
}

static void test_join_rate(void) {
    world wd;
    world_init(&wd);
    static peer p[HUB_JOINS_PER_S + 5];
    int assigned = 0, refused = 0;
    for (int i = 0; i < HUB_JOINS_PER_S + 5; i++) {
        p[i] = connect_peer(&wd);
        char name[16];
        snprintf(name, sizeof name, "greedy%d", i);
        join(&wd, &p[i], name, 65535, 0);
    }
    for (int i = 0; i < HUB_JOINS_PER_S + 5; i++) {
        inbox_of in = {0};
        read_queue(&p[i], &in);
        assigned += in.n_assign > 0;
        refused += in.n_errors == 1 && in.errors[0] == MOEX_ERR_REFUSED && !hub_conn_open(p[i].conn);
    }
    CHECK(assigned == HUB_JOINS_PER_S && refused == 5, "JOINs in one second: %d assigned, %d refused (ERROR 8)",
          assigned, refused);
    for (int i = 0; i < HUB_JOINS_PER_S + 5; i++) close_peer(&wd, &p[i]);
    world_free(&wd);
}

static void test_repeated_join(void) {
    world wd;
    world_init(&wd);
    peer p = connect_peer(&wd);
    join(&wd, &p, "first", 100, 0);
    for (int i = 0; i < 3; i++) join(&wd, &p, "renamed", 100, 0);
    inbox_of in = {0};
    read_queue(&p, &in);
    CHECK(in.n_assign == 1 && in.n_errors == 4 && in.errors[0] == MOEX_ERR_ALREADY_JOINED &&
              in.errors[2] == MOEX_ERR_ALREADY_JOINED && in.errors[3] == MOEX_ERR_REFUSED,
          "a JOIN repeated three times: ERROR 5, 5, 5, then 8 (got %d errors, last %d)", in.n_errors,
          in.n_errors ? in.errors[in.n_errors - 1] : 0);
    CHECK(!hub_conn_open(p.conn), "then the connection closes");
    close_peer(&wd, &p);
    world_free(&wd);
}

static void test_reconnect_and_ban(void) {
    world wd;
    world_init(&wd);
    peer a = connect_peer(&wd), b = connect_peer(&wd);
    join(&wd, &a, "honest", 100, 0);
    join(&wd, &b, "other", 100, 0);
    inbox_of ia = {0}, ib = {0};
    read_queue(&a, &ia);
    read_queue(&b, &ib);
    ready(&wd, &a, ia.gen);
    ready(&wd, &b, ib.gen);
    read_queue(&a, &ia);

    /* a blip: the same worker reconnects presenting its key */
    const inbox_of before = ia;
    close_peer(&wd, &a);
    read_queue(&b, &ib);
    a = connect_peer(&wd);
    join(&wd, &a, "honest", 100, before.session);
    inbox_of again = {0};
    read_queue(&a, &again);
    CHECK(again.n_assign == 1 && again.worker_id == before.worker_id && again.session == before.session,
          "a reconnect with its key is the same worker (id %u -> %u)", before.worker_id, again.worker_id);
    CHECK(again.n_experts == before.n_experts &&
              !memcmp(again.experts, before.experts, before.n_experts * sizeof before.experts[0]),
          "and gets the same %u experts back (got %u)", before.n_experts, again.n_experts);

    /* an impostor under the honest worker's name is evicted: the ban follows its key */
    peer imp = connect_peer(&wd);
    join(&wd, &imp, "honest", 100, 0);
    inbox_of ii = {0};
    read_queue(&imp, &ii);
    CHECK(ii.n_assign == 1 && ii.worker_id != again.worker_id, "the impostor is another worker");
    hub_registry_evict(wd.reg, ii.worker_id, "test: wrong results");
    read_queue(&imp, &ii);
    CHECK(ii.n_errors >= 1 && ii.errors[ii.n_errors - 1] == MOEX_ERR_EVICTED && !hub_conn_open(imp.conn),
          "the evicted impostor is told (ERROR 7) and closed");
    close_peer(&wd, &imp);
    CHECK(hub_conn_open(a.conn), "the honest worker of the same name stays");

    peer replay = connect_peer(&wd);
    join(&wd, &replay, "anyone", 100, ii.session);
    inbox_of ir = {0};
    read_queue(&replay, &ir);
    CHECK(ir.n_assign == 0 && ir.n_errors == 1 && ir.errors[0] == MOEX_ERR_EVICTED, "the evicted key is refused");
    close_peer(&wd, &replay);

    close_peer(&wd, &a); /* the honest worker reconnects without a key (a restart): let in */
    a = connect_peer(&wd);
    join(&wd, &a, "honest", 100, 0);
    inbox_of fresh = {0};
    read_queue(&a, &fresh);
    CHECK(fresh.n_assign == 1 && fresh.n_errors == 0, "the honest name is not banned");
    close_peer(&wd, &a);
    close_peer(&wd, &b);
    world_free(&wd);
}

/* A member that sends a bad frame leaves the live set at once: the executor
 * hears of it (its dispatches go elsewhere now, not when the close comes). */
static void test_bad_frame_departs(void) {
    world wd;
    world_init(&wd);
    peer a = connect_peer(&wd);
    join(&wd, &a, "garbler", 100, 0);
    inbox_of in = {0};
    read_queue(&a, &in);
    ready(&wd, &a, in.gen);
    hub_event ev;
    while (hub_inbox_pop(wd.inbox, &ev, 0)) free(ev.data);
    const uint8_t garbage[64] = {'M', 'o', 'E', 'x'};
    send_msg(&wd, &a, garbage, sizeof garbage);
    bool gone = false;
    while (hub_inbox_pop(wd.inbox, &ev, 0)) {
        gone |= ev.kind == HUB_EV_WORKER_GONE && ev.worker == in.worker_id;
        free(ev.data);
    }
    CHECK(gone, "a member's bad frame reports its departure before its connection closes");
    read_queue(&a, &in);
    CHECK(in.n_errors == 1 && in.errors[0] < 0 && !hub_conn_open(a.conn), "and it is told (ERROR < 0), then closed");
    hub_replica r[4];
    CHECK(hub_registry_replicas(wd.reg, 0, 0, HUB_SMALL, r, 4) == 0, "and is no replica any more");
    close_peer(&wd, &a);
    world_free(&wd);
}

/* A worker's latency is learned per dispatch size: one that carried a
 * prompt's big batches (slow) is unknown, so tried, for decode dispatches,
 * instead of looking slow to them. */
static void test_latency_by_size(void) {
    world wd;
    world_init(&wd);
    peer a = connect_peer(&wd), b = connect_peer(&wd);
    inbox_of ia = {0}, ib = {0};
    join(&wd, &a, "prompt-carrier", 100, 0);
    join(&wd, &b, "decoder", 100, 0);
    for (int round = 0; round < 2; round++) { /* the second join re-assigns the first */
        read_queue(&a, &ia);
        read_queue(&b, &ib);
        ready(&wd, &a, ia.gen);
        ready(&wd, &b, ib.gen);
    }
    for (int i = 0; i < 5; i++) {
        hub_registry_record(wd.reg, ia.worker_id, HUB_LARGE, 72.0f, HUB_WON);
        hub_registry_record(wd.reg, ib.worker_id, HUB_LARGE, 70.0f, HUB_WON);
        hub_registry_record(wd.reg, ib.worker_id, HUB_SMALL, 0.8f, HUB_WON);
    }
    hub_replica r[4];
    float small[2] = {-2, -2}, large[2] = {-2, -2};
    int n = hub_registry_replicas(wd.reg, 0, 0, HUB_SMALL, r, 4);
    for (int i = 0; i < n; i++) {
        small[r[i].id == ib.worker_id] = r[i].lat_ms;
        hub_conn_unref(r[i].conn);
    }
    CHECK(n == 2, "both workers replicate expert (0, 0): %d", n);
    CHECK(small[0] < 0 && fabsf(small[1] - 0.8f) < 1e-3f,
          "decode estimates: the prompt carrier unknown (%.2f), the decoder 0.8 (%.2f)", small[0], small[1]);
    n = hub_registry_replicas(wd.reg, 0, 0, HUB_LARGE, r, 4);
    for (int i = 0; i < n; i++) {
        large[r[i].id == ib.worker_id] = r[i].lat_ms;
        hub_conn_unref(r[i].conn);
    }
    CHECK(fabsf(large[0] - 72.0f) < 1e-2f && fabsf(large[1] - 70.0f) < 1e-2f, "prompt estimates 72 and 70: %.2f %.2f",
          large[0], large[1]);
    CHECK(fabsf(hub_registry_median_ms(wd.reg, HUB_SMALL) - 0.8f) < 1e-3f, "decode median from the decoder alone");
    close_peer(&wd, &a);
    close_peer(&wd, &b);
    world_free(&wd);
}

int main(void) {
    setenv("MOEX_LOG", "error", 0);
    test_latency_by_size();
    test_record_bound();
    test_join_rate();
    test_repeated_join();
    test_reconnect_and_ban();
    test_bad_frame_departs();
    if (g_failures) fprintf(stderr, "%d failures\n", g_failures);
    else printf("test_hub_registry: all passed\n");
    return g_failures ? 1 : 0;
}
