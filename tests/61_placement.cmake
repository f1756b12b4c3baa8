# Placement: consistent-hash ring (issue 3 part 2).
moex_c_test(test_placement SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_placement.c LIBS moex_placement TIMEOUT 60)
add_executable(bench_placement ${CMAKE_CURRENT_LIST_DIR}/bench_placement.c)
target_link_libraries(bench_placement PRIVATE moex_placement ${MATH_LIB})
set_target_properties(bench_placement PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
