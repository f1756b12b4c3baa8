/* The download thread (see download_loader.h). Network failures are retried
 * inside the store; when they persist, the assignment waits for the next
 * one (a hub that went away sends it after the session reconnects). What
 * comes out of the store as an error (the hub refuses an expert, its hash
 * never matches, the disk is full) ends the worker with that message,
 * through the session's fatal path. */
#include <stdlib.h>
#include <string.h>

#include "worker/download_loader.h"

struct dl_loader {
    pthread_t th;
    bool quit;
    uint64_t posted, taken;      /* assignments posted by the session / taken by the thread */
    bool failed;
    moex_error err;
    moex_proto_expert *list;     /* the assignment being fetched (thread only) */
    uint32_t n, cap;
};

typedef struct fetch_ctx {
    session *s;
    uint64_t serial;
} fetch_ctx;

/* The fetch is pointless once a newer assignment came, or the worker stops. */
static bool superseded(void *arg) {
    const fetch_ctx *f = arg;
    session *s = f->s;
    pthread_mutex_lock(&s->mu);
    const bool stop = s->loader->quit || s->loader->posted != f->serial || *s->stop;
    pthread_mutex_unlock(&s->mu);
    return stop;
}

/* Called with mu held: copies the session's assignment. */
static int take(session *s, dl_loader *ld) {
    ld->taken = ld->posted;
    if (s->assign_n > ld->cap) {
        moex_proto_expert *p = realloc(ld->list, s->assign_n * sizeof *p);
        if (!p) return moex_fail(&ld->err, "out of memory for an assignment of %u experts", s->assign_n);
        ld->list = p;
        ld->cap = s->assign_n;
    }
    memcpy(ld->list, s->assign_list, s->assign_n * sizeof *ld->list);
    ld->n = s->assign_n;
    return 0;
}

/* Called with mu held: waits until the compute thread applied generation g
 * (true), or it no longer will (a newer assignment, another connection, quit).
 * Each of those changes broadcasts the session's cv. */
static bool wait_applied(session *s, dl_loader *ld, uint32_t g, uint64_t serial, uint32_t conn) {
    for (;;) {
        if (ld->quit || ld->posted != serial || s->conn != conn) return false;
        if (!s->assign_pending && s->g == g) return true;
        pthread_cond_wait(&s->cv, &s->mu);
    }
}

/* Fetches one assignment and hands it on. Called with mu held; false on a fatal error. */
static bool load_one(session *s, dl_loader *ld) {
    if (take(s, ld)) {
        ld->failed = true;
        return false;
    }
    const uint32_t g = s->assign_g, conn = s->conn;
    fetch_ctx f = {s, ld->taken};
    pthread_mutex_unlock(&s->mu);
    moex_error err = {{0}};
    const int rc = moex_worker_store_fetch(s->store, ld->list, ld->n, superseded, &f, &err);
    pthread_mutex_lock(&s->mu);
    if (rc < 0) {
        ld->failed = true;
        ld->err = err;
        return false;
    }
    if (rc == 2) { /* the hub is unreachable: its next ASSIGN (after a reconnect) tries again */
        moex_log(MOEX_LOG_WARN, "worker: downloads stopped: %s; waiting for the hub's next assignment", err.msg);
        return true;
    }
    if (rc > 0 || ld->posted != f.serial || s->conn != conn) return true; /* superseded */
    s->assign_pending = true;
    pthread_cond_broadcast(&s->cv);
    if (wait_applied(s, ld, g, f.serial, conn)) {
        pthread_mutex_unlock(&s->mu);
        moex_worker_store_trim(s->store, ld->list, ld->n);
        pthread_mutex_lock(&s->mu);
    }
    return true;
}

static void *loader_main(void *arg) {
    session *s = arg;
    dl_loader *ld = s->loader;
    pthread_mutex_lock(&s->mu);
    while (!ld->quit) {
        if (ld->posted == ld->taken) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        if (!load_one(s, ld)) {
            moex_log(MOEX_LOG_ERROR, "worker: %s", ld->err.msg);
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    lws_cancel_service(s->ctx); /* the session notices a failure */
    return NULL;
}

int dl_loader_start(session *s, moex_error *err) {
    dl_loader *ld = calloc(1, sizeof *ld);
    if (!ld) return moex_fail(err, "out of memory");
    s->loader = ld;
    if (pthread_create(&ld->th, NULL, loader_main, s)) {
        free(ld);
        s->loader = NULL;
        return moex_fail(err, "cannot start the download thread");
    }
    return 0;
}

void dl_loader_stop(session *s) {
    dl_loader *ld = s->loader;
    if (!ld) return;
    pthread_mutex_lock(&s->mu);
    ld->quit = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(ld->th, NULL);
    free(ld->list);
    free(ld);
    s->loader = NULL;
}

void dl_loader_post(session *s) {
    s->loader->posted++;
    pthread_cond_broadcast(&s->cv);
}

bool dl_loader_failed(session *s, moex_error *err) {
    if (!s->loader) return false;
    pthread_mutex_lock(&s->mu);
    const bool failed = s->loader->failed;
    if (failed) *err = s->loader->err;
    pthread_mutex_unlock(&s->mu);
    return failed;
}
