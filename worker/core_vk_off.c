/* The Vulkan core in a build without Vulkan (-DMOEX_VULKAN=OFF): creating it
 * fails with a message that says so, so `moex-worker --backend vulkan` stops
 * at start-up with that message; nothing else is reachable without a core. */
#include "worker/worker.h"

moex_worker_vk *moex_worker_vk_create(const moex_model *m, const moex_vk_options *opt, int each_rows,
                                      moex_error *err) {
    (void)m, (void)opt;
    moex_fail(err, "this moex-worker was built without Vulkan (-DMOEX_VULKAN=OFF): use --backend cpu, or rebuild "
                   "with -DMOEX_VULKAN=ON");
    return NULL;
}
void moex_worker_vk_free(moex_worker_vk *g) { (void)g; }
const char *moex_worker_vk_device_name(const moex_worker_vk *g) { return (void)g, "none"; }
size_t moex_worker_vk_slot_bytes(const moex_worker_vk *g) { return (void)g, 0; }
int moex_worker_vk_reserve(moex_worker_vk *g, int n_slots, moex_error *err) {
    (void)g, (void)n_slots;
    return moex_fail(err, "built without Vulkan");
}
int moex_worker_vk_capacity(const moex_worker_vk *g) { return (void)g, 0; }
int moex_worker_vk_hold(moex_worker_vk *g, int layer, int expert, const moex_expert_weights *w, moex_error *err) {
    (void)g, (void)layer, (void)expert, (void)w;
    return moex_fail(err, "built without Vulkan");
}
void moex_worker_vk_drop(moex_worker_vk *g, int layer, int expert) { (void)g, (void)layer, (void)expert; }
bool moex_worker_vk_holds(const moex_worker_vk *g, int layer, int expert) {
    return (void)g, (void)layer, (void)expert, false;
}
int moex_worker_vk_n_held(const moex_worker_vk *g) { return (void)g, 0; }
void moex_worker_vk_batch_begin(moex_worker_vk *g) { (void)g; }
int moex_worker_vk_batch_add(moex_worker_vk *g, const moex_proto_msg *dispatch, moex_error *err) {
    (void)g, (void)dispatch;
    return moex_fail(err, "built without Vulkan");
}
int moex_worker_vk_batch_run(moex_worker_vk *g, moex_error *err) {
    (void)g;
    return moex_fail(err, "built without Vulkan");
}
int moex_worker_vk_batch_count(const moex_worker_vk *g) { return (void)g, 0; }
float *moex_worker_vk_batch_values(const moex_worker_vk *g, int i) { return (void)g, (void)i, NULL; }
int moex_worker_vk_warm_up(moex_worker_vk *g, moex_error *err) {
    (void)g;
    return moex_fail(err, "built without Vulkan");
}
int moex_worker_vk_pipelines(const moex_worker_vk *g) { return (void)g, 0; }
int moex_worker_vk_run(moex_worker_vk *g, const moex_proto_msg *dispatch, float **values, moex_error *err) {
    (void)g, (void)dispatch, (void)values;
    return moex_fail(err, "built without Vulkan");
}
void moex_worker_vk_batch_times(const moex_worker_vk *g, double *stage_s, double *gpu_s) {
    (void)g;
    *stage_s = *gpu_s = 0;
}
