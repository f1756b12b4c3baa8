/* Compute pipelines: the SPIR-V variants compiled at build time
 * (shaders/variants.cmake) specialised for this device, one pipeline per
 * (kernel, weight type, mode), created on first use or up front
 * (moex_vk_warm_begin / moex_vk_warm_end, in parallel), with a
 * VkPipelineCache kept on disk so that drivers can skip their own compile on
 * the next run. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/vk/vk_internal.h"

/* Kernel names in the profile table ("mv/t12/m41") and in errors. */
static const char *const kernel_name[VK_K_COUNT] = {
    [VK_K_DEQUANT] = "dequant", [VK_K_MV] = "mv", [VK_K_MM] = "mm", [VK_K_TOPK] = "topk",
    [VK_K_RMSNORM] = "rmsnorm", [VK_K_QKROPE] = "qkrope", [VK_K_ATTN] = "attn", [VK_K_ATTN_MERGE] = "attn_merge",
    [VK_K_MOE_SORT] = "moe_sort", [VK_K_MOE_COMBINE] = "moe_comb", [VK_K_ELTWISE] = "eltwise",
    [VK_K_ARGMAX] = "argmax", [VK_K_ACTQ] = "actq", [VK_K_EXPERTS_MV] = "experts_mv", [VK_K_MM_COOP] = "mm_coop",
    [VK_K_ATTN_COOP] = "attn_coop", [VK_K_ATTN_DEC] = "attn_dec", [VK_K_EXPERTS_GU] = "experts_gu",
    [VK_K_EXPERTS_XQ] = "experts_xq",
};

/* Kernels with a variant per weight type (TYPE and _quant.comp). */
static bool is_typed(vk_kernel k) {
    return k == VK_K_DEQUANT || k == VK_K_MV || k == VK_K_MM || k == VK_K_EXPERTS_MV || k == VK_K_MM_COOP ||
           k == VK_K_EXPERTS_GU || k == VK_K_EXPERTS_XQ;
}

int vk_type_slot(moex_type t) {
    switch (t) {
    case MOEX_TYPE_F32: case MOEX_TYPE_F16: case MOEX_TYPE_Q4_0: case MOEX_TYPE_Q4_1: case MOEX_TYPE_Q5_0:
    case MOEX_TYPE_Q5_1: case MOEX_TYPE_Q8_0: case MOEX_TYPE_Q4_K: case MOEX_TYPE_Q5_K: case MOEX_TYPE_Q6_K:
        return (int)t;
    case MOEX_TYPE_BF16: return 15; /* slot 15 (Q8_K) is never a weight */
    default: return -1;
    }
}

bool moex_vk_type_supported(moex_type t) { return vk_type_slot(t) >= 0; }

/* ---- which SPIR-V, specialised how ---- */

/* The SPIR-V variant of a pipeline: the mode bits that change the shader's
 * code (the others only specialise it), and its flags on this device. */
static void variant_of(const moex_vk *vk, vk_kernel k, int mode, int *vmode, int *flags) {
    *vmode = mode;
    *flags = 0;
    switch (k) {
    case VK_K_MV: case VK_K_TOPK: case VK_K_ATTN_DEC:
        *flags = vk->use_subgroup ? VK_SPIRV_SUBGROUP : 0;
        break;
    case VK_K_EXPERTS_MV: {
        /* subgroup sums only over whole subgroups: a shape that is not a
         * multiple of the subgroup size (96 threads on a 64-wide device)
         * reduces through shared memory instead */
        const vk_ex_shape *s = VK_EX_MODE_SHAPE(vk, mode);
        *vmode = mode & (VK_EX_DOWN | VK_EX_GENERIC | VK_EX_IDOT | VK_EX_PREQ);
        *flags = vk->use_subgroup && s->wg % vk->tpr == 0 ? VK_SPIRV_SUBGROUP : 0;
        break;
    }
    case VK_K_EXPERTS_GU:
        *vmode = mode & VK_GU_IDOT;
        *flags = vk_gu_shape_of(vk, 1 << (mode & (VK_GU_IDOT - 1))).subgroup ? VK_SPIRV_SUBGROUP : 0;
        break;
    case VK_K_MM_COOP:
        *vmode = mode & (3 | VK_COOP_GENERIC);
        *flags = vk->info.coop != 1 ? VK_SPIRV_EMU : 0;
        break;
    case VK_K_ATTN_COOP:
        *flags = vk->info.coop != 1 ? VK_SPIRV_EMU : 0;
        break;
    default:
        break;
    }
}

