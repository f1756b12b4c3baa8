# Kernels: quantization formats, dot products, matrix products, experts, pool.
# The quant and matmul tests run twice: on the best SIMD path of this CPU and
# forced onto the portable path, so both stay tested on AVX2 machines.
moex_c_test(test_quant SOURCES test_quant.c LIBS moex_kernels TIMEOUT 60)
add_test(NAME test_quant_portable COMMAND test_quant)
set_tests_properties(test_quant_portable PROPERTIES ENVIRONMENT "MOEX_SIMD=portable" TIMEOUT 60)
moex_c_test(test_matmul SOURCES test_matmul.c LIBS moex_kernels TIMEOUT 120)
add_test(NAME test_matmul_portable COMMAND test_matmul)
set_tests_properties(test_matmul_portable PROPERTIES ENVIRONMENT "MOEX_SIMD=portable" TIMEOUT 120)
moex_c_test(test_matmul_pool SOURCES test_matmul_pool.c LIBS moex_common TIMEOUT 60)
# Benchmark: built next to the tests, only smoke-run by ctest (tiny sizes).
add_executable(bench_kernels ${CMAKE_CURRENT_LIST_DIR}/bench_kernels.c)
target_link_libraries(bench_kernels PRIVATE moex_kernels Threads::Threads ${MATH_LIB})
set_target_properties(bench_kernels PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
add_test(NAME bench_kernels_smoke COMMAND bench_kernels --quick)
set_tests_properties(bench_kernels_smoke PROPERTIES TIMEOUT 60)
