/* The Vulkan device, its queue and memory: everything the kernels run on.
 * One device, one compute queue, no descriptor sets (kernels take device
 * addresses as push constants). The bottom layer (vk_internal.h): it calls
 * no other file of the backend. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/vk/vk_internal.h"

#define STAGING_BYTES ((size_t)64 << 20)

int vk_check(VkResult r, const char *what, moex_error *err) {
    if (r == VK_SUCCESS) return 0;
    return moex_fail(err, "vulkan: %s failed (VkResult %d)", what, (int)r);
}

static VkResult make_instance(VkInstance *inst) {
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "moex",
                             .apiVersion = VK_API_VERSION_1_2};
    VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    return vkCreateInstance(&ci, NULL, inst);
}

static const char *type_name(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
    }
}

/* Higher is better; lavapipe (CPU) last. */
static int type_rank(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 4;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 3;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 0;
    default: return 1;
    }
}

static int enumerate(VkInstance inst, VkPhysicalDevice **out, uint32_t *n, moex_error *err) {
    if (vk_check(vkEnumeratePhysicalDevices(inst, n, NULL), "vkEnumeratePhysicalDevices", err)) return -1;
    if (*n == 0) return moex_fail(err, "vulkan: no devices (install a driver, or mesa-vulkan-drivers for lavapipe)");
    *out = calloc(*n, sizeof **out);
    if (!*out) return moex_fail(err, "out of memory");
    return vk_check(vkEnumeratePhysicalDevices(inst, n, *out), "vkEnumeratePhysicalDevices", err);
}

int moex_vk_list_devices(char *buf, size_t cap, moex_error *err) {
    VkInstance inst;
    if (vk_check(make_instance(&inst), "vkCreateInstance (is a Vulkan loader installed?)", err)) return -1;
    VkPhysicalDevice *pds = NULL;
    uint32_t n = 0;
    int rc = enumerate(inst, &pds, &n, err);
    size_t used = 0;
    if (cap) buf[0] = 0;
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        VkPhysicalDeviceProperties p;
        vkGetPhysicalDeviceProperties(pds[i], &p);
        int w = snprintf(buf + used, used < cap ? cap - used : 0, "%u: %s (%s)\n", i, p.deviceName, type_name(p.deviceType));
        if (w > 0) used += (size_t)w;
    }
    free(pds);
    vkDestroyInstance(inst, NULL);
    return rc ? -1 : (int)n;
}