static const vk_spirv *find_spirv(const moex_vk *vk, vk_kernel k, moex_type type, int mode, moex_error *err) {
    int vmode, flags;
    variant_of(vk, k, mode, &vmode, &flags);
    const int t = is_typed(k) ? (int)type : 0;
    const vk_spirv_table *tab = vk_spirv_tables[k];
    for (int i = 0; tab && i < tab->n; i++)
        if (tab->rows[i].type == t && tab->rows[i].mode == vmode && tab->rows[i].flags == flags) return &tab->rows[i];
    const moex_type_traits *tt = moex_type_get(type);
    moex_fail(err, "vulkan: %s.comp has no SPIR-V for %s mode %d%s%s (kernels/vk/shaders/variants.cmake does not build it)",
              kernel_name[k], is_typed(k) && tt ? tt->name : "-", vmode, flags & VK_SPIRV_SUBGROUP ? " with subgroups" : "",
              flags & VK_SPIRV_EMU ? " emulated" : "");
    return NULL;
}

/* Specialization constants: (constant_id, value) pairs. */
typedef struct vk_spec {
    uint32_t id[16], value[16];
    int n;
} vk_spec;

static void spec(vk_spec *s, uint32_t id, uint32_t value) {
    s->id[s->n] = id;
    s->value[s->n++] = value;
}

/* The device's numbers for each kernel's constant_ids (see each shader). */
static void specialize(const moex_vk *vk, vk_kernel k, moex_type type, int mode, vk_spec *s) {
    s->n = 0;
    switch (k) {
    case VK_K_MV: {
        const uint32_t groups = (uint32_t)vk_mv_row_groups(vk, mode);
        spec(s, 0, (uint32_t)vk->tpr * groups);   /* WG */
        spec(s, 1, (uint32_t)vk->tpr);            /* TPR */
        spec(s, 2, groups);                       /* GROUPS */
        spec(s, 3, (uint32_t)vk_mv_rpt(vk, mode));   /* NR */
        if (mode & VK_MV_TOKENS) spec(s, 4, (uint32_t)vk_mv_stage_copies(vk, type, mode));   /* XCOPIES */
        break;
    }
    case VK_K_TOPK:
        spec(s, 0, (uint32_t)vk->tpr);   /* SG */
        break;
    case VK_K_EXPERTS_MV: {
        const vk_ex_shape *e = VK_EX_MODE_SHAPE(vk, mode);
        spec(s, 0, (uint32_t)e->wg);
        spec(s, 1, (uint32_t)e->rt);
        spec(s, 2, (uint32_t)e->ru);
        spec(s, 3, (uint32_t)((mode >> 2) & 3) + 1);   /* PPT */
        break;
    }
    case VK_K_EXPERTS_GU: {   /* mode: log2 of a row's 32-column positions | VK_GU_IDOT */
        const vk_gu_shape g = vk_gu_shape_of(vk, 1 << (mode & (VK_GU_IDOT - 1)));
        spec(s, 0, (uint32_t)g.wg);
        spec(s, 1, (uint32_t)g.npos);
        spec(s, 2, (uint32_t)g.rl);
        spec(s, 3, (uint32_t)g.ru);
        spec(s, 4, (uint32_t)g.ch);
        spec(s, 5, (uint32_t)vk->tpr);   /* SG */
        break;
    }
    case VK_K_MM_COOP: {
        const int bk = vk->tune.coop_bk, bn = mode & VK_COOP_NARROW ? 32 : VK_COOP_BN;
        spec(s, 0, (uint32_t)vk->tune.coop_bm);   /* BM */
        spec(s, 1, (uint32_t)bn);
        spec(s, 2, (uint32_t)bk);
        spec(s, 3, vk->info.coop_m);
        spec(s, 4, vk->info.coop_n);
        spec(s, 5, vk->info.coop_k);
        spec(s, 6, (uint32_t)vk_coop_nbuf(vk, mode & 3, bk, bn));   /* NBUF */
        break;
    }
    case VK_K_ATTN_COOP: {   /* mode: head_dim class (vk_attn.c attn_coop_mode) */
        uint32_t warps = 4, bc = 32;
        vk_attn_coop_config(vk, mode, &warps, &bc);
        spec(s, 0, 32 * warps);   /* NT */
        spec(s, 1, bc);
        break;
    }
    default:
        break;
    }
    if (is_typed(k)) {   /* _quant.comp's block of TYPE */
        spec(s, 14, (uint32_t)moex_type_get(type)->block_elems);
        spec(s, 15, (uint32_t)moex_type_get(type)->block_bytes);
    }
}

