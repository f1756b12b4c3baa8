# proto/: unit tests, a replay of the fuzz target over mutated seed frames
# (every build), and in a fuzz tree a 20 s libFuzzer run.
moex_c_test(test_proto SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_proto.c LIBS moex_proto TIMEOUT 60 LABELS proto)
# Seed frames of every message type and dtype, written by test_proto.
set(moex_proto_seeds ${CMAKE_BINARY_DIR}/fuzz-seeds/proto)
add_test(NAME proto_fuzz_seeds COMMAND sh -c "mkdir -p '${moex_proto_seeds}' && exec \"$0\" --write-corpus '${moex_proto_seeds}'"
  $<TARGET_FILE:test_proto>)
set_tests_properties(proto_fuzz_seeds PROPERTIES FIXTURES_SETUP proto_seeds LABELS proto)
# The fuzz target's checks (decode, re-encode to the same bytes) on mutations of the seeds.
moex_c_test(test_proto_fuzz_replay
  SOURCES ${CMAKE_SOURCE_DIR}/tests/fuzz/replay.c ${CMAKE_SOURCE_DIR}/proto/fuzz_proto.c
  LIBS moex_proto ARGS ${moex_proto_seeds} 10 2000 TIMEOUT 60 LABELS proto)
set_tests_properties(test_proto_fuzz_replay PROPERTIES FIXTURES_REQUIRED proto_seeds)
if(MOEX_FUZZ)
  add_test(NAME fuzz_proto COMMAND sh ${CMAKE_SOURCE_DIR}/tests/fuzz/run_fuzz.sh ${CMAKE_BINARY_DIR} fuzz_proto 20
    ${moex_proto_seeds})
  set_tests_properties(fuzz_proto PROPERTIES FIXTURES_REQUIRED proto_seeds TIMEOUT 120 LABELS fuzz)
endif()
# docs/PROTOCOL.md's ERROR code table against the one definition in proto/.
add_test(NAME proto_error_table COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/check_error_table.py
         $<TARGET_FILE:test_proto> ${CMAKE_SOURCE_DIR}/docs/PROTOCOL.md)
set_tests_properties(proto_error_table PROPERTIES TIMEOUT 30 LABELS proto)
