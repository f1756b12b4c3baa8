/* moex-worker: computes experts for a MoEx hub (see worker/worker.h), from
 * its own copy of the model (--model) or from experts it downloads from the
 * hub. Exit status: 0 after SIGINT/SIGTERM, 1 on a fatal error (model file,
 * model mismatch, no hub within --reconnect-max-s, refused token, failed
 * download), 2 on bad flags, 3 from --inject-exit-after. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "worker/worker.h"

static volatile sig_atomic_t g_stop; /* set by the signal handler only */

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN); /* a dead hub is an error return, not a signal */
}

/* The counters, and the latency of each stage of the dispatch path on one line. */
static void print_stats(const moex_worker_stats *st) {
    fprintf(stderr,
            "moex-worker: %llu dispatches, %llu results, %llu cancels (%llu effective), %llu errors, "
            "%llu connects, mean compute %.3f ms\n",
            (unsigned long long)st->dispatches, (unsigned long long)st->results, (unsigned long long)st->cancels,
            (unsigned long long)st->cancelled, (unsigned long long)st->errors, (unsigned long long)st->connects,
            st->computed ? st->compute_s * 1e3 / (double)st->computed : 0.0);
    char line[1024];
    moex_worker_timing_line(st, line, sizeof line);
    fprintf(stderr, "%s\n", line);
}

static int run_with_model(const moex_worker_options *o, moex_worker_stats *st, moex_error *err) {
    moex_model *m = moex_model_load(o->model_path, err);
    if (!m) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return moex_fail(err, "cannot load %s: %s", o->model_path, why);
    }
    char desc[512];
    moex_model_describe(m, desc, sizeof desc);
    moex_log(MOEX_LOG_INFO, "worker: %s", desc);
    const int rc = moex_worker_run(o, m, &g_stop, st, err);
    print_stats(st);
    moex_model_free(m);
    return rc;
}

/* No --model: experts come from the hub (worker/download.c). */
static int run_with_download(const moex_worker_options *o, moex_worker_stats *st, moex_error *err) {
    moex_worker_store *store = moex_worker_store_open(o, &g_stop, err);
    if (!store) return g_stop ? 0 : -1; /* interrupted while asking the hub: a normal stop */
    const int rc = moex_worker_run_store(o, store, &g_stop, st, err);
    print_stats(st);
    moex_worker_store_close(store);
    return rc;
}

int main(int argc, char **argv) {
    moex_worker_options o;
    moex_error err = {{0}};
    const int prc = moex_worker_parse_args(argc, argv, &o, &err);
    if (prc == 1) {
        moex_worker_usage(stdout);
        return 0;
    }
    if (prc) {
        fprintf(stderr, "moex-worker: %s\n", err.msg);
        moex_worker_usage(stderr);
        return 2;
    }
    install_signals();
    if (o.insecure)
        moex_log(MOEX_LOG_WARN, "worker: --insecure: the hub's TLS certificate is not checked; anyone on the network "
                                "path can pose as the hub (trust its certificate with --ca FILE instead)");
    moex_worker_stats st = {0};
    const int rc = o.model_path ? run_with_model(&o, &st, &err) : run_with_download(&o, &st, &err);
    if (rc) {
        fprintf(stderr, "moex-worker: %s\n", err.msg);
        return 1;
    }
    return 0;
}