/* Creates p's VkPipeline. Reads vk only, so threads may create several at once. */
static int create_pipe(moex_vk *vk, vk_pipe *p, moex_error *err) {
    const vk_spirv *v = find_spirv(vk, p->kernel, p->type, p->mode, err);
    if (!v) return -1;
    VkShaderModuleCreateInfo mci = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                    .codeSize = v->words * 4, .pCode = v->code};
    VkShaderModule mod;
    if (vk_check(vkCreateShaderModule(vk->dev, &mci, NULL, &mod), "vkCreateShaderModule", err)) return -1;
    vk_spec sp;
    specialize(vk, p->kernel, p->type, p->mode, &sp);
    VkSpecializationMapEntry entries[16];
    for (int i = 0; i < sp.n; i++)
        entries[i] = (VkSpecializationMapEntry){.constantID = sp.id[i], .offset = (uint32_t)i * 4, .size = 4};
    const VkSpecializationInfo si = {.mapEntryCount = (uint32_t)sp.n, .pMapEntries = entries,
                                     .dataSize = (size_t)sp.n * 4, .pData = sp.value};
    VkComputePipelineCreateInfo pci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = mod, .pName = "main", .pSpecializationInfo = sp.n ? &si : NULL},
        .layout = vk->layout};
    const VkResult r = vkCreateComputePipelines(vk->dev, vk->pcache, 1, &pci, NULL, &p->handle);
    vkDestroyShaderModule(vk->dev, mod, NULL);
    if (r != VK_SUCCESS) {
        p->handle = VK_NULL_HANDLE;
        return moex_fail(err, "vulkan: creating the pipeline %s failed (VkResult %d)", p->name, (int)r);
    }
    return 0;
}

/* ---- the table ---- */

const vk_pipe *vk_pipeline(moex_vk *vk, vk_kernel k, moex_type type, int mode, moex_error *err) {
    const bool typed = is_typed(k);
    const int slot = typed ? vk_type_slot(type) : 0;
    if (slot < 0) {
        const moex_type_traits *tt = moex_type_get(type);
        moex_fail(err, "vulkan: no GPU kernels for tensor type %s", tt ? tt->name : "?");
        return NULL;
    }
    vk_pipe *p = vk->pipes[k][slot][mode];
    if (p && (p->handle || vk->warming)) return p;
    if (p) {   /* noted by a moex_vk_warm_begin whose moex_vk_warm_end never came: create it now */
        if (create_pipe(vk, p, err)) return NULL;
        return p;
    }
    if (!(p = calloc(1, sizeof *p))) {
        moex_fail(err, "out of memory");
        return NULL;
    }
    *p = (vk_pipe){.kernel = k, .type = typed ? type : MOEX_TYPE_F32, .mode = mode};
    snprintf(p->name, sizeof p->name, "%s/t%d/m%d", kernel_name[k], slot, mode);
    /* warming: only noted, but its SPIR-V must exist */
    if (vk->warming ? !find_spirv(vk, k, p->type, mode, err) : create_pipe(vk, p, err) != 0) {
        free(p);
        return NULL;
    }
    vk->pipes[k][slot][mode] = p;
    return p;
}

