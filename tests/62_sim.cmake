# Latency simulator (sim/ and moex-sim): module unit tests, CLI tests against an
# independent numpy integration, and the throughput benchmark (not a test).
moex_c_test(test_sim SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_sim.c LIBS moex_sim TIMEOUT 120 LABELS sim)

add_test(NAME test_sim_cli
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/test_sim_cli.py $<TARGET_FILE:moex-sim>)
set_tests_properties(test_sim_cli PROPERTIES TIMEOUT 120 LABELS sim)

add_executable(bench_sim ${CMAKE_CURRENT_SOURCE_DIR}/bench_sim.c)
target_link_libraries(bench_sim PRIVATE moex_sim ${MATH_LIB})
set_target_properties(bench_sim PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
