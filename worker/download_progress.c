/* Download progress on stderr: a bar redrawn at most 10 times a second when
 * stderr is a terminal, else one log line per 10 % (logs stay readable). */
#include <stdio.h>
#include <unistd.h>

#include "worker/download_internal.h"

#define REDRAW_S 0.1
#define MIB (1024.0 * 1024.0)

static void format_eta(double s, char *buf, size_t cap) {
    if (s < 0 || s > 360000) {
        snprintf(buf, cap, "--:--");
        return;
    }
    const long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

/* Rate so far and the time left at that rate. */
static void rate_and_eta(const dl_progress *p, double *mb_s, double *eta_s) {
    const double dt = moex_time_s() - p->t0;
    *mb_s = dt > 0 ? (double)p->done / dt / 1e6 : 0;
    *eta_s = p->done > 0 && dt > 0 ? (double)(p->total - p->done) / ((double)p->done / dt) : -1;
}

static void draw_bar(dl_progress *p) {
    double mb_s, eta_s;
    rate_and_eta(p, &mb_s, &eta_s);
    char eta[32], bar[31];
    format_eta(eta_s, eta, sizeof eta);
    const double frac = p->total ? (double)p->done / (double)p->total : 1;
    const int fill = (int)(frac * 30);
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = 0;
    fprintf(stderr, "\rexperts [%s] %3.0f%%  %d/%d  %.1f/%.1f MiB  %.1f MB/s  ETA %s\033[K", bar, frac * 100,
            p->n_done, p->n_items, (double)p->done / MIB, (double)p->total / MIB, mb_s, eta);
    fflush(stderr);
    p->drawn = true;
}

static void log_decile(dl_progress *p) {
    const int decile = p->total ? (int)(p->done * 10 / p->total) : 10;
    if (decile <= p->last_decile || decile >= 10) return; /* 100 %: the caller's summary says it */
    p->last_decile = decile;
    double mb_s, eta_s;
    rate_and_eta(p, &mb_s, &eta_s);
    char eta[32];
    format_eta(eta_s, eta, sizeof eta);
    moex_log(MOEX_LOG_INFO, "worker: downloading experts: %d%% (%.1f of %.1f MiB, %d/%d experts, %.1f MB/s, ETA %s)",
             decile * 10, (double)p->done / MIB, (double)p->total / MIB, p->n_done, p->n_items, mb_s, eta);
}

static void update(dl_progress *p, bool force) {
    if (!p->tty) {
        log_decile(p);
        return;
    }
    const double now = moex_time_s();
    if (!force && now - p->last_draw_s < REDRAW_S) return;
    p->last_draw_s = now;
    draw_bar(p);
}

void dl_progress_start(dl_progress *p, uint64_t total, int n_items) {
    *p = (dl_progress){.total = total, .n_items = n_items, .t0 = moex_time_s(), .tty = isatty(STDERR_FILENO) == 1};
    moex_log(MOEX_LOG_INFO, "worker: downloading %d experts (%.1f MiB) from the hub", n_items, (double)total / MIB);
    update(p, true);
}

void dl_progress_add(dl_progress *p, uint64_t bytes) {
    p->done += bytes;
    if (p->done > p->total) p->total = p->done;
    update(p, false);
}

void dl_progress_grow(dl_progress *p, uint64_t bytes) { p->total += bytes; }

void dl_progress_item_done(dl_progress *p) {
    p->n_done++;
    update(p, p->n_done == p->n_items);
}

void dl_progress_end(dl_progress *p) {
    if (p->tty && p->drawn) {
        draw_bar(p);
        fputc('\n', stderr);
    }
}
