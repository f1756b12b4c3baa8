# The SPIR-V of kernels/vk/shaders, compiled by glslc at build time and
# embedded in moex_vk (no shader compiler at run time). A variant is what
# changes a kernel's code: its weight type (TYPE), its mode bits (VARIANT,
# kernels/vk/vk_variants.h), subgroup reductions (USE_SUBGROUP, where the
# device has them) and the matrix unit or its shared-memory stand-in (EMU).
# The numbers a device or a tuning switch picks (workgroup sizes, rows per
# thread, tiles) are specialization constants, set when vk_pipeline.c
# creates the pipeline. Listed here: every variant the runtime can pick, no
# more. Each variant becomes spirv/<kernel>.<type>.<mode>[.sg][.emu].inc (a C
# initializer) and a row of the kernel's table in spirv/vk_spirv_<kernel>.c.

set(vk_shader_dir ${CMAKE_CURRENT_SOURCE_DIR}/shaders)
set(vk_spirv_dir ${CMAKE_CURRENT_BINARY_DIR}/spirv)
file(MAKE_DIRECTORY ${vk_spirv_dir})
find_program(MOEX_GLSLC glslc)
if(NOT MOEX_GLSLC)
  message(FATAL_ERROR "glslc not found: the Vulkan shaders are compiled at build time (apt install glslc, or -DMOEX_VULKAN=OFF)")
endif()
file(GLOB vk_shader_parts CONFIGURE_DEPENDS ${vk_shader_dir}/_*.comp)
# The block layouts' sizes and offsets for GLSL (blocks.glsl), written from the C structs by a host program.
add_executable(moex_gen_blocks ${vk_shader_dir}/gen_blocks.c)
target_include_directories(moex_gen_blocks PRIVATE ${CMAKE_SOURCE_DIR})
add_custom_command(OUTPUT ${vk_spirv_dir}/blocks.glsl
  COMMAND moex_gen_blocks > ${vk_spirv_dir}/blocks.glsl
  DEPENDS moex_gen_blocks COMMENT "blocks.glsl (from common/types.h)" VERBATIM)
set(vk_shader_deps ${vk_shader_parts} ${CMAKE_CURRENT_SOURCE_DIR}/vk_variants.h ${vk_spirv_dir}/blocks.glsl)
set(vk_kernels "")

# vk_variant(<kernel> <type, or - for kernels that read no weights> <mode> [SUBGROUP] [EMU <0|1>])
macro(vk_variant kernel type mode)
  cmake_parse_arguments(V "SUBGROUP" "EMU" "" ${ARGN})
  string(REGEX REPLACE "VK_[A-Z]+_" "" vname "${mode}")   # 1|VK_MV_NORM -> 1+NORM
  string(REPLACE "|" "+" vname "${vname}")
  set(vname "${kernel}.${type}.${vname}")
  set(vdefs "-DVARIANT=(${mode})")
  set(vflags 0)
  set(vtype 0)
  if(NOT "${type}" STREQUAL "-")
    list(APPEND vdefs -DTYPE=T_${type})
    set(vtype MOEX_TYPE_${type})
  endif()
  if(V_SUBGROUP)
    list(APPEND vdefs -DUSE_SUBGROUP=1)
    string(APPEND vname ".sg")
    set(vflags VK_SPIRV_SUBGROUP)
  endif()
  if(DEFINED V_EMU)
    list(APPEND vdefs -DEMU=${V_EMU})
    if(V_EMU)
      string(APPEND vname ".emu")
      set(vflags VK_SPIRV_EMU)
    endif()
  endif()
  add_custom_command(OUTPUT ${vk_spirv_dir}/${vname}.inc
    COMMAND ${MOEX_GLSLC} -fshader-stage=compute --target-env=vulkan1.2 -O -mfmt=c -I${CMAKE_CURRENT_SOURCE_DIR}
            -I${vk_spirv_dir}
            ${vdefs} -o ${vk_spirv_dir}/${vname}.inc ${vk_shader_dir}/${kernel}.comp
    DEPENDS ${vk_shader_dir}/${kernel}.comp ${vk_shader_deps}
    COMMENT "glslc ${vname}" VERBATIM)
  if(NOT "${kernel}" IN_LIST vk_kernels)
    list(APPEND vk_kernels ${kernel})
    set(vk_incs_${kernel} "")
    set(vk_rows_${kernel} "")
    set(vk_table_${kernel} "")
  endif()
  list(LENGTH vk_incs_${kernel} vi)
  list(APPEND vk_incs_${kernel} ${vk_spirv_dir}/${vname}.inc)
  string(APPEND vk_rows_${kernel} "static const uint32_t v${vi}[] =\n#include \"${vname}.inc\"\n;\n")
  string(APPEND vk_table_${kernel} "    {${vtype}, ${mode}, ${vflags}, v${vi}, sizeof v${vi} / sizeof v${vi}[0]},\n")
