/* Page hints for held experts. The model stays mapped as a whole; holding an
 * expert reads its pages ahead, dropping one lets the kernel reclaim them, so
 * the resident set follows the assignment. Hints only: correctness never
 * depends on them (a read-only file mapping refaults dropped pages). */
#include <sys/mman.h>
#include <unistd.h>

#include "worker/worker.h"

static size_t matrix_bytes(const moex_matrix *m) { return (size_t)m->rows * m->row_bytes; }

size_t moex_worker_expert_bytes(const moex_expert_weights *w) {
    return matrix_bytes(&w->gate) + matrix_bytes(&w->up) + matrix_bytes(&w->down);
}

/* outer: every page the slice touches; else only the pages wholly inside it
 * (pages shared with a neighbouring expert are left alone). */
static void advise(const moex_matrix *m, int advice, bool outer) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t start = (uintptr_t)m->data, end = start + matrix_bytes(m);
    if (!m->data || end <= start) return;
    uintptr_t lo = outer ? start & ~(page - 1) : (start + page - 1) & ~(page - 1);
    uintptr_t hi = outer ? (end + page - 1) & ~(page - 1) : end & ~(page - 1);
    if (hi > lo) (void)madvise((void *)lo, hi - lo, advice);
}

void moex_worker_prefault(const moex_expert_weights *w) {
    advise(&w->gate, MADV_WILLNEED, true);
    advise(&w->up, MADV_WILLNEED, true);
    advise(&w->down, MADV_WILLNEED, true);
}

void moex_worker_release(const moex_expert_weights *w) {
    advise(&w->gate, MADV_DONTNEED, false);
    advise(&w->up, MADV_DONTNEED, false);
    advise(&w->down, MADV_DONTNEED, false);
}
