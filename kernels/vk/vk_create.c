/* moex_vk_create and moex_vk_free: the top of the backend (vk_internal.h).
 * The environment is read here, once per device: the tuning switches and
 * expert shapes (vk->tune, vk->ex_shape: vk_shapes.c reads them), the
 * cooperative-matrix mode, profiling and the cache directory; then the
 * device, the pipeline cache and the profiler are wired together. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/vk/vk_internal.h"

/* An environment switch set to anything but "" or "0". */
static bool env_on(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

static void read_tuning(vk_tuning *t) {
    t->attn_simple = env_on("MOEX_VK_ATTN_SIMPLE");
    t->attn_no_coop = env_on("MOEX_VK_ATTN_NO_COOP");
    t->coop_wide = moex_env_int("MOEX_VK_COOP_NARROW", -1) == 0;
    t->coop_bm = moex_env_int("MOEX_VK_COOP_BM", -1) == 128 ? 128 : VK_COOP_BM;
    t->coop_bk = moex_env_int("MOEX_VK_COOP_BK", -1) == 32 ? 32 : VK_COOP_BK;
    t->coop_nbuf = moex_env_int("MOEX_VK_COOP_NBUF", -1) == 2 ? 2 : 1;
    const int rpt = moex_env_int("MOEX_VK_MV_RPT", -1);
    t->mv_rpt = rpt >= 1 && rpt <= 8 ? rpt : 0;
    const int groups = moex_env_int("MOEX_VK_MV_GROUPS", -1);
    t->mv_groups = groups >= 1 && groups <= 32 ? groups : 0;
    const int tokens = moex_env_int("MOEX_VK_MV_TOKENS", -1);
    t->mv_tokens = tokens >= 1 && tokens <= VK_MV_TPW_I8 ? tokens : VK_MV_TPW_I8;   /* the variant's most: vk_ops.c */
    const int bwg = moex_env_int("MOEX_VK_MV_BATCH_WG", -1);
    t->mv_batch_wg = bwg >= 0 ? bwg : VK_MV_BATCH_WG;
    t->gu_off = moex_env_int("MOEX_VK_GU", -1) == 0;
    const int gwg = moex_env_int("MOEX_VK_GU_WG", -1), gru = moex_env_int("MOEX_VK_GU_RU", -1);
    t->gu_wg = gwg >= 64 && gwg <= 1024 ? gwg : 0;
    t->gu_ru = gru >= 1 && gru <= 16 ? gru : 0;
    const int gch = moex_env_int("MOEX_VK_GU_CH", -1);
    t->gu_ch = gch >= 16 && gch <= 256 && gch % 16 == 0 ? gch : 0;
    t->idot = moex_env_int("MOEX_VK_IDOT", -1);
    t->spin_us = moex_env_int("MOEX_VK_SPIN_US", -1);   /* unset (-1): block at once; polling measured no faster */
    t->ex_preq = moex_env_int("MOEX_VK_EX_PREQ", -1);
    t->each_unstaged = moex_env_int("MOEX_VK_EACH_STAGED", -1) == 0;
}

/* MOEX_VK_EX_SHAPE="GWG,GRT,GRU,DWG,DRT,DRU": the one-token expert FFN's
 * workgroups (gate+up, then down: threads, rows, rows loaded together), for
 * tuning on another GPU; six more numbers set the batches' (VK_EX_MANY
 * tokens or more) the same way, six more the few-positions shapes. A shape
 * that does not fit is refused with a warning. */
static void read_ex_shape(moex_vk *vk) {
    const char *e = getenv("MOEX_VK_EX_SHAPE");
    if (!e || !*e) return;
    int v[18], n = 0;   /* six, twelve or eighteen comma-separated integers, nothing after them */
    const char *p = e;
    while (n < 18) {
        char *end;
        v[n++] = (int)strtol(p, &end, 10);
        if (end == p) break;   /* not a number: p stays on it, so the setting is refused */
        p = end;
        if (*p != ',') break;
        p++;
    }
    vk_ex_shape s[6];
    for (int i = 0; i < n / 3; i++) s[i] = (vk_ex_shape){v[3 * i], v[3 * i + 1], v[3 * i + 2]};
    bool ok = (n == 6 || n == 12 || n == 18) && !*p;
    for (int i = 0; ok && i < n / 3; i++) ok = vk_ex_shape_ok(vk, i % 2, s[i]);
    if (!ok) {
        moex_log(MOEX_LOG_WARN,
                 "vulkan: MOEX_VK_EX_SHAPE=%s ignored: give six numbers GWG,GRT,GRU,DWG,DRT,DRU (one token), "
                 "twelve (one token, then batches) or eighteen (then few positions), with RU <= RT <= WG <= 1024 and "
                 "RU dividing RT (e.g. 64,8,2,192,4,2)",
                 e);
        return;
    }
    for (int i = 0; i < n / 3; i++) vk->ex_shape[i % 2][i / 2] = s[i];
}

/* The cooperative-matrix mode: the option, or where it is AUTO the
 * environment (MOEX_VK_NO_COOP=1, MOEX_VK_COOP_EMULATE=1), for comparisons
 * from the command line. */
static int coop_mode(int opt) {
    if (opt != MOEX_VK_COOP_AUTO) return opt;
    return env_on("MOEX_VK_NO_COOP") ? MOEX_VK_COOP_OFF : env_on("MOEX_VK_COOP_EMULATE") ? MOEX_VK_COOP_EMULATE
                                                                                        : MOEX_VK_COOP_AUTO;
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
    vk->profile = env_on("MOEX_VK_PROFILE");
    read_tuning(&vk->tune);
    set_cache_dir(vk, opt->cache_dir);
    if (vk_device_open(vk, opt, coop_mode(opt->coop), err)) {
        moex_vk_free(vk);
        return NULL;
    }
    memcpy(vk->ex_shape, vk_ex_default_shapes, sizeof vk->ex_shape);
    read_ex_shape(vk);   /* after the device: a shape must fit its shared memory */
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