/* Usable: Vulkan 1.2 with buffer device addresses and a compute queue. */
static bool device_usable(VkPhysicalDevice pd, uint32_t *qfam) {
    VkPhysicalDeviceProperties p;
    vkGetPhysicalDeviceProperties(pd, &p);
    if (p.apiVersion < VK_API_VERSION_1_2) return false;
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceFeatures2 f = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12};
    vkGetPhysicalDeviceFeatures2(pd, &f);
    if (!f12.bufferDeviceAddress) return false;
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, NULL);
    VkQueueFamilyProperties qp[16];
    if (nq > 16) nq = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, qp);
    for (uint32_t i = 0; i < nq; i++)   /* prefer a compute-only queue family */
        if ((qp[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && !(qp[i].queueFlags & VK_QUEUE_GRAPHICS_BIT)) {
            *qfam = i;
            return true;
        }
    for (uint32_t i = 0; i < nq; i++)
        if (qp[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
            *qfam = i;
            return true;
        }
    return false;
}

static int pick_device(moex_vk *vk, int want, moex_error *err) {
    VkPhysicalDevice *pds = NULL;
    uint32_t n = 0;
    if (enumerate(vk->inst, &pds, &n, err)) {
        free(pds);
        return -1;
    }
    int best = -1, best_rank = -1;
    uint32_t qf = 0;
    if (want >= 0) {
        if ((uint32_t)want >= n) {
            free(pds);
            return moex_fail(err, "vulkan: --device %d: only %u device(s) (moex-hub --list-devices)", want, n);
        }
        if (!device_usable(pds[want], &qf)) {
            free(pds);
            return moex_fail(err, "vulkan: device %d lacks Vulkan 1.2 buffer device addresses or a compute queue", want);
        }
        best = want;
    } else {
        for (uint32_t i = 0; i < n; i++) {
            VkPhysicalDeviceProperties p;
            vkGetPhysicalDeviceProperties(pds[i], &p);
            uint32_t q;
            if (device_usable(pds[i], &q) && type_rank(p.deviceType) > best_rank) {
                best = (int)i;
                best_rank = type_rank(p.deviceType);
            }
        }
        if (best < 0) {
            free(pds);
            return moex_fail(err, "vulkan: no device with Vulkan 1.2 buffer device addresses and a compute queue");
        }
        device_usable(pds[best], &qf);
    }
    vk->pd = pds[best];
    vk->qfam = qf;
    free(pds);
    return 0;
}

static bool has_extension(VkPhysicalDevice pd, const char *name) {
    uint32_t n = 0;
    vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL);
    VkExtensionProperties *e = calloc(n ? n : 1, sizeof *e);
    if (!e) return false;
    vkEnumerateDeviceExtensionProperties(pd, NULL, &n, e);
    bool found = false;
    for (uint32_t i = 0; i < n && !found; i++) found = strcmp(e[i].extensionName, name) == 0;
    free(e);
    return found;
}

/* Shared memory of mm_coop.comp's largest variant (gate+up): weight and up
 * tiles, activations (f16, rows padded by 8), accumulator staging, row maps. */
static uint32_t coop_shared_bytes(uint32_t bm) {
    const uint32_t lds = VK_COOP_BK + 8;
    return 2u * bm * lds * 2u + VK_COOP_BN * lds * 2u + 4u * 16u * 16u * 4u + 2u * VK_COOP_BN * 4u;
}

/* The NV cooperative-matrix shape mm_coop.comp uses: f16 x f16 -> f32 on a
 * subgroup, 16 x 16 x 16 (or 16 x 8 x 16); 0 when the device lists neither. */
static uint32_t coop_pick_n(moex_vk *vk) {
    PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV get = (PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV)
        vkGetInstanceProcAddr(vk->inst, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV");
    uint32_t n = 0, best = 0;
    if (!get || get(vk->pd, &n, NULL) != VK_SUCCESS || n == 0) return 0;
    VkCooperativeMatrixPropertiesNV *p = calloc(n, sizeof *p);
    if (!p) return 0;
    for (uint32_t i = 0; i < n; i++) p[i].sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV;
    if (get(vk->pd, &n, p) == VK_SUCCESS)
        for (uint32_t i = 0; i < n; i++)
            if (p[i].MSize == 16 && p[i].KSize == 16 && (p[i].NSize == 16 || p[i].NSize == 8) &&
                p[i].AType == VK_COMPONENT_TYPE_FLOAT16_NV && p[i].BType == VK_COMPONENT_TYPE_FLOAT16_NV &&
                p[i].CType == VK_COMPONENT_TYPE_FLOAT32_NV && p[i].DType == VK_COMPONENT_TYPE_FLOAT32_NV &&
                p[i].scope == VK_SCOPE_SUBGROUP_NV && p[i].NSize > best)
                best = p[i].NSize;
    free(p);
    return best;
}

/* Cooperative matrices for the prompt-batch products: the extension and its
 * feature for compute, the Vulkan memory model its SPIR-V declares, f16
 * arithmetic, 32-wide subgroups (mm_coop.comp's warps) and enough shared
 * memory; emulated (mode MOEX_VK_COOP_EMULATE) where the device has none. */
static void read_coop(moex_vk *vk, const VkPhysicalDeviceVulkan12Features *f12, int mode) {
    moex_vk_info *in = &vk->info;
    if (mode == MOEX_VK_COOP_OFF || !f12->shaderFloat16 || in->shared_mem < coop_shared_bytes((uint32_t)vk->tune.coop_bm))
        return;
    if (f12->vulkanMemoryModel && in->subgroup_size == 32 && has_extension(vk->pd, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME)) {
        VkPhysicalDeviceCooperativeMatrixFeaturesNV cf = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
        VkPhysicalDeviceFeatures2 f = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &cf};
        vkGetPhysicalDeviceFeatures2(vk->pd, &f);
        VkPhysicalDeviceCooperativeMatrixPropertiesNV cp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_PROPERTIES_NV};
        VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &cp};
        vkGetPhysicalDeviceProperties2(vk->pd, &p2);
        const uint32_t n = cf.cooperativeMatrix && (cp.cooperativeMatrixSupportedStages & VK_SHADER_STAGE_COMPUTE_BIT)
                               ? coop_pick_n(vk) : 0;
        if (n) {
            in->coop = 1;
            in->coop_m = 16, in->coop_n = n, in->coop_k = 16;
            return;
        }
    }
    if (mode == MOEX_VK_COOP_EMULATE) {
        in->coop = 2;
        in->coop_m = 16, in->coop_n = 16, in->coop_k = 16;
    }
}

