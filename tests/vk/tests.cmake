# kernels/vk/: every Vulkan kernel against the CPU backend or float64 on
# whatever device is there (lavapipe in CI), with subgroup reductions and with
# the shared-memory fallback (--no-subgroup). Exit code 77 = no Vulkan device.
function(moex_vk_test name)
  moex_c_test(${name} ${ARGN})
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 LABELS vulkan
                       ENVIRONMENT "${MOEX_VK_TEST_ENV}")
endfunction()
# A second run of a test binary with other arguments or environment.
function(moex_vk_rerun name timeout)
  cmake_parse_arguments(R "" "" "COMMAND" ${ARGN})
  add_test(NAME ${name} COMMAND ${R_COMMAND})
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 LABELS vulkan TIMEOUT ${timeout}
                       ENVIRONMENT "${MOEX_VK_TEST_ENV}")
endfunction()

# The block layouts' GLSL views (shaders/_quant.comp) against common/types.h.
moex_vk_test(test_vk_layout SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_vk_layout.c LIBS moex_vk TIMEOUT 120)
moex_vk_test(test_vk_matmul SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_vk_matmul.c LIBS moex_vk TIMEOUT 120)
moex_vk_rerun(test_vk_matmul_shared 120 COMMAND test_vk_matmul --no-subgroup)

add_executable(test_vk_ops ${CMAKE_CURRENT_LIST_DIR}/test_vk_ops.c)
target_link_libraries(test_vk_ops PRIVATE moex_vk Threads::Threads ${MATH_LIB})
set_target_properties(test_vk_ops PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
foreach(sub norm rope attention router experts fused decode warm)
  moex_vk_rerun(test_vk_${sub} 120 COMMAND test_vk_ops ${sub})
endforeach()
# Fused decode kernels (attention step, head + argmax, norm-fused products,
# the staged one-token router) on the shared-memory fallback.
moex_vk_rerun(test_vk_decode_shared 120 COMMAND test_vk_ops decode --no-subgroup)
moex_vk_rerun(test_vk_fused_shared 120 COMMAND test_vk_ops fused --no-subgroup)
moex_vk_rerun(test_vk_router_shared 120 COMMAND test_vk_ops router --no-subgroup)
# Pipelines created up front (moex_vk_warm_*), with the shared-memory variants.
moex_vk_rerun(test_vk_warm_shared 120 COMMAND test_vk_ops warm --no-subgroup)

# The decode expert FFN (experts_mv.comp, experts_gu.comp) against float64.
# ~100-250 s under ASan on CI's 2 cores (each shape compiles its own pipelines
# on lavapipe; the int8 path's float64 references are C code ASan slows).
moex_vk_test(test_vk_experts_mv SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_vk_experts.c LIBS moex_vk TIMEOUT 600)
moex_vk_rerun(test_vk_experts_mv_shared 600 COMMAND test_vk_experts_mv --no-subgroup)

# Prompt-batch products on cooperative matrices (mm_coop.comp). On a device
# without them (lavapipe in CI) the tests ask for MOEX_VK_COOP_EMULATE: the same
# kernel with a shared-memory stand-in for the matrix unit; on a GPU with
# VK_NV_cooperative_matrix the tensor-core path runs.
moex_vk_test(test_vk_coop SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_vk_coop.c LIBS moex_vk TIMEOUT 180)
# 32 columns per step with double-buffered tiles (one barrier per step; at 64
# columns two buffers need more shared memory than lavapipe's 32 KB).
moex_vk_rerun(test_vk_coop_bk32 180 COMMAND test_vk_coop)
set_tests_properties(test_vk_coop_bk32 PROPERTIES
                     ENVIRONMENT "${MOEX_VK_TEST_ENV};MOEX_VK_TEST_TUNE=coop_bk=32,coop_nbuf=2")
