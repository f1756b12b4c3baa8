/* Compute pipelines: GLSL embedded in the binary, specialised with #defines
 * chosen from the device's capabilities, compiled by shaderc on first use,
 * with the SPIR-V cached on disk (keyed by a hash of the full source) and a
 * VkPipelineCache kept beside it. */
#include <errno.h>
#include <shaderc/shaderc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/vk/vk_internal.h"
#include "kernels/vk/vk_experts.h"

static const char *const kernel_file[VK_K_COUNT] = {
    [VK_K_DEQUANT] = "dequant.comp", [VK_K_MV] = "mv.comp", [VK_K_MM] = "mm.comp", [VK_K_TOPK] = "topk.comp",
    [VK_K_RMSNORM] = "rmsnorm.comp", [VK_K_QKROPE] = "qkrope.comp", [VK_K_ATTN] = "attn.comp",
    [VK_K_ATTN_MERGE] = "attn_merge.comp", [VK_K_MOE_SORT] = "moe_sort.comp",
    [VK_K_MOE_COMBINE] = "moe_combine.comp", [VK_K_ELTWISE] = "eltwise.comp", [VK_K_ARGMAX] = "argmax.comp",
    [VK_K_ACTQ] = "actq.comp", [VK_K_EXPERTS_MV] = "experts_mv.comp", [VK_K_MM_COOP] = "mm_coop.comp",
    [VK_K_ATTN_COOP] = "attn_coop.comp", [VK_K_ATTN_DEC] = "attn_dec.comp",
    [VK_K_EXPERTS_GU] = "experts_gu.comp",
};

/* Kernels specialised by weight type (TYPE, BLK, BLK_BYTES and _quant.comp). */
static bool is_typed(vk_kernel k) {
    return k == VK_K_DEQUANT || k == VK_K_MV || k == VK_K_MM || k == VK_K_EXPERTS_MV || k == VK_K_MM_COOP ||
           k == VK_K_EXPERTS_GU;
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

static const char *find_source(const char *name) {
    for (int i = 0; i < moex_vk_shader_source_count; i++)
        if (!strcmp(moex_vk_shader_sources[i].name, name)) return moex_vk_shader_sources[i].text;
    return NULL;
}

/* A growing string; on allocation failure it stays NULL and the caller reports it. */
typedef struct strbuf {
    char *s;
    size_t len, cap;
    bool oom;
} strbuf;

static void sb_add(strbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) sb_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* Appends a shader file, expanding its `#include "x"` lines (one level). */
static int add_file(strbuf *b, const char *name, moex_error *err) {
    const char *text = find_source(name);
    if (!text) return moex_fail(err, "vulkan: shader %s is not embedded", name);
    for (const char *line = text; *line;) {
        const char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line + 1) : strlen(line);
        char inc[64];
        if (sscanf(line, "#include \"%63[^\"]\"", inc) == 1) {
            const char *t = find_source(inc);
            if (!t) return moex_fail(err, "vulkan: %s includes %s, which is not embedded", name, inc);
            sb_add(b, t, strlen(t));
        } else {
            sb_add(b, line, n);
        }
        line += n;
    }
    return 0;
}

static int block_elems(moex_type t) { return moex_type_get(t)->block_elems; }
static int block_bytes(moex_type t) { return moex_type_get(t)->block_bytes; }

/* mm_coop.comp's shared tiles: single (two barriers per step) by default,
 * double-buffered (one barrier per step) with MOEX_VK_COOP_NBUF=2 (vk->tune) where the
 * device's shared memory holds two of each. On the H200 (48 KB) double buffers
 * made attn_q alone 11 % faster, but the experts' down 24 % slower (fewer
 * workgroups per SM), and the whole model's pp512 3 % slower even with them
 * on the dense products only (7673-7698 vs 7920-7936 tok/s, three
 * alternations in one run); gate+up (two weight tiles) never fits two. */