/* OpSUDot on 4x8-bit packed words (VK_KHR_shader_integer_dot_product):
 * the decode products' int8 activation path (vk_internal.h vk_idot). */
static bool has_int_dot(VkPhysicalDevice pd) {
    if (!has_extension(pd, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME)) return false;
    VkPhysicalDeviceShaderIntegerDotProductFeatures idf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES};
    VkPhysicalDeviceFeatures2 f = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &idf};
    vkGetPhysicalDeviceFeatures2(pd, &f);
    return idf.shaderIntegerDotProduct;
}

/* Capabilities that choose kernel variants. */
static void read_caps(moex_vk *vk, const moex_vk_options *opt, int coop) {
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sg};
    vkGetPhysicalDeviceProperties2(vk->pd, &p2);
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceFeatures2 f = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12};
    vkGetPhysicalDeviceFeatures2(vk->pd, &f);
    moex_vk_info *in = &vk->info;
    snprintf(in->name, sizeof in->name, "%s", p2.properties.deviceName);
    snprintf(in->type, sizeof in->type, "%s", type_name(p2.properties.deviceType));
    in->subgroup_size = sg.subgroupSize;
    in->subgroup_arith = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                         (sg.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT);
    in->f16 = f12.shaderFloat16;
    in->int_dot = has_int_dot(vk->pd);
    if (in->int_dot) {
        VkPhysicalDeviceShaderIntegerDotProductProperties ip = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_PROPERTIES};
        VkPhysicalDeviceProperties2 pp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &ip};
        vkGetPhysicalDeviceProperties2(vk->pd, &pp);
        in->int_dot_fast = ip.integerDotProduct4x8BitPackedMixedSignednessAccelerated;
    }
    in->shared_mem = p2.properties.limits.maxComputeSharedMemorySize;
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(vk->pd, &nq, NULL);
    VkQueueFamilyProperties *qp = calloc(nq ? nq : 1, sizeof *qp);
    if (qp) vkGetPhysicalDeviceQueueFamilyProperties(vk->pd, &nq, qp);
    const bool timestamps = qp && vk->qfam < nq && qp[vk->qfam].timestampValidBits > 0 &&
                            p2.properties.limits.timestampPeriod > 0;
    free(qp);
    vk->ts_period = p2.properties.limits.timestampPeriod;
    if (vk->profile && !timestamps) {
        moex_log(MOEX_LOG_WARN, "vulkan profile: the queue has no timestamps, --vk-tune profile ignored");
        vk->profile = false;
    }
    vk->api_version = p2.properties.apiVersion;
    vkGetPhysicalDeviceMemoryProperties(vk->pd, &vk->memprops);
    for (uint32_t i = 0; i < vk->memprops.memoryHeapCount; i++)
        if ((vk->memprops.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) &&
            vk->memprops.memoryHeaps[i].size > in->device_mem)
            in->device_mem = vk->memprops.memoryHeaps[i].size;
    /* A row of mv.comp is one subgroup when the size is fixed and fits;
     * otherwise rows reduce through shared memory. */
    const uint32_t s = sg.subgroupSize;
    vk->use_subgroup = !opt->no_subgroup && in->subgroup_arith && s >= 8 && s <= 64 && (s & (s - 1)) == 0;
    vk->tpr = vk->use_subgroup ? (int)s : 32;
    read_coop(vk, &f12, coop);
}

