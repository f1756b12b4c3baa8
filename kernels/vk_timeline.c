/* A timeline semaphore shared by the host and the queue (Vulkan 1.2 core):
 * the distributed hub submits a whole token's layer segments at once, each
 * waiting for a value the host signals once the layer's expert result is in
 * place, so the critical path between layers is a host signal and a host
 * wait, never a vkQueueSubmit. */
#include <stdlib.h>

#include "kernels/vk_internal.h"

typedef struct pending {
    moex_vk_cmd *cmd;
    uint64_t signal;
} pending;

struct moex_vk_timeline {
    moex_vk *vk;
    VkSemaphore sem;
    pending *pend;        /* profiled recordings whose timestamps are still to be read */
    int n_pend, max_pend;
};

bool moex_vk_timeline_supported(const moex_vk *vk) {
    if (vk->api_version < VK_API_VERSION_1_2) return false;
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceFeatures2 f = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12};
    vkGetPhysicalDeviceFeatures2(vk->pd, &f);
    return f12.timelineSemaphore;   /* make_device enables it whenever the device has it */
}

moex_vk_timeline *moex_vk_timeline_create(moex_vk *vk, int max_pending, moex_error *err) {
    if (!moex_vk_timeline_supported(vk)) {
        moex_fail(err, "vulkan: %s has no timeline semaphores", vk->info.name);
        return NULL;
    }
    moex_vk_timeline *t = calloc(1, sizeof *t);
    if (!t || !(t->pend = calloc((size_t)(max_pending > 0 ? max_pending : 1), sizeof *t->pend))) {
        free(t);
        moex_fail(err, "out of memory");
        return NULL;
    }
    t->vk = vk;
    t->max_pend = max_pending > 0 ? max_pending : 1;
    VkSemaphoreTypeCreateInfo ti = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO,
                                    .semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE, .initialValue = 0};
    VkSemaphoreCreateInfo si = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO, .pNext = &ti};
    if (vk_check(vkCreateSemaphore(vk->dev, &si, NULL, &t->sem), "vkCreateSemaphore (timeline)", err)) {
        moex_vk_timeline_free(t);
        return NULL;
    }
    return t;
}

void moex_vk_timeline_free(moex_vk_timeline *t) {
    if (!t) return;
    if (t->sem) {
        vkQueueWaitIdle(t->vk->queue);   /* no submission may still wait on or signal it */
        vkDestroySemaphore(t->vk->dev, t->sem, NULL);
    }
    free(t->pend);
    free(t);
}

uint64_t moex_vk_timeline_value(const moex_vk_timeline *t) {
    uint64_t v = 0;
    vkGetSemaphoreCounterValue(t->vk->dev, t->sem, &v);
    return v;
}

int moex_vk_timeline_submit(moex_vk_timeline *t, moex_vk_cmd *const *cmds, const uint64_t *waits,
                            const uint64_t *signals, int n, moex_error *err) {
    enum { CHUNK = 64 };   /* submit infos per vkQueueSubmit call: bounded stack, still one call per token */
    for (int i = 0; i < n; i++)
        if (cmds[i]->recording && moex_vk_cmd_end(cmds[i], err)) return -1;
    for (int base = 0; base < n; base += CHUNK) {
        const int m = n - base < CHUNK ? n - base : CHUNK;
        VkTimelineSemaphoreSubmitInfo ts[CHUNK];
        VkSubmitInfo si[CHUNK];
        VkCommandBuffer cb[CHUNK];
        const VkPipelineStageFlags stage = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
        for (int j = 0; j < m; j++) {
            const int i = base + j;
            cb[j] = cmds[i]->cb;
            const bool wait = waits[i] != 0;
            ts[j] = (VkTimelineSemaphoreSubmitInfo){.sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
                                                    .waitSemaphoreValueCount = wait ? 1 : 0,
                                                    .pWaitSemaphoreValues = &waits[i],
                                                    .signalSemaphoreValueCount = 1,
                                                    .pSignalSemaphoreValues = &signals[i]};
            si[j] = (VkSubmitInfo){.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .pNext = &ts[j],
                                   .waitSemaphoreCount = wait ? 1 : 0, .pWaitSemaphores = &t->sem,
                                   .pWaitDstStageMask = &stage, .commandBufferCount = 1, .pCommandBuffers = &cb[j],
                                   .signalSemaphoreCount = 1, .pSignalSemaphores = &t->sem};
            if (cmds[i]->prof && t->n_pend < t->max_pend) {
                vk_prof_submitted(cmds[i]);
                t->pend[t->n_pend++] = (pending){cmds[i], signals[i]};
            }
        }
        if (vk_check(vkQueueSubmit(t->vk->queue, (uint32_t)m, si, VK_NULL_HANDLE), "vkQueueSubmit (timeline)", err))
            return -1;
    }
    return 0;
}

int moex_vk_timeline_signal(moex_vk_timeline *t, uint64_t value, moex_error *err) {
    VkSemaphoreSignalInfo si = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, .semaphore = t->sem, .value = value};
    return vk_check(vkSignalSemaphore(t->vk->dev, &si), "vkSignalSemaphore", err);
}

int moex_vk_timeline_wait(moex_vk_timeline *t, uint64_t value, moex_error *err) {
    VkSemaphoreWaitInfo wi = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO, .semaphoreCount = 1,
                              .pSemaphores = &t->sem, .pValues = &value};
    if (vk_check(vkWaitSemaphores(t->vk->dev, &wi, UINT64_MAX), "vkWaitSemaphores (device lost?)", err)) return -1;
    int kept = 0;
    for (int i = 0; i < t->n_pend; i++) {
        if (t->pend[i].signal <= value) vk_prof_collect(t->pend[i].cmd);
        else t->pend[kept++] = t->pend[i];
    }
    t->n_pend = kept;
    return 0;
}

void moex_vk_host_write_barrier(moex_vk_cmd *c) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_HOST_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_TRANSFER_READ_BIT};
    vkCmdPipelineBarrier(c->cb, VK_PIPELINE_STAGE_HOST_BIT,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0, NULL, 0,
                         NULL);
}
