# The distributed hub on Vulkan (hub/forward_vk_dist.c): the GPU runs
# attention, router and head, the experts go to an executor between layer
# segments. Exit code 77 = no Vulkan device: skipped, not failed.
set(moex_distvk_dir ${CMAKE_BINARY_DIR}/distvk-models)
set(moex_distvk_model ${moex_distvk_dir}/qwen3moe_q4_K_M.gguf)
file(MAKE_DIRECTORY ${moex_distvk_dir} ${CMAKE_BINARY_DIR}/distvk-work)
add_test(NAME distvk_gen_model
         COMMAND $<TARGET_FILE:moex-gguf> gen --arch qwen3moe --preset test
                 --vocab ${MOEX_FIXTURES}/vocab/ggml-vocab-llama-spm.gguf --type q4_K_M --seed 1 --quiet
                 -o ${moex_distvk_model})
set_tests_properties(distvk_gen_model PROPERTIES FIXTURES_SETUP distvk_models LABELS vulkan TIMEOUT 120)

# In-process: against moex_vk_forward and the CPU backend, failing executors, the error path.
add_executable(test_vk_dist ${CMAKE_CURRENT_LIST_DIR}/test_vk_dist.c)
target_link_libraries(test_vk_dist PRIVATE moex_hub Threads::Threads ${MATH_LIB})
set_target_properties(test_vk_dist PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
add_test(NAME test_vk_dist COMMAND test_vk_dist ${moex_distvk_model})
set_tests_properties(test_vk_dist PROPERTIES FIXTURES_REQUIRED distvk_models SKIP_RETURN_CODE 77 LABELS vulkan
                     TIMEOUT 180 ENVIRONMENT "MOEX_VK_CACHE=${CMAKE_BINARY_DIR}/vk-cache")

# Real processes on loopback: moex-hub --backend vulkan with CPU workers (tests/dist/test_dist_vk.py).
add_test(NAME dist_hub_vk
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/dist/test_dist_vk.py ${CMAKE_BINARY_DIR}/bin
          ${MOEX_FIXTURES}/vocab ${CMAKE_BINARY_DIR}/distvk-work)
set_tests_properties(dist_hub_vk PROPERTIES TIMEOUT 400 LABELS "dist;vulkan" RUN_SERIAL TRUE SKIP_RETURN_CODE 77
  ENVIRONMENT "MOEX_LOG=warn;MOEX_VK_CACHE=${CMAKE_BINARY_DIR}/vk-cache")

# Per-layer overhead of the distributed path (not a test): tests/bench_vk_dist.c.
add_executable(bench_vk_dist ${CMAKE_CURRENT_LIST_DIR}/bench_vk_dist.c)
target_link_libraries(bench_vk_dist PRIVATE moex_hub Threads::Threads ${MATH_LIB})
set_target_properties(bench_vk_dist PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