static void drop(moex_vk *vk, vk_pipe **slot) {
    if (!*slot) return;
    if ((*slot)->handle) vkDestroyPipeline(vk->dev, (*slot)->handle, NULL);
    free(*slot);
    *slot = NULL;
}

void vk_pipelines_forget(moex_vk *vk, vk_kernel k) {
    vkDeviceWaitIdle(vk->dev);
    for (int t = 0; t < VK_TYPE_SLOTS; t++)
        for (int m = 0; m < VK_MODES; m++) drop(vk, &vk->pipes[k][t][m]);
}

void vk_pipelines_free(moex_vk *vk) {
    for (int k = 0; k < VK_K_COUNT; k++)
        for (int t = 0; t < VK_TYPE_SLOTS; t++)
            for (int m = 0; m < VK_MODES; m++) drop(vk, &vk->pipes[k][t][m]);
}

/* ---- up front, in parallel ---- */

void moex_vk_warm_begin(moex_vk *vk) { vk->warming = true; }

int moex_vk_pipeline_count(const moex_vk *vk) {
    int n = 0;
    for (int k = 0; k < VK_K_COUNT; k++)
        for (int t = 0; t < VK_TYPE_SLOTS; t++)
            for (int m = 0; m < VK_MODES; m++) n += vk->pipes[k][t][m] && vk->pipes[k][t][m]->handle;
    return n;
}

typedef struct warm_work {
    moex_vk *vk;
    vk_pipe **todo;
    int n;
    atomic_int next;
} warm_work;

static void *warm_worker(void *arg) {
    warm_work *w = arg;
    for (int i; (i = atomic_fetch_add(&w->next, 1)) < w->n;) {
        moex_error e = {{0}};
        if (create_pipe(w->vk, w->todo[i], &e)) {
            w->todo[i]->failed = true;
            moex_log(MOEX_LOG_WARN, "%s (tried again when first used)", e.msg);
        }
    }
    return NULL;
}

/* Threads for n pipelines: the machine's cores, at most 16, the caller one of them. */
static int warm_threads(int n) {
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int t = cores < 1 ? 1 : cores > 16 ? 16 : (int)cores;
    return t < n ? t : n;
}

int moex_vk_warm_end(moex_vk *vk, moex_error *err) {
    vk->warming = false;
    int n = 0;
    for (int k = 0; k < VK_K_COUNT; k++)
        for (int t = 0; t < VK_TYPE_SLOTS; t++)
            for (int m = 0; m < VK_MODES; m++) n += vk->pipes[k][t][m] && !vk->pipes[k][t][m]->handle;
    if (n == 0) return 0;
    warm_work w = {.vk = vk, .todo = calloc((size_t)n, sizeof *w.todo)};
    if (!w.todo) return moex_fail(err, "out of memory");
    for (int k = 0; k < VK_K_COUNT; k++)
        for (int t = 0; t < VK_TYPE_SLOTS; t++)
            for (int m = 0; m < VK_MODES; m++)
                if (vk->pipes[k][t][m] && !vk->pipes[k][t][m]->handle) w.todo[w.n++] = vk->pipes[k][t][m];
    atomic_init(&w.next, 0);
    pthread_t th[16];
    int started = 0;
    for (int i = 1; i < warm_threads(n); i++) started += pthread_create(&th[started], NULL, warm_worker, &w) == 0;
    warm_worker(&w);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    free(w.todo);
    for (int k = 0; k < VK_K_COUNT; k++)   /* the failed ones: created (or reported) when first used */
        for (int t = 0; t < VK_TYPE_SLOTS; t++)
            for (int m = 0; m < VK_MODES; m++)
                if (vk->pipes[k][t][m] && vk->pipes[k][t][m]->failed) drop(vk, &vk->pipes[k][t][m]);
    if (vk->verbose) moex_log(MOEX_LOG_INFO, "vulkan: %d pipelines created up front", n);
    return 0;
}

