/* Writes blocks.glsl (at build time, beside the SPIR-V): every weight block
 * layout's size and field offsets from common/block_views.h as GLSL
 * constants, Q6_K_BYTES, Q6_K_D, ..., which the shaders read instead of
 * spelling the numbers. usage: gen_blocks > blocks.glsl */
#include <stdio.h>

#include "common/block_views.h"

int main(void) {
    printf("// Generated at build time by kernels/vk/shaders/gen_blocks.c from common/types.h: edit that, not this.\n");
    for (size_t i = 0; i < MOEX_N_BLOCK_VIEWS; i++) {
        const moex_block_view *v = &moex_block_views[i];
        printf("#define %s_ELEMS %du\n#define %s_BYTES %zuu\n", v->name, v->elems, v->name, v->bytes);
        for (const moex_block_field *f = v->fields; f->name; f++) printf("#define %s_%s %zuu\n", v->name, f->name, f->offset);
    }
    return 0;
}
