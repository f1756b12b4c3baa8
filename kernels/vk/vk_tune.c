/* --vk-tune: the backend's tuning (moex_vk_tuning, vk.h) from "KEY=VALUE,..."
 * and its translation into what the kernels read (vk_internal.h vk_tuning).
 * The keys keep the values the old environment switches took, so that a
 * setting docs/PERF.md records (e.g. idot=0) means what it meant. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/vk/vk_internal.h"

typedef enum {
    K_SPIN_US, K_IDOT, K_COOP_NARROW, K_COOP_BM, K_COOP_BK, K_COOP_NBUF, K_MV_RPT, K_MV_GROUPS, K_MV_TOKENS,
    K_MV_BATCH_WG, K_GU_WG, K_GU_RU, K_GU_CH, K_EX_SHAPE, K_PROFILE, K_COOP, N_KEYS
} tune_key;

typedef struct tune_spec {
    const char *name;
    int lo, hi;          /* the whole numbers it takes (ex_shape and coop take text) */
    const char *help;
} tune_spec;

static const tune_spec specs[N_KEYS] = {
    [K_SPIN_US] = {"spin_us", 0, 1000000, "a submit's wait polls its fence this many us before it blocks (0: never)"},
    [K_IDOT] = {"idot", 0, 1, "int8 decode activations: 1 wherever integer dot products exist, 0 never"},
    [K_COOP_NARROW] = {"coop_narrow", 0, 1, "0: dense cooperative products keep 64-token tiles"},
    [K_COOP_BM] = {"coop_bm", 64, 128, "mm_coop.comp tile rows: 64 or 128"},
    [K_COOP_BK] = {"coop_bk", 32, 64, "mm_coop.comp columns per step: 32 or 64"},
    [K_COOP_NBUF] = {"coop_nbuf", 1, 2, "2: double-buffered cooperative tiles"},
    [K_MV_RPT] = {"mv_rpt", 1, 8, "rows per thread of the staged one-token products"},
    [K_MV_GROUPS] = {"mv_groups", 1, 32, "row groups per workgroup of those products"},
    [K_MV_TOKENS] = {"mv_tokens", 1, VK_MV_TPW_I8, "tokens a workgroup of the batched head takes at most"},
    [K_MV_BATCH_WG] = {"mv_batch_wg", 0, 1 << 20, "workgroups of a batch's staged product (0: each token's own)"},
    [K_GU_WG] = {"gu_wg", 64, 1024, "experts_gu.comp's threads per workgroup"},
    [K_GU_RU] = {"gu_ru", 1, 16, "experts_gu.comp's rows loaded together"},
    [K_GU_CH] = {"gu_ch", 16, 256, "experts_gu.comp's rows per workgroup (a multiple of 16)"},
    [K_EX_SHAPE] = {"ex_shape", 0, 0, "GWG:GRT:GRU:DWG:DRT:DRU (6, 12 or 18 numbers): expert FFN workgroups"},
    [K_PROFILE] = {"profile", 0, 1, "1: GPU timestamps around every op, a table per recording"},
    [K_COOP] = {"coop", 0, 0, "auto|off|emulate: prompt products on cooperative matrices"},
};

static int set_text(moex_vk_options *o, tune_key k, const char *v, size_t len, moex_error *err) {
    if (k == K_EX_SHAPE) {
        if (len >= sizeof o->tune.ex_shape) return moex_fail(err, "--vk-tune ex_shape: too long");
        memcpy(o->tune.ex_shape, v, len);
        o->tune.ex_shape[len] = 0;
        return 0;
    }
    static const char *const modes[] = {[MOEX_VK_COOP_AUTO] = "auto", [MOEX_VK_COOP_OFF] = "off",
                                        [MOEX_VK_COOP_EMULATE] = "emulate"};
    for (int m = 0; m < 3; m++)
        if (strlen(modes[m]) == len && !memcmp(modes[m], v, len)) {
            o->coop = m;
            return 0;
        }
    return moex_fail(err, "--vk-tune coop wants auto, off or emulate, not '%.*s'", (int)len, v);
}