/* Where the ops switch kernels as the batch grows: one token (the fused
 * decode kernels), a few (matrix-vector products), VK_EX_MANY (the expert
 * FFN's batch shapes), past VK_MV_NMAX (the tiles), VK_ATTN_COOP_MIN
 * (attention on the matrix unit) and past VK_COOP_BN (32-token coop tiles
 * where a product has few row tiles; n_batch gives the 64-token ones where
 * it has many). */
int moex_vk_warm_batch_sizes(int64_t n_batch, int64_t sizes[8]) {
    static const int64_t first[] = {1, 2, VK_EX_MANY, VK_MV_NMAX + 1, VK_ATTN_COOP_MIN, VK_COOP_BN + 1};
    int n = 0;
    for (size_t i = 0; i < sizeof first / sizeof first[0]; i++)
        if (first[i] <= n_batch) sizes[n++] = first[i];
    if (n > 0 && n_batch > sizes[n - 1]) sizes[n++] = n_batch;
    return n;
}

/* ---- the pipeline cache on disk ---- */

static uint64_t fnv1a(const void *p, size_t n, uint64_t h) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ULL;
    return h;
}

static int mkdirs(const char *path) {
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(tmp, 0755) && errno != EEXIST ? -1 : 0;
}

static void *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    void *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long len = ftell(f);
        if (len > 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)len)) &&
            fread(buf, 1, (size_t)len, f) != (size_t)len) {
            free(buf);
            buf = NULL;
        }
        *n = len > 0 ? (size_t)len : 0;
    }
    fclose(f);
    return buf;
}

/* Best effort: a cache that cannot be written only costs the driver's compile time. */
static void write_file(const char *path, const void *data, size_t n) {
    char tmp[640];   /* path (at most 600) and ".<pid>.tmp" */
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return;
    bool ok = fwrite(data, 1, n, f) == n;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path)) remove(tmp);
}

static void pcache_path(const moex_vk *vk, char *path, size_t cap) {
    VkPhysicalDeviceProperties p;
    vkGetPhysicalDeviceProperties(vk->pd, &p);
    uint64_t h = fnv1a(p.pipelineCacheUUID, VK_UUID_SIZE, fnv1a(&p.deviceID, sizeof p.deviceID, 0xcbf29ce484222325ULL));
    snprintf(path, cap, "%s/pipelines-%016llx.bin", vk->cache_dir, (unsigned long long)h);
}

/* Without a cache (none on disk, stale data, or a driver that refuses one) pipelines are only slower to create. */
void vk_pipeline_cache_open(moex_vk *vk) {
    size_t n = 0;
    void *data = NULL;
    char path[600];
    if (vk->cache_dir[0]) {
        pcache_path(vk, path, sizeof path);
        data = read_file(path, &n);
    }
    VkPipelineCacheCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO,
                                    .initialDataSize = data ? n : 0, .pInitialData = data};
    VkResult r = vkCreatePipelineCache(vk->dev, &ci, NULL, &vk->pcache);
    if (r != VK_SUCCESS && data) { /* stale or foreign data: start empty */
        ci.initialDataSize = 0;
        ci.pInitialData = NULL;
        r = vkCreatePipelineCache(vk->dev, &ci, NULL, &vk->pcache);
    }
    free(data);
    if (r != VK_SUCCESS) vk->pcache = VK_NULL_HANDLE;
}

void vk_pipeline_cache_close(moex_vk *vk) {
    if (!vk->pcache) return;
    size_t n = 0;
    if (vk->cache_dir[0] && vkGetPipelineCacheData(vk->dev, vk->pcache, &n, NULL) == VK_SUCCESS && n > 0) {
        void *data = malloc(n);
        if (data && vkGetPipelineCacheData(vk->dev, vk->pcache, &n, data) == VK_SUCCESS && mkdirs(vk->cache_dir) == 0) {
            char path[600];
            pcache_path(vk, path, sizeof path);
            write_file(path, data, n);
        }
        free(data);
    }
    vkDestroyPipelineCache(vk->dev, vk->pcache, NULL);
    vk->pcache = VK_NULL_HANDLE;
}
