# hub/: real hub and worker processes on loopback. Equality with --local,
# worker deaths, stragglers and hedging, hostile clients, corrupt workers
# caught by --verify (test_dist.py); expert downloads (test_download.py); the
# command line and bad inputs (hub_cli_test.sh); and, in Vulkan builds, a
# Vulkan worker beside a CPU one and the hub on Vulkan (test_*_vk.py).
add_test(NAME dist_end_to_end
  COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_dist.py ${CMAKE_BINARY_DIR}/bin ${moex_vocab}
          ${CMAKE_BINARY_DIR}/dist-work)
set_tests_properties(dist_end_to_end PROPERTIES TIMEOUT 600 LABELS "hub;dist" RUN_SERIAL TRUE
  ENVIRONMENT "MOEX_LOG=warn")
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/dist-work)

add_test(NAME dist_download
  COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_download.py ${CMAKE_BINARY_DIR}/bin ${moex_vocab}
          ${CMAKE_BINARY_DIR}/download-work)
set_tests_properties(dist_download PROPERTIES TIMEOUT 120 LABELS "hub;dist" RUN_SERIAL TRUE)
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/download-work)

add_test(NAME hub_cli COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/hub_cli_test.sh ${CMAKE_BINARY_DIR}/bin ${moex_vocab}
         ${CMAKE_BINARY_DIR}/tests/hub_cli)
set_tests_properties(hub_cli PROPERTIES TIMEOUT 120 LABELS hub)

if(MOEX_VULKAN)
  add_test(NAME dist_worker_vk
    COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_worker_vk.py ${CMAKE_BINARY_DIR}/bin ${moex_vocab}
            ${CMAKE_BINARY_DIR}/dist-vk-work)
  set_tests_properties(dist_worker_vk PROPERTIES TIMEOUT 300 LABELS "hub;dist;vulkan" RUN_SERIAL TRUE
    SKIP_RETURN_CODE 77 ENVIRONMENT "MOEX_LOG=warn;${MOEX_VK_TEST_ENV}")
  file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/dist-vk-work)

  add_test(NAME dist_hub_vk
    COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_dist_vk.py ${CMAKE_BINARY_DIR}/bin ${moex_vocab}
            ${CMAKE_BINARY_DIR}/distvk-work)
  set_tests_properties(dist_hub_vk PROPERTIES TIMEOUT 400 LABELS "hub;dist;vulkan" RUN_SERIAL TRUE
    SKIP_RETURN_CODE 77 ENVIRONMENT "MOEX_LOG=warn;${MOEX_VK_TEST_ENV}")
  file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/distvk-work)
endif()

# Hub and workers through moex-relay (bench/relay.c) at 2 ms RTT: the tokens of --local.
add_test(NAME dist_relay
  COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_relay.py ${CMAKE_BINARY_DIR}/bin ${moex_vocab}
          ${CMAKE_BINARY_DIR}/relay-work)
set_tests_properties(dist_relay PROPERTIES TIMEOUT 300 LABELS "hub;dist" RUN_SERIAL TRUE ENVIRONMENT "MOEX_LOG=warn")
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/relay-work)

# moex-hub serve through the official openai npm client (tests/hub/api/setup.sh
# installs it, and chromium): --local and with workers, concurrency, bad
# input, a killed client, /metrics, the status page in headless Chromium;
# in Vulkan builds with a device, --backend vulkan (4 slots) against the Vulkan CLI and alone.
add_test(NAME hub_api
  COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_api.py ${CMAKE_BINARY_DIR}/bin ${moex_vocab}
          ${CMAKE_BINARY_DIR}/api-work)
set_tests_properties(hub_api PROPERTIES TIMEOUT 600 LABELS "hub;api" RUN_SERIAL TRUE SKIP_RETURN_CODE 77
  ENVIRONMENT "MOEX_LOG=warn;${MOEX_VK_TEST_ENV}")
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/api-work)

# The scheduler's batching, text and limits over a scripted engine (no model).
moex_c_test(test_scheduler SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_scheduler.c LIBS moex_hub
            ARGS ${moex_vocab}/ggml-vocab-qwen2.gguf TIMEOUT 120 LABELS "hub;api")