static int make_device(moex_vk *vk, moex_error *err) {
    const float prio = 1.0f;
    VkDeviceQueueCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, .queueFamilyIndex = vk->qfam,
                                   .queueCount = 1, .pQueuePriorities = &prio};
    VkPhysicalDeviceVulkan12Features have12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceFeatures2 have = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &have12};
    vkGetPhysicalDeviceFeatures2(vk->pd, &have);
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                            .bufferDeviceAddress = VK_TRUE,
                                            .scalarBlockLayout = have12.scalarBlockLayout};
    VkPhysicalDeviceFeatures2 f = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12};
    f.features.shaderInt64 = have.features.shaderInt64;
    /* mm_coop.comp: f16 in shared memory; on the matrix unit also the extension and the Vulkan memory model */
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cf = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV,
                                                      .cooperativeMatrix = VK_TRUE};
    /* the int8 activation path: OpSUDot */
    VkPhysicalDeviceShaderIntegerDotProductFeatures idf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES, .shaderIntegerDotProduct = VK_TRUE};
    const char *ext[2];
    uint32_t n_ext = 0;
    if (vk->info.int_dot) {
        ext[n_ext++] = VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME;
        idf.pNext = f12.pNext;
        f12.pNext = &idf;
    }
    f12.shaderFloat16 = vk->info.coop != 0;
    if (vk->info.coop == 1) {
        f12.vulkanMemoryModel = VK_TRUE;
        cf.pNext = f12.pNext;
        f12.pNext = &cf;
        ext[n_ext++] = VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME;
    }
    VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .pNext = &f, .queueCreateInfoCount = 1,
                              .pQueueCreateInfos = &qci, .enabledExtensionCount = n_ext, .ppEnabledExtensionNames = ext};
    if (vk->info.coop == 1 && vkCreateDevice(vk->pd, &dci, NULL, &vk->dev) != VK_SUCCESS) {
        /* a driver that lists cooperative matrices but refuses them: run without (the f32 tiles) */
        moex_log(MOEX_LOG_WARN, "vulkan: %s refused cooperative matrices; prompts use the f32 tiles", vk->info.name);
        vk->info.coop = 0;
        f12.shaderFloat16 = VK_FALSE;
        f12.vulkanMemoryModel = VK_FALSE;
        f12.pNext = cf.pNext;   /* the integer dot product stays */
        dci.enabledExtensionCount = n_ext - 1;
        vk->dev = VK_NULL_HANDLE;
    }
    if (!vk->dev && vk_check(vkCreateDevice(vk->pd, &dci, NULL, &vk->dev), "vkCreateDevice", err)) return -1;
    vkGetDeviceQueue(vk->dev, vk->qfam, 0, &vk->queue);
    VkCommandPoolCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                   .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                   .queueFamilyIndex = vk->qfam};
    if (vk_check(vkCreateCommandPool(vk->dev, &pci, NULL, &vk->pool), "vkCreateCommandPool", err)) return -1;
    VkPushConstantRange pcr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .size = sizeof(vk_pc)};
    VkPipelineLayoutCreateInfo lci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                      .pushConstantRangeCount = 1, .pPushConstantRanges = &pcr};
    if (vk_check(vkCreatePipelineLayout(vk->dev, &lci, NULL, &vk->layout), "vkCreatePipelineLayout", err)) return -1;
    VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = vk->pool,
                                      .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    if (vk_check(vkAllocateCommandBuffers(vk->dev, &ai, &vk->xfer_cmd), "vkAllocateCommandBuffers", err)) return -1;
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    return vk_check(vkCreateFence(vk->dev, &fci, NULL, &vk->xfer_fence), "vkCreateFence", err);
}


int vk_device_open(moex_vk *vk, const moex_vk_options *opt, int coop, moex_error *err) {
    if (vk_check(make_instance(&vk->inst), "vkCreateInstance (is a Vulkan loader installed?)", err) ||
        pick_device(vk, opt->device, err))
        return -1;
    read_caps(vk, opt, coop);
    return make_device(vk, err);
}

