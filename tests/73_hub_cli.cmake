# moex-hub's command line and bad inputs (flags, files, tokens).
add_test(NAME hub_cli COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/hub_cli_test.sh ${CMAKE_BINARY_DIR}/bin
         ${MOEX_FIXTURES}/vocab ${CMAKE_BINARY_DIR}/tests/hub_cli)
set_tests_properties(hub_cli PROPERTIES TIMEOUT 120 LABELS "hub")
