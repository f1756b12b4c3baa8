# worker/: the transport-free core against a float64 reference and the
# engine's executors, moex-worker's command line and failure exits, and
# (Vulkan builds) the Vulkan core against the CPU core on the same frames.
set(moex_worker_fixture ${CMAKE_BINARY_DIR}/worker-fixtures/qwen3moe-q8_0.gguf)
add_test(NAME worker_model
  COMMAND sh -c "mkdir -p \"$(dirname \"$1\")\" && exec \"$0\" gen --arch qwen3moe --preset test --vocab \"$2\" --type q8_0 --seed 3 -o \"$1\""
          $<TARGET_FILE:moex-gguf> ${moex_worker_fixture} ${moex_vocab}/ggml-vocab-llama-spm.gguf)
set_tests_properties(worker_model PROPERTIES FIXTURES_SETUP worker_model TIMEOUT 60)

# The hub's executors are the references of the core's results: the test links the engine too.
moex_c_test(test_worker_core SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_worker_core.c LIBS moex_worker moex_engine
  ARGS ${moex_worker_fixture} TIMEOUT 60 LABELS worker)
set_tests_properties(test_worker_core PROPERTIES FIXTURES_REQUIRED worker_model)

add_test(NAME worker_cli COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/test_worker_cli.sh $<TARGET_FILE:moex-worker>
  ${moex_worker_fixture})
set_tests_properties(worker_cli PROPERTIES FIXTURES_REQUIRED worker_model TIMEOUT 60 LABELS worker)

# The session against a fake hub (python3 websockets) and moex-hub: one message
# of RESULTs per message of DISPATCHes, each the bytes worker_ref (the core on
# that frame alone) gives; CANCEL, malformed frames, the hub's ERRORs, wrong
# tokens, another model. A second model (another seed) is "another GGUF".
set(moex_worker_fixture2 ${CMAKE_BINARY_DIR}/worker-fixtures/qwen3moe-q8_0-seed4.gguf)
add_test(NAME worker_model2
  COMMAND sh -c "mkdir -p \"$(dirname \"$1\")\" && exec \"$0\" gen --arch qwen3moe --preset test --vocab \"$2\" --type q8_0 --seed 4 --quiet -o \"$1\""
          $<TARGET_FILE:moex-gguf> ${moex_worker_fixture2} ${moex_vocab}/ggml-vocab-llama-spm.gguf)
set_tests_properties(worker_model2 PROPERTIES FIXTURES_SETUP worker_model TIMEOUT 60)
add_executable(worker_ref ${CMAKE_CURRENT_LIST_DIR}/worker_ref.c)
target_link_libraries(worker_ref PRIVATE moex_worker)
set_target_properties(worker_ref PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/worker-session-work)
if(MOEX_VULKAN)
  set(moex_worker_session_vk --vulkan)
endif()
add_test(NAME worker_session
  COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_worker_session.py $<TARGET_FILE:moex-worker>
          $<TARGET_FILE:worker_ref> $<TARGET_FILE:moex-hub> ${moex_worker_fixture} ${moex_worker_fixture2}
          ${CMAKE_BINARY_DIR}/worker-session-work ${moex_worker_session_vk})
set_tests_properties(worker_session PROPERTIES FIXTURES_REQUIRED worker_model TIMEOUT 180 LABELS worker
  RESOURCE_LOCK moex_ports
  ENVIRONMENT "MOEX_LOG=info;${MOEX_VK_TEST_ENV}")

if(MOEX_VULKAN)
  set(moex_worker_vk_dir ${CMAKE_BINARY_DIR}/worker-vk-fixtures)
  set(moex_worker_vk_models "")
  foreach(wtype q8_0 q4_K_M)
    set(model ${moex_worker_vk_dir}/qwen3moe-${wtype}.gguf)
    list(APPEND moex_worker_vk_models ${model})
    add_test(NAME worker_vk_model_${wtype}
             COMMAND $<TARGET_FILE:moex-gguf> gen --arch qwen3moe --preset test
                     --vocab ${moex_vocab}/ggml-vocab-llama-spm.gguf --type ${wtype} --seed 5 --quiet -o ${model})
    set_tests_properties(worker_vk_model_${wtype} PROPERTIES FIXTURES_SETUP worker_vk_models TIMEOUT 60)
  endforeach()
  file(MAKE_DIRECTORY ${moex_worker_vk_dir})
  moex_c_test(test_worker_vk SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_worker_vk.c LIBS moex_worker
    ARGS ${moex_worker_vk_models} TIMEOUT 120)
  set_tests_properties(test_worker_vk PROPERTIES FIXTURES_REQUIRED worker_vk_models SKIP_RETURN_CODE 77
    LABELS "worker;vulkan" ENVIRONMENT "${MOEX_VK_TEST_ENV}")
  # the same with ops taking the kernels by row count (the prompt's tiles past 8 rows): --each-rows 0
  add_test(NAME test_worker_vk_by_rows COMMAND test_worker_vk --each-rows 0 ${moex_worker_vk_models})
  set_tests_properties(test_worker_vk_by_rows PROPERTIES FIXTURES_REQUIRED worker_vk_models SKIP_RETURN_CODE 77
    TIMEOUT 120 LABELS "worker;vulkan" ENVIRONMENT "${MOEX_VK_TEST_ENV}")
endif()
