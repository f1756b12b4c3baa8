# sim/ and moex-sim: module unit tests, and CLI tests against an independent
# numpy integration.
moex_c_test(test_sim SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sim.c LIBS moex_sim moex_proto TIMEOUT 120 LABELS sim)
add_test(NAME test_sim_cli COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_sim_cli.py $<TARGET_FILE:moex-sim>)
set_tests_properties(test_sim_cli PROPERTIES TIMEOUT 120 LABELS sim)
# moex-sim token --route-trace / --place-by-load: measured routing replayed,
# replicas placed by the trace's loads, bad traces refused.
add_test(NAME test_sim_routes COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_sim_routes.py $<TARGET_FILE:moex-sim>
         ${CMAKE_BINARY_DIR}/tests/sim_routes)
set_tests_properties(test_sim_routes PROPERTIES TIMEOUT 120 LABELS sim)