void vk_device_close(moex_vk *vk) {
    if (vk->dev) {
        vkDeviceWaitIdle(vk->dev);
        moex_vk_buffer_free(vk->staging);
        vk->staging = NULL;
        if (vk->xfer_fence) vkDestroyFence(vk->dev, vk->xfer_fence, NULL);
        if (vk->layout) vkDestroyPipelineLayout(vk->dev, vk->layout, NULL);
        if (vk->pool) vkDestroyCommandPool(vk->dev, vk->pool, NULL);
        vkDestroyDevice(vk->dev, NULL);
        vk->dev = VK_NULL_HANDLE;
    }
    if (vk->inst) vkDestroyInstance(vk->inst, NULL);
    vk->inst = VK_NULL_HANDLE;
}

const moex_vk_info *moex_vk_get_info(const moex_vk *vk) { return &vk->info; }

/* ---- buffers ---- */

static int find_memory(const moex_vk *vk, uint32_t bits, VkMemoryPropertyFlags want, VkMemoryPropertyFlags nice) {
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < vk->memprops.memoryTypeCount; i++) {
            VkMemoryPropertyFlags f = vk->memprops.memoryTypes[i].propertyFlags;
            if (!(bits & (1u << i)) || (f & want) != want) continue;
            if (pass == 0 && (f & nice) != nice) continue;
            return (int)i;
        }
    return -1;
}

moex_vk_buffer *moex_vk_buffer_create(moex_vk *vk, size_t bytes, int mem, moex_error *err) {
    moex_vk_buffer *b = calloc(1, sizeof *b);
    if (!b) {
        moex_fail(err, "out of memory");
        return NULL;
    }
    b->vk = vk;
    b->size = bytes;
    /* 16 bytes of slack: unaligned 4-byte block reads may touch the next word. */
    VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = bytes + 16,
                              .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                       VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT |
                                       VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT,
                              .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    if (vk_check(vkCreateBuffer(vk->dev, &bci, NULL, &b->buf), "vkCreateBuffer", err)) goto fail;
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(vk->dev, b->buf, &req);
    const VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    const uint32_t bits = req.memoryTypeBits;
    int type = mem == MOEX_VK_MEM_HOST     ? find_memory(vk, bits, host, VK_MEMORY_PROPERTY_HOST_CACHED_BIT)
               : mem == MOEX_VK_MEM_UPLOAD ? find_memory(vk, bits, host, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)
                                           : find_memory(vk, bits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
    if (type < 0 && mem == MOEX_VK_MEM_DEVICE) type = find_memory(vk, bits, 0, 0);
    if (type < 0) {
        moex_fail(err, "vulkan: no suitable memory type for a %zu-byte buffer", bytes);
        goto fail;
    }
    VkMemoryAllocateFlagsInfo fi = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO,
                                    .flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT};
    VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .pNext = &fi,
                               .allocationSize = req.size, .memoryTypeIndex = (uint32_t)type};
    VkResult r = vkAllocateMemory(vk->dev, &ai, NULL, &b->mem);
    if (r != VK_SUCCESS) {
        moex_fail(err, "vulkan: cannot allocate %.1f MiB of %s memory (VkResult %d)", bytes / 1048576.0,
                  mem == MOEX_VK_MEM_DEVICE ? "device" : "host-visible", (int)r);
        goto fail;
    }
    if (vk_check(vkBindBufferMemory(vk->dev, b->buf, b->mem, 0), "vkBindBufferMemory", err)) goto fail;
    if (vk->memprops.memoryTypes[type].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)
        if (vk_check(vkMapMemory(vk->dev, b->mem, 0, VK_WHOLE_SIZE, 0, &b->map), "vkMapMemory", err)) goto fail;
    VkBufferDeviceAddressInfo dai = {.sType = VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO, .buffer = b->buf};
    b->addr = vkGetBufferDeviceAddress(vk->dev, &dai);
    return b;
fail:
    moex_vk_buffer_free(b);
    return NULL;
}

void moex_vk_buffer_free(moex_vk_buffer *b) {
    if (!b) return;
    if (b->buf) vkDestroyBuffer(b->vk->dev, b->buf, NULL);
    if (b->mem) vkFreeMemory(b->vk->dev, b->mem, NULL);
    free(b);
}

