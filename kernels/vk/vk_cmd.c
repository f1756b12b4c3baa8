/* Command buffers: recording, submitting and waiting, barriers, copies and
 * fills. Each op file records its dispatches into one (vk_record.c); with
 * profiling on, every recorded op is followed by a timestamp (vk_prof.c). */
#include <stdlib.h>

#include "kernels/vk/vk_internal.h"

moex_vk_cmd *moex_vk_cmd_create(moex_vk *vk, moex_error *err) {
    moex_vk_cmd *c = calloc(1, sizeof *c);
    if (!c) {
        moex_fail(err, "out of memory");
        return NULL;
    }
    c->vk = vk;
    c->prof = vk_prof_create(vk);
    VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = vk->pool,
                                      .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if (vk_check(vkAllocateCommandBuffers(vk->dev, &ai, &c->cb), "vkAllocateCommandBuffers", err) ||
        vk_check(vkCreateFence(vk->dev, &fci, NULL, &c->fence), "vkCreateFence", err)) {
        moex_vk_cmd_free(c);
        return NULL;
    }
    return c;
}

void moex_vk_cmd_free(moex_vk_cmd *c) {
    if (!c) return;
    vk_prof_free(c);
    if (c->fence) vkDestroyFence(c->vk->dev, c->fence, NULL);
    if (c->cb) vkFreeCommandBuffers(c->vk->dev, c->vk->pool, 1, &c->cb);
    free(c);
}

int moex_vk_cmd_begin(moex_vk_cmd *c, moex_error *err) {
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    if (vk_check(vkBeginCommandBuffer(c->cb, &bi), "vkBeginCommandBuffer", err)) return -1;
    c->recording = true;
    c->bound = VK_NULL_HANDLE;
    c->transfer_since_barrier = false;
    if (c->prof) vk_prof_begin(c);
    return 0;
}

int moex_vk_cmd_end(moex_vk_cmd *c, moex_error *err) {
    /* Results become visible to the host once the fence signals. */
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
    vkCmdPipelineBarrier(c->cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
    c->recording = false;
    return vk_check(vkEndCommandBuffer(c->cb), "vkEndCommandBuffer", err);
}

int moex_vk_cmd_run(moex_vk_cmd *c, moex_error *err) {
    if (c->recording && moex_vk_cmd_end(c, err)) return -1;
    if (!c->prof) return vk_submit_wait(c->vk, c->cb, c->fence, err);
    vk_prof_submitted(c);
    if (vk_submit_wait(c->vk, c->cb, c->fence, err)) return -1;
    vk_prof_collect(c);
    return 0;
}

void moex_vk_cmd_label(moex_vk_cmd *c, const char *label) { c->label = label; }

static void barrier(moex_vk_cmd *c, VkPipelineStageFlags src, VkPipelineStageFlags dst) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                                           VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT};
    vkCmdPipelineBarrier(c->cb, src, dst, 0, 1, &mb, 0, NULL, 0, NULL);
}

/* Between kernels the barrier names the compute stage alone (a transfer stage
 * in it costs a heavier wait on some drivers); copies and fills order
 * themselves after earlier kernels, and the barrier after them covers them. */
void moex_vk_barrier(moex_vk_cmd *c) {
    const VkPipelineStageFlags cs = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, tr = VK_PIPELINE_STAGE_TRANSFER_BIT;
    barrier(c, c->transfer_since_barrier ? cs | tr : cs, c->transfer_since_barrier ? cs | tr : cs);
    c->transfer_since_barrier = false;
}

static void before_transfer(moex_vk_cmd *c) {
    barrier(c, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT);
    c->transfer_since_barrier = true;
}

void moex_vk_copy(moex_vk_cmd *c, moex_vk_buffer *dst, size_t doff, moex_vk_buffer *src, size_t soff, size_t n) {
    VkBufferCopy r = {.srcOffset = soff, .dstOffset = doff, .size = n};
    before_transfer(c);
    vkCmdCopyBuffer(c->cb, src->buf, dst->buf, 1, &r);
    if (c->prof) vk_prof_mark(c, VK_NULL_HANDLE, "copy/fill");
}

void moex_vk_fill(moex_vk_cmd *c, moex_vk_buffer *b, size_t off, size_t n, uint32_t value) {
    before_transfer(c);
    vkCmdFillBuffer(c->cb, b->buf, off, n, value);
    if (c->prof) vk_prof_mark(c, VK_NULL_HANDLE, "copy/fill");
}
