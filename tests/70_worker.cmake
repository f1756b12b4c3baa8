# Worker (issue 4): the transport-free core against a float64 reference and
# the hub's executors, and moex-worker's command line and failure exits.
set(moex_worker_fixture ${CMAKE_BINARY_DIR}/worker-fixtures/qwen3moe-q8_0.gguf)
add_test(NAME worker_model
  COMMAND sh -c "mkdir -p \"$(dirname \"$1\")\" && exec \"$0\" gen --arch qwen3moe --preset test --vocab \"$2\" --type q8_0 --seed 3 -o \"$1\""
          $<TARGET_FILE:moex-gguf> ${moex_worker_fixture} ${MOEX_FIXTURES}/vocab/ggml-vocab-llama-spm.gguf)
set_tests_properties(worker_model PROPERTIES FIXTURES_SETUP worker_model TIMEOUT 60)

moex_c_test(test_worker_core SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_worker_core.c LIBS moex_worker
  ARGS ${moex_worker_fixture} TIMEOUT 60)
set_tests_properties(test_worker_core PROPERTIES FIXTURES_REQUIRED worker_model)

add_test(NAME worker_cli COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/test_worker_cli.sh $<TARGET_FILE:moex-worker>
  ${moex_worker_fixture})
set_tests_properties(worker_cli PROPERTIES FIXTURES_REQUIRED worker_model TIMEOUT 60)