static int coop_nbuf(const moex_vk *vk, int mode, int bk, int bn) {
    const int want = vk->tune.coop_nbuf;
    const uint32_t tile = (uint32_t)(bk / 8 + 1) * 16u;   /* one shared row, bytes */
    const uint32_t rows = (uint32_t)vk->coop_bm * (mode == 1 ? 2u : 1u) + (uint32_t)bn;
    const uint32_t rest = 4u * vk->info.coop_m * vk->info.coop_n * 4u + (uint32_t)bn * 4u;   /* staging, row map */
    return want == 2 && 2u * rows * tile + rest <= vk->info.shared_mem ? 2 : 1;
}

/* Full GLSL text of one variant. */
static char *assemble(const moex_vk *vk, vk_kernel k, moex_type type, int mode, moex_error *err) {
    strbuf b = {0};
    const bool typed = is_typed(k);
    const int m = k == VK_K_MV || k == VK_K_MM_COOP || k == VK_K_MM ? mode & 3 : mode;
    sb_printf(&b, "#version 450\n#define MAXE %d\n#define NMAX %d\n#define MODE %d\n#define OP %d\n",
              VK_MAX_EXPERTS, VK_MV_NMAX, m, m);
    /* Subgroup variants where the device has them: the row reductions of mv,
     * the router's top-k, the decode attention's reductions. */
    if (vk->use_subgroup && (k == VK_K_MV || k == VK_K_TOPK || k == VK_K_ATTN_DEC))
        sb_printf(&b, "#define USE_SUBGROUP 1\n#define SG %du\n", vk->tpr);
    if (k == VK_K_MV) {
        sb_printf(&b, "#define TPR %du\n#define GROUPS %du\n#define WG (TPR * GROUPS)\n#define RPT %d\n#define FAST %d\n",
                  vk->tpr, vk_mv_row_groups(vk, mode), vk_mv_rpt(vk, mode), !(mode & VK_MV_GENERIC));
        if (mode & VK_MV_NORM) sb_printf(&b, "#define NORM 1\n");
        sb_printf(&b, "#define IDOT %d\n", (mode & VK_MV_IDOT) != 0);
        if (mode & VK_MV_STAGE) sb_printf(&b, "#define STAGE 1\n");
        if (m == 1 || m == 2 || (mode & VK_MV_STAGE)) sb_printf(&b, "#define XMAX4 %du\n", VK_MV_XMAX / 4);
    } else if (k == VK_K_MM) {
        sb_printf(&b, "#define TILE %du\n", mode & VK_MM_SMALL ? 32 : 64);
    } else if (k == VK_K_TOPK) {
        sb_printf(&b, "#define WG 128u\n");
    } else if (k == VK_K_ARGMAX) {
        sb_printf(&b, "#define WG 512u\n");
    } else if (k == VK_K_EXPERTS_MV) {
        const bool down = mode & VK_EX_DOWN, generic = mode & VK_EX_GENERIC;
        const vk_ex_shape *s = VK_EX_MODE_SHAPE(vk, mode);
        sb_printf(&b, "#define SIDE %d\n#define WG %du\n#define RT %du\n#define RU %du\n#define PPT %du\n#define FAST %d\n",
                  down, s->wg, s->rt, s->ru, ((mode >> 2) & 3) + 1,
                  !generic && (type == MOEX_TYPE_Q4_K || type == MOEX_TYPE_Q6_K));
        /* subgroup sums only over whole subgroups: a shape that is not a multiple
         * of the subgroup size (96 threads on a 64-wide device) reduces through
         * shared memory instead (a partial subgroup's sums came out wrong) */
        if (vk->use_subgroup && s->wg % vk->tpr == 0) sb_printf(&b, "#define USE_SUBGROUP 1\n");
        sb_printf(&b, "#define IDOT %d\n", (mode & VK_EX_IDOT) != 0);
    } else if (k == VK_K_EXPERTS_GU) {   /* mode: log2 of a row's 32-column positions | VK_GU_IDOT */
        const vk_gu_shape s = vk_gu_shape_of(vk, 1 << (mode & (VK_GU_IDOT - 1)));
        sb_printf(&b, "#define WG %du\n#define NPOS %du\n#define RL %du\n#define RU %du\n#define CH %du\n#define IDOT %d\n",
                  s.wg, s.npos, s.rl, s.ru, s.ch, (mode & VK_GU_IDOT) != 0);
        if (s.subgroup) sb_printf(&b, "#define USE_SUBGROUP 1\n#define SG %du\n", vk->tpr);
    } else if (k == VK_K_ATTN_DEC) {
        sb_printf(&b, "#define MAX_SPLITS %du\n", VK_ATTN_MAX_SPLITS);
    } else if (k == VK_K_ATTN_COOP) {   /* mode: head_dim class (vk_attn.c attn_coop_mode) */
        uint32_t warps = 4, bc = 32;
        vk_attn_coop_config(vk, mode, &warps, &bc);
        sb_printf(&b, "#define HDMAX %du\n#define BC %uu\n#define WARPS %uu\n#define EMU %d\n", 64 << mode, bc, warps,
                  vk->info.coop != 1);
    } else if (k == VK_K_MM_COOP) {
        const int bk = vk->tune.coop_bk, bn = mode & VK_COOP_NARROW ? 32 : VK_COOP_BN;
        sb_printf(&b, "#define BM %du\n#define BN %du\n#define BK %du\n#define CM %uu\n#define CN %uu\n#define CK %uu\n"
                  "#define EMU %d\n#define NBUF %d\n#define FASTQ %d\n", vk->coop_bm, bn, bk,
                  vk->info.coop_m, vk->info.coop_n, vk->info.coop_k, vk->info.coop != 1, coop_nbuf(vk, m, bk, bn),
                  !(mode & VK_COOP_GENERIC) && (type == MOEX_TYPE_Q4_K || type == MOEX_TYPE_Q6_K));
    }
    if (typed)
        sb_printf(&b, "#define TYPE %d\n#define BLK %du\n#define BLK_BYTES %du\n", (int)type, block_elems(type),
                  block_bytes(type));
    if (add_file(&b, "_common.comp", err) || (typed && add_file(&b, "_quant.comp", err)) ||
        add_file(&b, kernel_file[k], err)) {
        free(b.s);
        return NULL;
    }
    if (b.oom) {
        free(b.s);
        moex_fail(err, "out of memory");
        return NULL;
    }
    return b.s;
}

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