endmacro()

set(vk_types F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K)   # moex_vk_type_supported

# Kernels with one variant per weight type, or with none.
foreach(t ${vk_types})
  vk_variant(dequant ${t} 0)
endforeach()
foreach(t Q4_K Q6_K)   # the down half's int8 input positions (experts_mv.comp VK_EX_PREQ)
  vk_variant(experts_xq ${t} 0)
endforeach()
foreach(k rmsnorm qkrope attn_merge moe_sort moe_combine argmax)
  vk_variant(${k} - 0)
endforeach()
vk_variant(eltwise - 0)   # y = a + b
vk_variant(eltwise - 1)   # y = silu(a) * b
foreach(m 0 1 2)          # Q8_0, Q8_K, Q8_1 rounding
  vk_variant(actq - ${m})
endforeach()
foreach(m 0 2 3 4 5 6 7 8 9)   # the split-K path; the tiled modes by head_dim class and shared memory
  vk_variant(attn - ${m})
endforeach()
foreach(emu 0 1)
  foreach(m 0 1)   # head_dim <= 64, <= 128
    vk_variant(attn_coop - ${m} EMU ${emu})
  endforeach()
endforeach()

# Kernels with subgroup reductions where the device has them, shared memory elsewhere (and with --no-subgroup).
foreach(sg "" SUBGROUP)
  vk_variant(topk - 0 ${sg})
  foreach(m 0 1 2 3)   # head_dim <= 64 << m
    vk_variant(attn_dec - ${m} ${sg})
  endforeach()
  # mv.comp: every mode with and without the fused norm, the router also on the
  # staged loop; Q4_K and f32 rows off 16 bytes take the generic units, and
  # Q4_K's and Q6_K's staged modes int8 x.
  foreach(t ${vk_types})
    set(modes 0 1 2 3 3|VK_MV_STAGE)
    if(t STREQUAL Q4_K OR t STREQUAL F32)
      list(APPEND modes 0|VK_MV_GENERIC 1|VK_MV_GENERIC 2|VK_MV_GENERIC 3|VK_MV_GENERIC 3|VK_MV_GENERIC|VK_MV_STAGE)
    endif()
    if(t STREQUAL Q4_K OR t STREQUAL Q6_K)
      list(APPEND modes 1|VK_MV_IDOT 2|VK_MV_IDOT)
    endif()
    foreach(m ${modes})
      vk_variant(mv ${t} ${m} ${sg})
      vk_variant(mv ${t} ${m}|VK_MV_NORM ${sg})
    endforeach()
    # several tokens a workgroup: the fast units' staged f32 x, Q4_K's and Q6_K's int8 (vk_ops.c mv_tokens_per_group)
    if(t STREQUAL Q4_K OR t STREQUAL Q6_K OR t STREQUAL Q8_0 OR t STREQUAL F32)
      vk_variant(mv ${t} 1|VK_MV_NORM|VK_MV_TOKENS ${sg})
    endif()
    if(t STREQUAL Q4_K OR t STREQUAL Q6_K)
      vk_variant(mv ${t} 1|VK_MV_NORM|VK_MV_TOKENS|VK_MV_IDOT ${sg})
    endif()
  endforeach()
  # experts_mv.comp: both halves of every type; Q4_K also off 16 bytes
  # (generic positions); Q4_K and Q6_K positions also with int8 activations.
  foreach(t ${vk_types})
    set(modes 0 VK_EX_DOWN)
    if(t STREQUAL Q4_K)
      list(APPEND modes VK_EX_GENERIC VK_EX_DOWN|VK_EX_GENERIC)
    endif()
    if(t STREQUAL Q4_K OR t STREQUAL Q6_K)
      list(APPEND modes VK_EX_IDOT VK_EX_DOWN|VK_EX_IDOT VK_EX_DOWN|VK_EX_IDOT|VK_EX_PREQ)
    endif()
    foreach(m ${modes})
      vk_variant(experts_mv ${t} ${m} ${sg})
    endforeach()
  endforeach()
  vk_variant(experts_gu Q4_K 0 ${sg})            # one token's Q4_K gate+up
  vk_variant(experts_gu Q4_K VK_GU_IDOT ${sg})
