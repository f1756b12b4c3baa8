/* What every op shares: binding and dispatching a pipeline (with the
 * profiler's timestamp), argument checks, the push constants of the matrix
 * kernels and activation rounding. Calls the pipelines, command buffers and
 * profiler below it; the op files call it. */
#include <stdlib.h>

#include "kernels/vk/vk_internal.h"

/* mv.comp reads Q4_K and f32 rows through 16-byte loads; weights placed at
 * other offsets take the 8-element variant of the same mode. */
int vk_mv_mode(int mode, const moex_vk_matrix *w) {
    const bool wide = w->type == MOEX_TYPE_Q4_K || w->type == MOEX_TYPE_F32;
    return wide && w->data % 16 ? mode | VK_MV_GENERIC : mode;
}

static void bind_push(moex_vk_cmd *c, VkPipeline p, const vk_pc *pc) {
    if (c->bound != p) {
        vkCmdBindPipeline(c->cb, VK_PIPELINE_BIND_POINT_COMPUTE, p);
        c->bound = p;
    }
    vkCmdPushConstants(c->cb, c->vk->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof *pc, pc);
}

void vk_dispatch(moex_vk_cmd *c, const vk_pipe *p, const vk_pc *pc, uint32_t gx, uint32_t gy, uint32_t gz) {
    if (!p->handle) return;   /* only noted (moex_vk_warm_begin): the recording is not to run */
    bind_push(c, p->handle, pc);
    vkCmdDispatch(c->cb, gx, gy, gz);
    if (c->prof) vk_prof_mark(c, p->handle, p->name);
}

void vk_dispatch_indirect(moex_vk_cmd *c, const vk_pipe *p, const vk_pc *pc, moex_vk_buffer *b, size_t off) {
    if (!p->handle) return;
    bind_push(c, p->handle, pc);
    vkCmdDispatchIndirect(c->cb, b->buf, off);
    if (c->prof) vk_prof_mark(c, p->handle, p->name);
}

/* Dispatches must stay under the 65535 workgroups per dimension every device has. */
int vk_check_grid(int64_t gx, int64_t gy, int64_t gz, moex_error *err) {
    if (gx > 65535 || gy > 65535 || gz > 65535)
        return moex_fail(err, "vulkan: dispatch of %lldx%lldx%lld workgroups is too large (split the batch)",
                         (long long)gx, (long long)gy, (long long)gz);
    return 0;
}

int vk_check_matrix(const moex_vk_matrix *w, moex_error *err) {
    if (!moex_vk_type_supported(w->type)) {
        const moex_type_traits *tt = moex_type_get(w->type);
        return moex_fail(err, "vulkan: no GPU kernels for tensor type %s", tt ? tt->name : "?");
    }
    if (w->rows <= 0 || w->cols <= 0 || w->cols % 32)
        return moex_fail(err, "vulkan: matrix %lldx%lld: columns must be a positive multiple of 32",
                         (long long)w->rows, (long long)w->cols);
    if (w->row_bytes != moex_row_bytes(w->type, w->cols) || w->rows * w->row_bytes > UINT32_MAX ||
        (w->expert_stride && w->expert_stride % 4))
        return moex_fail(err, "vulkan: matrix %lldx%lld has an inconsistent row size or is over 4 GiB",
                         (long long)w->rows, (long long)w->cols);
    if (!w->data || w->data % 4) return moex_fail(err, "vulkan: matrix data must be 4-byte aligned on the GPU");
    return 0;
}

int moex_vk_set_activation_rounding(moex_vk *vk, size_t max_floats, moex_error *err) {
    moex_vk_buffer_free(vk->actq);
    vk->actq = NULL;
    vk->actq_floats = 0;
    if (max_floats == 0) return 0;
    if (!(vk->actq = moex_vk_buffer_create(vk, 3 * max_floats * 4, MOEX_VK_MEM_DEVICE, err))) return -1;
    vk->actq_floats = max_floats;
    return 0;
}

/* The input a product of weight type t reads: x itself, or x rounded to the
 * partner type (when rounding is on) in its region of the rounding buffer.
 * Barriers on both sides: the region may still be read by the previous product. */
int vk_round_input(moex_vk_cmd *c, moex_type t, moex_vk_ptr x, int64_t rows, int64_t cols, moex_vk_ptr *out,
                   moex_error *err) {
    moex_vk *vk = c->vk;
    *out = x;
    if (!vk->actq || t == MOEX_TYPE_F32 || t == MOEX_TYPE_F16 || t == MOEX_TYPE_BF16 || rows <= 0) return 0;
    const int kq = t == MOEX_TYPE_Q4_K || t == MOEX_TYPE_Q5_K || t == MOEX_TYPE_Q6_K ? 1
                   : t == MOEX_TYPE_Q4_1 || t == MOEX_TYPE_Q5_1                     ? 2 : 0;
    if ((size_t)(rows * cols) > vk->actq_floats)
        return moex_fail(err, "vulkan: activation rounding buffer holds %zu floats, a product needs %lld", vk->actq_floats,
                         (long long)(rows * cols));
    if (rows > 65535) return moex_fail(err, "vulkan: activation rounding of %lld rows", (long long)rows);
    const vk_pipe *p = vk_pipeline(vk, VK_K_ACTQ, 0, kq, err);
    if (!p) return -1;
    *out = moex_vk_buffer_ptr(vk->actq) + (size_t)kq * vk->actq_floats * 4;
    vk_pc pc = {.p = {x, *out}, .u = {(uint32_t)cols}};
    moex_vk_barrier(c);
    vk_dispatch(c, p, &pc, (uint32_t)((cols + 255) / 256), (uint32_t)rows, 1);
    moex_vk_barrier(c);
    return 0;
}

/* mv.comp / mm.comp push constants: w w2 x y r ids gw counter | rows cols n xs ys flags k estride n_expert. */
vk_pc vk_mat_pc(const moex_vk_matrix *w, moex_vk_ptr x, int64_t n, int64_t xs, moex_vk_ptr y, int64_t ys,
                moex_vk_ptr resid) {
    vk_pc pc = {.p = {w->data, 0, x, y, resid}};
    pc.u[0] = (uint32_t)w->rows;
    pc.u[1] = (uint32_t)w->cols;
    pc.u[2] = (uint32_t)n;
    pc.u[3] = (uint32_t)xs;
    pc.u[4] = (uint32_t)ys;
    pc.u[5] = resid != 0;
    pc.u[7] = (uint32_t)w->expert_stride;
    return pc;
}