moex_vk_ptr moex_vk_buffer_ptr(const moex_vk_buffer *b) { return b ? b->addr : 0; }
size_t moex_vk_buffer_size(const moex_vk_buffer *b) { return b->size; }
void *moex_vk_buffer_map(const moex_vk_buffer *b) { return b->map; }

/* Waits for a submit: with vk->tune.spin_us (--vk-tune spin_us), polls its fence that long
 * first (answering as soon as it signals instead of after the driver's
 * wake-up, for one busy core), then blocks. */
static int wait_fence(moex_vk *vk, VkFence fence, moex_error *err) {
    if (vk->tune.spin_us > 0) {
        const double until = moex_time_s() + vk->tune.spin_us * 1e-6;
        do {
            const VkResult r = vkGetFenceStatus(vk->dev, fence);
            if (r == VK_SUCCESS) return 0;
            if (r != VK_NOT_READY) return vk_check(r, "vkGetFenceStatus (device lost?)", err);
        } while (moex_time_s() < until);
    }
    return vk_check(vkWaitForFences(vk->dev, 1, &fence, VK_TRUE, UINT64_MAX), "vkWaitForFences (device lost?)", err);
}

int vk_submit_wait(moex_vk *vk, VkCommandBuffer cb, VkFence fence, moex_error *err) {
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cb};
    if (vk_check(vkResetFences(vk->dev, 1, &fence), "vkResetFences", err) ||
        vk_check(vkQueueSubmit(vk->queue, 1, &si, fence), "vkQueueSubmit", err))
        return -1;
    return wait_fence(vk, fence, err);
}

/* One copy through the staging buffer: upload when to_device. */
static int staged_copy(moex_vk *vk, moex_vk_buffer *b, size_t off, size_t n, bool to_device, moex_error *err) {
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    if (vk_check(vkBeginCommandBuffer(vk->xfer_cmd, &bi), "vkBeginCommandBuffer", err)) return -1;
    VkBufferCopy r = {.srcOffset = to_device ? 0 : off, .dstOffset = to_device ? off : 0, .size = n};
    vkCmdCopyBuffer(vk->xfer_cmd, to_device ? vk->staging->buf : b->buf, to_device ? b->buf : vk->staging->buf, 1, &r);
    if (vk_check(vkEndCommandBuffer(vk->xfer_cmd), "vkEndCommandBuffer", err)) return -1;
    return vk_submit_wait(vk, vk->xfer_cmd, vk->xfer_fence, err);
}

static int transfer(moex_vk *vk, moex_vk_buffer *b, size_t off, void *host, size_t n, bool to_device, moex_error *err) {
    if (off > b->size || n > b->size - off)
        return moex_fail(err, "vulkan: copy of %zu bytes at %zu overruns a %zu-byte buffer", n, off, b->size);
    if (b->map) {
        vkDeviceWaitIdle(vk->dev);   /* mapped: copy directly once the GPU is done with it */
        if (to_device) memcpy((char *)b->map + off, host, n);
        else memcpy(host, (const char *)b->map + off, n);
        return 0;
    }
    if (!vk->staging && !(vk->staging = moex_vk_buffer_create(vk, STAGING_BYTES, MOEX_VK_MEM_HOST, err))) return -1;
    for (size_t done = 0; done < n;) {
        size_t part = n - done < STAGING_BYTES ? n - done : STAGING_BYTES;
        if (to_device) memcpy(vk->staging->map, (const char *)host + done, part);
        if (staged_copy(vk, b, off + done, part, to_device, err)) return -1;
        if (!to_device) memcpy((char *)host + done, vk->staging->map, part);
        done += part;
    }
    return 0;
}

int moex_vk_upload(moex_vk *vk, moex_vk_buffer *b, size_t off, const void *src, size_t n, moex_error *err) {
    return transfer(vk, b, off, (void *)src, n, true, err);
}

int moex_vk_download(moex_vk *vk, moex_vk_buffer *b, size_t off, void *dst, size_t n, moex_error *err) {
    return transfer(vk, b, off, dst, n, false, err);
}
