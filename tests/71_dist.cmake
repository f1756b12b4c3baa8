# Distributed inference end to end: real hub and worker processes on loopback
# (tests/dist/test_dist.py): equality with --local, worker deaths, stragglers
# and hedging, hostile clients, corrupt workers caught by --verify.
add_test(NAME dist_end_to_end
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/dist/test_dist.py ${CMAKE_BINARY_DIR}/bin
          ${MOEX_FIXTURES}/vocab ${CMAKE_BINARY_DIR}/dist-work)
set_tests_properties(dist_end_to_end PROPERTIES TIMEOUT 600 LABELS dist RUN_SERIAL TRUE
  ENVIRONMENT "MOEX_LOG=warn")
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/dist-work)