endforeach()

# Prompt batches: the f32 tiles for every type (dense, 32 x 32 for few rows,
# the experts' gate+up and down); the cooperative-matrix tiles for every type
# but f32, on the matrix unit or emulated, Q4_K also off 16 bytes.
foreach(t ${vk_types})
  foreach(m 0 0|VK_MM_SMALL 1 2)
    vk_variant(mm ${t} ${m})
  endforeach()
  if(NOT t STREQUAL F32)
    set(modes 0 1 2)
    if(t STREQUAL Q4_K)
      list(APPEND modes 0|VK_COOP_GENERIC 1|VK_COOP_GENERIC 2|VK_COOP_GENERIC)
    endif()
    foreach(emu 0 1)
      foreach(m ${modes})
        vk_variant(mm_coop ${t} ${m} EMU ${emu})
      endforeach()
    endforeach()
  endif()
endforeach()

# One C file per kernel (its SPIR-V arrays and table), one index of the tables.
set(vk_spirv_sources "")
set(vk_index_decls "")
set(vk_index_rows "")
set(vk_count 0)
foreach(k ${vk_kernels})
  string(TOUPPER ${k} K)
  list(LENGTH vk_incs_${k} n)
  math(EXPR vk_count "${vk_count} + ${n}")
  set(rows "${vk_rows_${k}}")
  set(table "${vk_table_${k}}")
  file(CONFIGURE OUTPUT ${vk_spirv_dir}/vk_spirv_${k}.c CONTENT
"/* generated by kernels/vk/shaders/variants.cmake: the SPIR-V variants of shaders/${k}.comp */
#include \"kernels/vk/vk_internal.h\"

${rows}
static const vk_spirv rows[] = {
${table}};
const vk_spirv_table vk_spirv_${k} = {rows, (int)(sizeof rows / sizeof rows[0])};
" @ONLY)
  set_source_files_properties(${vk_spirv_dir}/vk_spirv_${k}.c PROPERTIES OBJECT_DEPENDS "${vk_incs_${k}}")
  list(APPEND vk_spirv_sources ${vk_spirv_dir}/vk_spirv_${k}.c ${vk_incs_${k}})
  string(APPEND vk_index_decls "extern const vk_spirv_table vk_spirv_${k};\n")
  string(APPEND vk_index_rows "    [VK_K_${K}] = &vk_spirv_${k},\n")
endforeach()
file(CONFIGURE OUTPUT ${vk_spirv_dir}/vk_spirv_index.c CONTENT
"/* generated by kernels/vk/shaders/variants.cmake: every kernel's SPIR-V variants (${vk_count}) */
#include \"kernels/vk/vk_internal.h\"

${vk_index_decls}
const vk_spirv_table *const vk_spirv_tables[VK_K_COUNT] = {
${vk_index_rows}};
" @ONLY)
list(APPEND vk_spirv_sources ${vk_spirv_dir}/vk_spirv_index.c)
message(STATUS "kernels/vk: ${vk_count} SPIR-V variants")
