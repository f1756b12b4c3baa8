# The decode expert FFN (experts_mv.comp) against float64, with and without
# subgroup reductions (test_vk_experts is test_vk_ops's subtest). moex_vk_test
# (80_vulkan.cmake) is not defined yet when this fragment is read.
moex_c_test(test_vk_experts_mv SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_vk_experts.c LIBS moex_kernels TIMEOUT 600)
add_test(NAME test_vk_experts_mv_shared COMMAND test_vk_experts_mv --no-subgroup)
foreach(t test_vk_experts_mv test_vk_experts_mv_shared)
  # ~100-250 s under ASan on CI's 2 cores (each shape compiles its own pipelines on lavapipe; the int8
  # path's float64 references are C code ASan slows)
  set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77 LABELS vulkan TIMEOUT 600
                       ENVIRONMENT "MOEX_VK_CACHE=${CMAKE_BINARY_DIR}/vk-cache")
endforeach()
