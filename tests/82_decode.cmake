# Fused decode kernels (attention step, head + argmax, norm-fused products,
# the router), with subgroup reductions and with the shared-memory fallback.
add_test(NAME test_vk_decode COMMAND test_vk_ops decode)
add_test(NAME test_vk_decode_shared COMMAND test_vk_ops decode --no-subgroup)
add_test(NAME test_vk_fused_shared COMMAND test_vk_ops fused --no-subgroup)
add_test(NAME test_vk_router_shared COMMAND test_vk_ops router --no-subgroup)   # the staged one-token router
set_tests_properties(test_vk_decode test_vk_decode_shared test_vk_fused_shared test_vk_router_shared PROPERTIES SKIP_RETURN_CODE 77
                     LABELS vulkan TIMEOUT 120 ENVIRONMENT "MOEX_VK_CACHE=${MOEX_VK_TEST_CACHE}")

# Speed (not a test): the decode ops of one layer and the head, fused and unfused.
add_executable(bench_decode ${CMAKE_CURRENT_LIST_DIR}/vk/bench_decode.c)
target_link_libraries(bench_decode PRIVATE moex_hub Threads::Threads ${MATH_LIB})
set_target_properties(bench_decode PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
