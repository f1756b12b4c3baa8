# hub/: real hub and worker processes on loopback. Equality with --local,
# worker deaths, stragglers and hedging, hostile clients, corrupt workers
# caught by --verify (test_dist.py); expert downloads (test_download.py); the
# worker page (test_static.py) and TLS (test_tls.py); the command line and
# bad inputs (hub_cli_test.sh); and, in Vulkan builds, a Vulkan worker beside
# a CPU one and the hub on Vulkan (test_*_vk.py).
add_test(NAME dist_end_to_end
  COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_dist.py ${CMAKE_BINARY_DIR}/bin ${moex_vocab}
          ${CMAKE_BINARY_DIR}/dist-work)
set_tests_properties(dist_end_to_end PROPERTIES TIMEOUT 600 LABELS "hub;dist" RUN_SERIAL TRUE
  ENVIRONMENT "MOEX_LOG=warn")
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/dist-work)

# conn.c: the per-connection bound on queued bytes, close after flush, kill.
moex_c_test(test_hub_conn SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_hub_conn.c LIBS moex_hub TIMEOUT 30 LABELS hub)
# registry.c through the network thread's routing, on detached connections: the
# worker-record bound, the JOIN rate, repeated JOINs, reconnects with the session
# key, bans by key and not by name, rejections queued before the close.
moex_c_test(test_hub_registry SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_hub_registry.c LIBS moex_hub TIMEOUT 30
  LABELS hub)

# The frame-sequence fuzz target (hub/fuzz_hub.c: registry and remote
# executor driven by fake workers' frames): a tiny model and seed sessions,
# the target replayed over mutations of them in every build, and in a fuzz
# tree a 30 s libFuzzer run.
set(moex_hub_fuzz ${CMAKE_BINARY_DIR}/fuzz-seeds/hub)
add_test(NAME hub_fuzz_fixture COMMAND sh -c
  "mkdir -p '${moex_hub_fuzz}/seeds' && \"$0\" gen --arch qwen3moe --preset test --layers 2 --hidden 64 --heads 2 --kv-heads 1 --head-dim 32 --ff 128 --experts 4 --experts-used 2 --expert-ff 64 --ctx 64 --vocab '${moex_vocab}/ggml-vocab-llama-spm.gguf' --type q8_0 --seed 3 -o '${moex_hub_fuzz}/model.gguf' --quiet && '${MOEX_PYTHON}' '${CMAKE_CURRENT_LIST_DIR}/fuzz_hub_seeds.py' '${moex_hub_fuzz}/seeds'"
  $<TARGET_FILE:moex-gguf>)
set_tests_properties(hub_fuzz_fixture PROPERTIES FIXTURES_SETUP hub_fuzz LABELS hub TIMEOUT 60)
moex_c_test(test_hub_fuzz_replay SOURCES ${CMAKE_SOURCE_DIR}/tests/fuzz/replay.c ${CMAKE_SOURCE_DIR}/hub/fuzz_hub.c
  LIBS moex_hub ARGS ${moex_hub_fuzz}/seeds 5 300 TIMEOUT 300 LABELS hub)
set_tests_properties(test_hub_fuzz_replay PROPERTIES FIXTURES_REQUIRED hub_fuzz
  ENVIRONMENT "MOEX_FUZZ_HUB_MODEL=${moex_hub_fuzz}/model.gguf")
if(MOEX_FUZZ)
  add_test(NAME fuzz_hub COMMAND sh ${CMAKE_SOURCE_DIR}/tests/fuzz/run_fuzz.sh ${CMAKE_BINARY_DIR} fuzz_hub 30
    ${moex_hub_fuzz}/seeds)
  set_tests_properties(fuzz_hub PROPERTIES FIXTURES_REQUIRED hub_fuzz TIMEOUT 120 LABELS fuzz
    ENVIRONMENT "MOEX_FUZZ_HUB_MODEL=${moex_hub_fuzz}/model.gguf")
endif()

# Hostile and broken peers (test_hostile.py): Python peers on real sockets
# beside real workers, one scenario per defect of issue 20 and per resource bound.
add_test(NAME dist_hostile
  COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_hostile.py ${CMAKE_BINARY_DIR}/bin ${moex_vocab}
          ${CMAKE_BINARY_DIR}/hostile-work)
set_tests_properties(dist_hostile PROPERTIES TIMEOUT 600 LABELS "hub;dist" RUN_SERIAL TRUE
  ENVIRONMENT "MOEX_LOG=warn")
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/hostile-work)

# Chaos (test_chaos.py): generation while workers are killed, stopped, slowed,
# restarted and corrupted and the hub is killed once; the short run (the long
# one's figures are in docs/PERF.md).
add_test(NAME dist_chaos
  COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_chaos.py ${CMAKE_BINARY_DIR}/bin ${moex_vocab}
          ${CMAKE_BINARY_DIR}/chaos-work)
set_tests_properties(dist_chaos PROPERTIES TIMEOUT 400 LABELS "hub;dist" RUN_SERIAL TRUE
  ENVIRONMENT "MOEX_LOG=warn;MOEX_TEST_SANITIZED=$<BOOL:${MOEX_SANITIZE}>")
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/chaos-work)

add_test(NAME dist_download
  COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_download.py ${CMAKE_BINARY_DIR}/bin ${moex_vocab}
          ${CMAKE_BINARY_DIR}/download-work)
set_tests_properties(dist_download PROPERTIES TIMEOUT 120 LABELS "hub;dist" RUN_SERIAL TRUE)
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/download-work)

# The browser worker page served by the hub (test_static.py: a generated page
# directory, no emscripten needed): types, HEAD, 404s, traversal, tokens,
# streaming, keep-alive, the default directory, moex-hub serve.
add_test(NAME hub_static
  COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_static.py ${CMAKE_BINARY_DIR}/bin ${moex_vocab}
          ${CMAKE_BINARY_DIR}/static-work)
set_tests_properties(hub_static PROPERTIES TIMEOUT 120 LABELS "hub;dist" RUN_SERIAL TRUE ENVIRONMENT "MOEX_LOG=warn")
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/static-work)

# The hub over TLS (test_tls.py): the self-signed certificate (made, reused,
# renewed), a given pair, HTTPS, native workers over wss:// with --ca, refused
# without it, --insecure.
add_test(NAME hub_tls
  COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_tls.py ${CMAKE_BINARY_DIR}/bin ${moex_vocab}
          ${CMAKE_BINARY_DIR}/tls-work)
set_tests_properties(hub_tls PROPERTIES TIMEOUT 180 LABELS "hub;dist;worker" RUN_SERIAL TRUE ENVIRONMENT "MOEX_LOG=warn")
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/tls-work)

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
