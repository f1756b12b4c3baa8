# Elementwise kernels, attention and the sampler, each against float64 /
# analytic references computed in the test (random inputs, seed printed).
moex_c_test(test_ops SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops.c LIBS moex_kernels TIMEOUT 120 LABELS kernels)
moex_c_test(test_sampler SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sampler.c LIBS moex_common TIMEOUT 120 LABELS common)
