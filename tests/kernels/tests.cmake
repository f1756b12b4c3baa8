# kernels/ (CPU): quantization formats, dot products, matrix products,
# experts, elementwise ops and attention, each against float64 references.
# The quant and matmul tests run on the best SIMD path of this CPU, forced onto
# the portable path, and (on AVX-512 VNNI machines, whose plain runs use the
# VNNI table) forced onto AVX2, so every path stays tested.
moex_c_test(test_quant SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_quant.c LIBS moex_kernels TIMEOUT 60 LABELS kernels)
moex_c_test(test_matmul SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_matmul.c LIBS moex_kernels TIMEOUT 120 LABELS kernels)
foreach(simd portable avx2)
  add_test(NAME test_quant_${simd} COMMAND test_quant)
  add_test(NAME test_matmul_${simd} COMMAND test_matmul)
  set_tests_properties(test_quant_${simd} PROPERTIES ENVIRONMENT "MOEX_TEST_SIMD=${simd}" TIMEOUT 60 LABELS kernels)
  set_tests_properties(test_matmul_${simd} PROPERTIES ENVIRONMENT "MOEX_TEST_SIMD=${simd}" TIMEOUT 120 LABELS kernels)
endforeach()
moex_c_test(test_ops SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops.c LIBS moex_kernels TIMEOUT 120 LABELS kernels)
# What an honest expert result is (the hub's --verify): every SIMD table, moex_experts_run and emulated
# float-order (GPU-like) backends inside the bound, wrong results outside it.
moex_c_test(test_expert_check SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_expert_check.c LIBS moex_kernels TIMEOUT 120
  LABELS kernels)
