/* Optional GPU timestamps (--vk-tune profile=1): a timestamp after every
 * recorded op, summed per (label, kernel) over every run of the recording and
 * printed as a table of µs per run when the command buffer is recorded again or freed. The time of an
 * op is the distance from the previous timestamp, so it includes the barrier
 * and launch gap before it. When the variable is unset nothing is allocated
 * and each op pays one branch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/vk/vk_internal.h"

#define PROF_QUERIES 4096   /* timestamps per recording; later ops are not timed */
#define PROF_ROWS 96        /* distinct (label, kernel) pairs per recording */
#define PROF_MIN_OPS 8      /* smaller recordings (single-kernel tests) print no table, nor copies alone (uploads) */

typedef struct prof_mark {
    const char *label;
    VkPipeline pipe;        /* VK_NULL_HANDLE for copies and fills */
    const char *kernel;     /* the pipeline's name, valid until the recording is flushed */
} prof_mark;

typedef struct prof_row {
    const char *label;
    VkPipeline pipe;
    char kernel[32];
    double ns;
    long ops;
} prof_row;

struct vk_prof {
    VkQueryPool pool;
    uint32_t n;                  /* timestamps in the current recording (the first is the start) */
    prof_mark marks[PROF_QUERIES];
    prof_row rows[PROF_ROWS];
    int n_rows;
    long runs;
    double gpu_ns, host_ns;      /* first to last timestamp; submit to fence, on the host */
    struct timespec t0;
};

vk_prof *vk_prof_create(moex_vk *vk) {
    if (!vk->profile) return NULL;
    vk_prof *p = calloc(1, sizeof *p);
    VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = PROF_QUERIES};
    if (!p || vkCreateQueryPool(vk->dev, &qi, NULL, &p->pool) != VK_SUCCESS) {
        moex_log(MOEX_LOG_WARN, "vulkan profile: no timestamp query pool, profiling off for this recording");
        free(p);
        return NULL;
    }
    return p;
}

static void put_timestamp(moex_vk_cmd *c, const char *label, VkPipeline pipe, const char *kernel) {
    vk_prof *p = c->prof;
    if (p->n >= PROF_QUERIES) return;
    p->marks[p->n] = (prof_mark){label, pipe, kernel};
    vkCmdWriteTimestamp(c->cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, p->pool, p->n++);
}

static void flush(moex_vk_cmd *c);

/* A new recording: the previous one's table goes out first. */
void vk_prof_begin(moex_vk_cmd *c) {
    flush(c);
    vkCmdResetQueryPool(c->cb, c->prof->pool, 0, PROF_QUERIES);
    c->prof->n = 0;
    put_timestamp(c, "start", VK_NULL_HANDLE, "");
}

void vk_prof_mark(moex_vk_cmd *c, VkPipeline pipe, const char *kernel) {
    put_timestamp(c, c->label ? c->label : "unlabelled", pipe, kernel);
}

static prof_row *row_for(vk_prof *p, const prof_mark *m) {
    for (int i = 0; i < p->n_rows; i++)
        if (p->rows[i].pipe == m->pipe && strcmp(p->rows[i].label, m->label) == 0) return &p->rows[i];
    if (p->n_rows == PROF_ROWS) return &p->rows[PROF_ROWS - 1];   /* overflow lands in the last row */
    prof_row *r = &p->rows[p->n_rows++];
    *r = (prof_row){.label = m->label, .pipe = m->pipe};
    snprintf(r->kernel, sizeof r->kernel, "%s", m->kernel);
    return r;
}

static double since_ns(const struct timespec *t0) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) * 1e9 + (double)(t1.tv_nsec - t0->tv_nsec);
}

void vk_prof_submitted(moex_vk_cmd *c) { clock_gettime(CLOCK_MONOTONIC, &c->prof->t0); }

/* After the fence: read this run's timestamps and add them to the rows. */
void vk_prof_collect(moex_vk_cmd *c) {
    vk_prof *p = c->prof;
    const double host = since_ns(&p->t0);
    if (p->n < 2) return;
    uint64_t ts[PROF_QUERIES];
    if (vkGetQueryPoolResults(c->vk->dev, p->pool, 0, p->n, sizeof ts, ts, sizeof ts[0],
                              VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) != VK_SUCCESS)
        return;
    const double period = c->vk->ts_period;
    for (uint32_t i = 1; i < p->n; i++) {
        prof_row *r = row_for(p, &p->marks[i]);
        r->ns += (double)(ts[i] - ts[i - 1]) * period;
        r->ops++;
    }
    p->gpu_ns += (double)(ts[p->n - 1] - ts[0]) * period;
    p->host_ns += host;
    p->runs++;
}

static void print_table(const moex_vk_cmd *c) {
    const vk_prof *p = c->prof;
    const double runs = (double)p->runs, ops = p->n > 0 ? p->n - 1 : 0;
    fprintf(stderr, "vkprof recording: %.0f timed ops, %ld runs, GPU %.1f us/run (first to last timestamp), "
                    "host submit-to-fence %.1f us/run\n",
            ops, p->runs, p->gpu_ns / runs / 1e3, p->host_ns / runs / 1e3);
    fprintf(stderr, "vkprof %-16s %-18s %8s %10s %8s %6s\n", "label", "kernel", "ops/run", "us/run", "us/op", "share");
    for (int i = 0; i < p->n_rows; i++) {
        const prof_row *r = &p->rows[i];
        fprintf(stderr, "vkprof %-16s %-18s %8.1f %10.1f %8.2f %5.1f%%\n", r->label, r->kernel, (double)r->ops / runs,
                r->ns / runs / 1e3, r->ns / (double)r->ops / 1e3, 100.0 * r->ns / (p->gpu_ns > 0 ? p->gpu_ns : 1));
    }
}

/* Prints the table of the runs since the last flush, then starts afresh. */
static void flush(moex_vk_cmd *c) {
    vk_prof *p = c->prof;
    bool kernels = false;
    for (int i = 0; i < p->n_rows; i++) kernels |= p->rows[i].pipe != VK_NULL_HANDLE;
    if (p->runs > 0 && p->n > PROF_MIN_OPS && kernels) print_table(c);
    p->n_rows = 0;
    p->runs = 0;
    p->gpu_ns = p->host_ns = 0;
}

void vk_prof_free(moex_vk_cmd *c) {
    vk_prof *p = c->prof;
    if (!p) return;
    flush(c);
    vkDestroyQueryPool(c->vk->dev, p->pool, NULL);
    free(p);
    c->prof = NULL;
}
