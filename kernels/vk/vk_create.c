/* moex_vk_create and moex_vk_free: the top of the backend (vk_internal.h).
 * The options are read here, once per device: the tuning and expert shapes
 * (vk->tune, vk->ex_shape: vk_shapes.c reads them), the cooperative-matrix
 * mode, profiling and the cache directory ($MOEX_VK_CACHE, an operational
 * setting); then the device, the pipeline cache and the profiler are wired
 * together. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/vk/vk_internal.h"

/* --vk-tune ex_shape=GWG:GRT:GRU:DWG:DRT:DRU: the one-token expert FFN's
 * workgroups (gate+up, then down: threads, rows, rows loaded together), for
 * tuning on another GPU; six more numbers set the batches' (VK_EX_MANY
 * tokens or more) the same way, six more the few-positions shapes. A shape
 * that does not fit is refused with a warning. */
static void read_ex_shape(moex_vk *vk, const char *e) {
    if (!*e) return;
    int v[18], n = 0;   /* six, twelve or eighteen colon-separated integers, nothing after them */
    const char *p = e;
    while (n < 18) {
        char *end;
        v[n++] = (int)strtol(p, &end, 10);
        if (end == p) break;   /* not a number: p stays on it, so the setting is refused */
        p = end;
        if (*p != ':') break;
        p++;
    }
    vk_ex_shape s[6];
    for (int i = 0; i < n / 3; i++) s[i] = (vk_ex_shape){v[3 * i], v[3 * i + 1], v[3 * i + 2]};
    bool ok = (n == 6 || n == 12 || n == 18) && !*p;
    for (int i = 0; ok && i < n / 3; i++) ok = vk_ex_shape_ok(vk, i % 2, s[i]);
    if (!ok) {
        moex_log(MOEX_LOG_WARN,
                 "vulkan: --vk-tune ex_shape=%s ignored: give six numbers GWG:GRT:GRU:DWG:DRT:DRU (one token), "
                 "twelve (one token, then batches) or eighteen (then few positions), with RU <= RT <= WG <= 1024 and "
                 "RU dividing RT (e.g. 64:8:2:192:4:2)",
                 e);
        return;
    }
    for (int i = 0; i < n / 3; i++) vk->ex_shape[i % 2][i / 2] = s[i];
}

static void set_cache_dir(moex_vk *vk, const char *dir) {
    const char *env = getenv("MOEX_VK_CACHE"), *home = getenv("HOME");
    if (dir) snprintf(vk->cache_dir, sizeof vk->cache_dir, "%s", dir);
    else if (env) snprintf(vk->cache_dir, sizeof vk->cache_dir, "%s", env);
    else if (home) snprintf(vk->cache_dir, sizeof vk->cache_dir, "%s/.cache/moex-vk", home);
}

moex_vk *moex_vk_create(const moex_vk_options *opt, moex_error *err) {
    const moex_vk_options def = {.device = -1};
    if (!opt) opt = &def;
    moex_vk *vk = calloc(1, sizeof *vk);
    if (!vk) {
        moex_fail(err, "out of memory");
        return NULL;
    }
    vk->verbose = opt->verbose;
    vk->profile = opt->tune.profile;
    vk_tuning_resolve(&opt->tune, &vk->tune);
    set_cache_dir(vk, opt->cache_dir);
    if (vk_device_open(vk, opt, opt->coop, err)) {
        moex_vk_free(vk);
        return NULL;
    }
    /* A wait that sleeps in the driver at once answers a submit late (and
     * leaves the GPU at its idle clock between short bursts): polling first
     * decoded 5-20 % faster on the H200 for the whole model and 20 % for the
     * CPU tier after a short prompt (docs/PERF.md). A CPU device (lavapipe)
     * runs the submit on the cores a poll would take: it blocks at once. */
    if (vk->tune.spin_us == 0) vk->tune.spin_us = strcmp(vk->info.type, "cpu") ? VK_SPIN_US_DEFAULT : 0;
    if (vk->tune.spin_us < 0) vk->tune.spin_us = 0;
    memcpy(vk->ex_shape, vk_ex_default_shapes, sizeof vk->ex_shape);
    read_ex_shape(vk, opt->tune.ex_shape);   /* after the device: a shape must fit its shared memory */
    vk_pipeline_cache_open(vk);
    if (vk->verbose)
        moex_log(MOEX_LOG_INFO, "vulkan: %s (%s), subgroup %u%s, f16 %d, int dot %d%s, shared %u KiB, %.1f GiB, "
                 "coop %s %ux%ux%u", vk->info.name, vk->info.type, vk->info.subgroup_size,
                 vk->use_subgroup ? " (reductions)" : "", vk->info.f16, vk->info.int_dot,
                 vk->info.int_dot_fast ? " (hardware)" : "", vk->info.shared_mem >> 10,
                 vk->info.device_mem / 1073741824.0,
                 vk->info.coop == 1 ? "nv" : vk->info.coop == 2 ? "emulated" : "off", vk->info.coop_m,
                 vk->info.coop_n, vk->info.coop_k);
    return vk;
}

void moex_vk_free(moex_vk *vk) {
    if (!vk) return;
    if (vk->dev) {
        vkDeviceWaitIdle(vk->dev);
        moex_vk_buffer_free(vk->actq);
        vk_pipelines_free(vk);
        vk_pipeline_cache_close(vk);
    }
    vk_device_close(vk);
    free(vk);
}
