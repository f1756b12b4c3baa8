/* The hooks of vk_testing.h: the switches and shapes tests and benchmarks
 * set on a device, and the pipelines each change invalidates. */
#include "kernels/vk/vk_internal.h"

bool moex_vk_testing_idot(const moex_vk *vk) { return vk_idot(vk); }

int moex_vk_testing_spin_us(const moex_vk *vk) { return vk->tune.spin_us; }

/* The int8 path is a mode bit of each kernel that has one: no pipeline changes. */
void moex_vk_testing_set_idot(moex_vk *vk, int idot) { vk->tune.idot = idot; }

int moex_vk_testing_set_ex_preq(moex_vk *vk, int preq) {
    const int was = vk->tune.ex_preq;
    vk->tune.ex_preq = preq;
    return was;
}

int moex_vk_testing_set_mv_batch_wg(moex_vk *vk, int wg) {
    const int was = vk->tune.mv_batch_wg;
    vk->tune.mv_batch_wg = wg;
    return was;
}

void moex_vk_testing_set_attn_simple(moex_vk *vk, bool on) { vk->tune.attn_simple = on; }

moex_vk_ex_shape moex_vk_testing_ex_default(int half, int kind) { return vk_ex_default_shapes[half != 0][kind]; }

moex_vk_ex_shape moex_vk_testing_ex_shape(const moex_vk *vk, int half, int kind) { return vk->ex_shape[half != 0][kind]; }

int moex_vk_testing_ex_kind(const moex_vk *vk, int half, bool many, int64_t npos) {
    return vk_ex_kind(vk, half != 0, many, npos);
}

bool moex_vk_testing_ex_shape_ok(const moex_vk *vk, int half, moex_vk_ex_shape s) {
    return vk_ex_shape_ok(vk, half != 0, s);
}

void moex_vk_testing_set_ex_shape(moex_vk *vk, int half, int kind, moex_vk_ex_shape s) {
    vk->ex_shape[half != 0][kind] = s;
    vk_pipelines_forget(vk, VK_K_EXPERTS_MV);
}

moex_vk_gu_shape moex_vk_testing_gu_shape(const moex_vk *vk, int npos) { return vk_gu_shape_of(vk, npos); }

bool moex_vk_testing_gu_applies(const moex_vk *vk, const moex_vk_experts *e, int64_t n) {
    return vk_gu_applies(vk, e, n);
}

void moex_vk_testing_set_gu(moex_vk *vk, int wg, int ru, int ch, bool off) {
    vk->tune.gu_wg = wg;
    vk->tune.gu_ru = ru;
    vk->tune.gu_ch = ch;
    vk->tune.gu_off = off;
    vk_pipelines_forget(vk, VK_K_EXPERTS_GU);
}

int moex_vk_testing_experts_halves(moex_vk_cmd *c, const moex_vk_experts *e, moex_vk_ptr x, int64_t n, int k,
                                   moex_vk_ptr ids, moex_vk_ptr weights, moex_vk_ptr resid, moex_vk_ptr y,
                                   moex_vk_ptr scratch, int halves, bool each, moex_error *err) {
    return vk_experts_mv_halves(c, e, x, n, k, ids, weights, resid, y, scratch, halves, each, err);
}
