# CPU prefill kernels (kernels/dot_vnni.c): on AVX-512 VNNI machines the
# plain runs of test_quant / test_matmul (20_kernels_quant.cmake) use the VNNI
# table; these run the same tests forced onto the AVX2 path, so each path
# stays tested (test_quant also compares VNNI with AVX2 bit for bit).
add_test(NAME test_quant_avx2 COMMAND test_quant)
set_tests_properties(test_quant_avx2 PROPERTIES ENVIRONMENT "MOEX_SIMD=avx2" TIMEOUT 60)
add_test(NAME test_matmul_avx2 COMMAND test_matmul)
set_tests_properties(test_matmul_avx2 PROPERTIES ENVIRONMENT "MOEX_SIMD=avx2" TIMEOUT 120)