/* Best effort: a cache that cannot be written only costs compile time. */
static void write_file(const char *path, const void *data, size_t n) {
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return;
    bool ok = fwrite(data, 1, n, f) == n;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path)) remove(tmp);
}

static uint32_t *compile_glsl(moex_vk *vk, const char *src, const char *name, size_t *n_bytes, moex_error *err) {
    if (!vk->shaderc && !(vk->shaderc = shaderc_compiler_initialize())) {
        moex_fail(err, "vulkan: shaderc_compiler_initialize failed");
        return NULL;
    }
    shaderc_compile_options_t o = shaderc_compile_options_initialize();
    shaderc_compile_options_set_target_env(o, shaderc_target_env_vulkan, shaderc_env_version_vulkan_1_2);
    shaderc_compile_options_set_optimization_level(o, shaderc_optimization_level_performance);
    shaderc_compilation_result_t r =
        shaderc_compile_into_spv(vk->shaderc, src, strlen(src), shaderc_compute_shader, name, "main", o);
    shaderc_compile_options_release(o);
    uint32_t *spv = NULL;
    if (shaderc_result_get_compilation_status(r) != shaderc_compilation_status_success) {
        moex_fail(err, "vulkan: compiling %s failed: %.400s", name, shaderc_result_get_error_message(r));
    } else {
        *n_bytes = shaderc_result_get_length(r);
        if ((spv = malloc(*n_bytes))) memcpy(spv, shaderc_result_get_bytes(r), *n_bytes);
        else moex_fail(err, "out of memory");
    }
    shaderc_result_release(r);
    return spv;
}

