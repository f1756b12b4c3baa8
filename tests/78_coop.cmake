# Prompt-batch products on cooperative matrices (mm_coop.comp). On a device
# without them (lavapipe in CI) the tests ask for MOEX_VK_COOP_EMULATE: the same kernel
# with a shared-memory stand-in for the matrix unit; on a GPU with
# VK_NV_cooperative_matrix the tensor-core path runs. Exit 77 = skipped.
moex_c_test(test_vk_coop SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_vk_coop.c LIBS moex_kernels TIMEOUT 180)
set_tests_properties(test_vk_coop PROPERTIES SKIP_RETURN_CODE 77 LABELS vulkan
                     ENVIRONMENT "MOEX_VK_CACHE=${CMAKE_BINARY_DIR}/vk-cache")
# 32 columns per step with double-buffered tiles (one barrier per step; at 64
# columns two buffers need more shared memory than lavapipe's 32 KB).
add_test(NAME test_vk_coop_bk32 COMMAND test_vk_coop)
set_tests_properties(test_vk_coop_bk32 PROPERTIES SKIP_RETURN_CODE 77 LABELS vulkan TIMEOUT 180
                     ENVIRONMENT "MOEX_VK_CACHE=${CMAKE_BINARY_DIR}/vk-cache;MOEX_VK_COOP_BK=32;MOEX_VK_COOP_NBUF=2")
# The whole model: prompt batch on the coop kernels vs the f32 tiles.
add_executable(test_vk_coop_forward ${CMAKE_CURRENT_LIST_DIR}/test_vk_coop_forward.c)
target_link_libraries(test_vk_coop_forward PRIVATE moex_hub Threads::Threads ${MATH_LIB})
set_target_properties(test_vk_coop_forward PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
add_test(NAME test_vk_coop_forward COMMAND test_vk_coop_forward ${CMAKE_BINARY_DIR}/vk-models/qwen3moe_q4_K_M.gguf)
# Cold, a CPU driver compiles the emulated variants in ~20 s (~140 s under
# ASan, whose allocator slows the driver's compiler); the SPIR-V and pipeline
# caches make later runs quick.
set_tests_properties(test_vk_coop_forward PROPERTIES FIXTURES_REQUIRED vk_models SKIP_RETURN_CODE 77 LABELS vulkan
                     TIMEOUT 400 ENVIRONMENT "MOEX_VK_CACHE=${CMAKE_BINARY_DIR}/vk-cache")