static void set_number(moex_vk_tuning *t, tune_key k, int v) {
    switch (k) {
    case K_SPIN_US: t->spin_us = v ? v : -1; break;   /* 0 asked for: block at once, whatever the default */
    case K_IDOT: t->idot = v ? 1 : 2; break;
    case K_COOP_NARROW: t->coop_wide = !v; break;
    case K_COOP_BM: t->coop_bm = v; break;
    case K_COOP_BK: t->coop_bk = v; break;
    case K_COOP_NBUF: t->coop_nbuf = v; break;
    case K_MV_RPT: t->mv_rpt = v; break;
    case K_MV_GROUPS: t->mv_groups = v; break;
    case K_MV_TOKENS: t->mv_tokens = v; break;
    case K_MV_BATCH_WG: t->mv_batch_wg = v ? v : -1; break;
    case K_GU_WG: t->gu_wg = v; break;
    case K_GU_RU: t->gu_ru = v; break;
    case K_GU_CH: t->gu_ch = v; break;
    case K_PROFILE: t->profile = v; break;
    default: break;
    }
}

static bool number_ok(tune_key k, long v) {
    if (v < specs[k].lo || v > specs[k].hi) return false;
    if (k == K_COOP_BM) return v == 64 || v == 128;
    if (k == K_COOP_BK) return v == 32 || v == 64;
    if (k == K_GU_CH) return v % 16 == 0;
    return true;
}

/* One "KEY=VALUE" of len bytes. */
static int parse_one(moex_vk_options *o, const char *s, size_t len, moex_error *err) {
    const char *eq = memchr(s, '=', len);
    if (!eq) return moex_fail(err, "--vk-tune wants KEY=VALUE, not '%.*s' (keys: see --help)", (int)len, s);
    const size_t klen = (size_t)(eq - s), vlen = len - klen - 1;
    for (int k = 0; k < N_KEYS; k++) {
        if (strlen(specs[k].name) != klen || memcmp(specs[k].name, s, klen)) continue;
        if (k == K_EX_SHAPE || k == K_COOP) return set_text(o, (tune_key)k, eq + 1, vlen, err);
        char buf[16], *end;
        if (vlen == 0 || vlen >= sizeof buf) return moex_fail(err, "--vk-tune %s wants a number", specs[k].name);
        memcpy(buf, eq + 1, vlen);
        buf[vlen] = 0;
        const long v = strtol(buf, &end, 10);
        if (*end || !number_ok((tune_key)k, v))
            return moex_fail(err, "--vk-tune %s=%s: it takes %d..%d (%s)", specs[k].name, buf, specs[k].lo,
                             specs[k].hi, specs[k].help);
        set_number(&o->tune, (tune_key)k, (int)v);
        return 0;
    }
    return moex_fail(err, "--vk-tune: no key '%.*s' (keys: see --help)", (int)klen, s);
}

int moex_vk_options_tune(moex_vk_options *o, const char *spec, moex_error *err) {
    const char *p = spec;
    while (*p) {
        const char *comma = strchr(p, ','), *end = comma ? comma : p + strlen(p);
        if (end > p && parse_one(o, p, (size_t)(end - p), err)) return -1;
        p = comma ? comma + 1 : end;
    }
    return 0;
}

/* What the kernels read: each zero of moex_vk_tuning as its default. */
void vk_tuning_resolve(const moex_vk_tuning *t, vk_tuning *out) {
    *out = (vk_tuning){
        .coop_wide = t->coop_wide,
        .coop_bm = t->coop_bm == 128 ? 128 : VK_COOP_BM,
        .coop_bk = t->coop_bk == 32 ? 32 : VK_COOP_BK,
        .coop_nbuf = t->coop_nbuf == 2 ? 2 : 1,
        .mv_rpt = t->mv_rpt,
        .mv_groups = t->mv_groups,
        .mv_tokens = t->mv_tokens >= 1 && t->mv_tokens <= VK_MV_TPW_I8 ? t->mv_tokens : VK_MV_TPW_I8,
        .mv_batch_wg = t->mv_batch_wg < 0 ? 0 : t->mv_batch_wg ? t->mv_batch_wg : VK_MV_BATCH_WG,
        .gu_wg = t->gu_wg,
        .gu_ru = t->gu_ru,
        .gu_ch = t->gu_ch,
        .idot = t->idot == 1 ? 1 : t->idot == 2 ? 0 : -1,
        .spin_us = t->spin_us,
        .ex_preq = -1,
        .each_unstaged = t->each_unstaged,
    };
}