/* SPIR-V of a variant: from the disk cache, else compiled (and cached). */
static uint32_t *get_spirv(moex_vk *vk, const char *src, const char *name, size_t *n, moex_error *err) {
    char path[600] = "";
    if (vk->cache_dir[0]) {
        uint64_t h = fnv1a(src, strlen(src), 0xcbf29ce484222325ULL);
        snprintf(path, sizeof path, "%s/%016llx.spv", vk->cache_dir, (unsigned long long)h);
        uint32_t *spv = read_file(path, n);
        if (spv && *n >= 20 && *n % 4 == 0 && spv[0] == 0x07230203u) return spv;
        free(spv);
    }
    uint32_t *spv = compile_glsl(vk, src, name, n, err);
    if (spv && path[0] && mkdirs(vk->cache_dir) == 0) write_file(path, spv, *n);
    return spv;
}

VkPipeline vk_pipeline(moex_vk *vk, vk_kernel k, moex_type type, int mode, moex_error *err) {
    const bool typed = is_typed(k);
    const int slot = typed ? vk_type_slot(type) : 0;
    if (slot < 0) {
        const moex_type_traits *tt = moex_type_get(type);
        moex_fail(err, "vulkan: no GPU kernels for tensor type %s", tt ? tt->name : "?");
        return VK_NULL_HANDLE;
    }
    if (vk->pipes[k][slot][mode]) return vk->pipes[k][slot][mode];
    char *src = assemble(vk, k, type, mode, err);
    if (!src) return VK_NULL_HANDLE;
    char name[96];
    snprintf(name, sizeof name, "%s[type %d mode %d]", kernel_file[k], (int)type, mode);
    size_t n = 0;
    uint32_t *spv = get_spirv(vk, src, name, &n, err);
    free(src);
    if (!spv) return VK_NULL_HANDLE;
    VkShaderModuleCreateInfo mci = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, .codeSize = n, .pCode = spv};
    VkShaderModule mod;
    VkResult r = vkCreateShaderModule(vk->dev, &mci, NULL, &mod);
    free(spv);
    if (vk_check(r, "vkCreateShaderModule", err)) return VK_NULL_HANDLE;
    VkComputePipelineCreateInfo pci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = mod, .pName = "main"},
        .layout = vk->layout};
    VkPipeline p = VK_NULL_HANDLE;
    r = vkCreateComputePipelines(vk->dev, vk->pcache, 1, &pci, NULL, &p);
    vkDestroyShaderModule(vk->dev, mod, NULL);
    if (vk_check(r, "vkCreateComputePipelines", err)) return VK_NULL_HANDLE;
    vk->pipes[k][slot][mode] = p;
    return p;
}

void vk_pipelines_free(moex_vk *vk) {
    for (int k = 0; k < VK_K_COUNT; k++)
        for (int t = 0; t < VK_TYPE_SLOTS; t++)
            for (int m = 0; m < VK_MODES; m++)
                if (vk->pipes[k][t][m]) vkDestroyPipeline(vk->dev, vk->pipes[k][t][m], NULL);
    if (vk->shaderc) shaderc_compiler_release(vk->shaderc);
    vk->shaderc = NULL;
}

static void pcache_path(const moex_vk *vk, char *path, size_t cap) {
    VkPhysicalDeviceProperties p;
    vkGetPhysicalDeviceProperties(vk->pd, &p);
    uint64_t h = fnv1a(p.pipelineCacheUUID, VK_UUID_SIZE, fnv1a(&p.deviceID, sizeof p.deviceID, 0xcbf29ce484222325ULL));
    snprintf(path, cap, "%s/pipelines-%016llx.bin", vk->cache_dir, (unsigned long long)h);
}

int vk_pipeline_cache_open(moex_vk *vk) {
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
    return r == VK_SUCCESS ? 0 : -1;
}

void vk_pipeline_cache_save(moex_vk *vk) {
    if (!vk->cache_dir[0] || !vk->pcache) return;
    size_t n = 0;
    if (vkGetPipelineCacheData(vk->dev, vk->pcache, &n, NULL) != VK_SUCCESS || n == 0) return;
    void *data = malloc(n);
    if (data && vkGetPipelineCacheData(vk->dev, vk->pcache, &n, data) == VK_SUCCESS && mkdirs(vk->cache_dir) == 0) {
        char path[600];
        pcache_path(vk, path, sizeof path);
        write_file(path, data, n);
    }
    free(data);
}
