# hub/: real hub and worker processes on loopback. Equality with --local,
# worker deaths, stragglers and hedging, hostile clients, corrupt workers
# caught by --verify (test_dist.py); expert downloads (test_download.py); the
# worker page (test_static.py) and TLS (test_tls.py); the command line and
# bad inputs (hub_cli_test.sh); and, in Vulkan builds, a Vulkan worker beside
# a CPU one and the hub on Vulkan (test_*_vk.py).

# moex_hub_script_test(name script work_dir TIMEOUT s LABELS ... [SKIP77] [ALONE] [ENV ...]):
# tests/hub/<script> over real processes, run as SCRIPT BIN_DIR VOCAB_DIR
# <build>/<work_dir>. They bind ports, so one at a time (RESOURCE_LOCK
# moex_ports, which every test that starts a hub takes), beside the unit
# tests; ALONE: with nothing beside it (RUN_SERIAL: its checks compare wall
# times). SKIP77: exit 77 means skipped (no device, no Chromium).
function(moex_hub_script_test name script work)
  cmake_parse_arguments(T "SKIP77;ALONE" "TIMEOUT" "LABELS;ENV" ${ARGN})
  add_test(NAME ${name} COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/${script} ${CMAKE_BINARY_DIR}/bin
           ${moex_vocab} ${CMAKE_BINARY_DIR}/${work})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}" RESOURCE_LOCK moex_ports)
  if(T_ALONE)
    set_tests_properties(${name} PROPERTIES RUN_SERIAL TRUE)
  endif()
  if(T_SKIP77)
    set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77)
  endif()
  if(T_ENV)
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${T_ENV}")
  endif()
  file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/${work})
endfunction()

moex_hub_script_test(dist_end_to_end test_dist.py dist-work TIMEOUT 600 LABELS "hub;dist" ALONE
  ENV "MOEX_LOG=warn")

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
# tree a 20 s libFuzzer run.
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
  add_test(NAME fuzz_hub COMMAND sh ${CMAKE_SOURCE_DIR}/tests/fuzz/run_fuzz.sh ${CMAKE_BINARY_DIR} fuzz_hub 20
    ${moex_hub_fuzz}/seeds)
  set_tests_properties(fuzz_hub PROPERTIES FIXTURES_REQUIRED hub_fuzz TIMEOUT 120 LABELS fuzz
    ENVIRONMENT "MOEX_FUZZ_HUB_MODEL=${moex_hub_fuzz}/model.gguf")
endif()

# Hostile and broken peers (test_hostile.py): Python peers on real sockets
# beside real workers, one scenario per defect of issue 20 and per resource bound.
moex_hub_script_test(dist_hostile test_hostile.py hostile-work TIMEOUT 600 LABELS "hub;dist"
  ENV "MOEX_LOG=warn")

# Chaos (test_chaos.py): generation while workers are killed, stopped, slowed,
# restarted and corrupted and the hub is killed once; the short run (the long
# one's figures are in docs/PERF.md).
moex_hub_script_test(dist_chaos test_chaos.py chaos-work TIMEOUT 400 LABELS "hub;dist"
  ENV "MOEX_LOG=warn;MOEX_TEST_SANITIZED=$<BOOL:${MOEX_SANITIZE}>")

moex_hub_script_test(dist_download test_download.py download-work TIMEOUT 120 LABELS "hub;dist")

# The browser worker page served by the hub (test_static.py: a generated page
# directory, no emscripten needed): types, HEAD, 404s, traversal, tokens,
# streaming, keep-alive, the default directory, moex-hub serve.
moex_hub_script_test(hub_static test_static.py static-work TIMEOUT 120 LABELS "hub;dist"
  ENV "MOEX_LOG=warn")

# The hub over TLS (test_tls.py): the self-signed certificate (made, reused,
# renewed), a given pair, HTTPS, native workers over wss:// with --ca, refused
# without it, --insecure.
moex_hub_script_test(hub_tls test_tls.py tls-work TIMEOUT 180 LABELS "hub;dist;worker"
  ENV "MOEX_LOG=warn")

add_test(NAME hub_cli COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/hub_cli_test.sh ${CMAKE_BINARY_DIR}/bin ${moex_vocab}
         ${CMAKE_BINARY_DIR}/tests/hub_cli)
set_tests_properties(hub_cli PROPERTIES TIMEOUT 120 LABELS hub)

if(MOEX_VULKAN)
  moex_hub_script_test(dist_worker_vk test_worker_vk.py dist-vk-work TIMEOUT 300 LABELS "hub;dist;vulkan" SKIP77
    ENV "MOEX_LOG=warn;${MOEX_VK_TEST_ENV}")
  moex_hub_script_test(dist_hub_vk test_dist_vk.py distvk-work TIMEOUT 400 LABELS "hub;dist;vulkan" SKIP77
    ENV "MOEX_LOG=warn;${MOEX_VK_TEST_ENV}")
endif()

# Hub and workers through moex-relay (bench/relay.c) at 2 ms RTT: the tokens of --local.
moex_hub_script_test(dist_relay test_relay.py relay-work TIMEOUT 300 LABELS "hub;dist"
  ENV "MOEX_LOG=warn")

# moex-hub serve through the official openai npm client (tests/hub/api/setup.sh
# installs it, and chromium): --local and with workers, concurrency, bad
# input, a killed client, /metrics, the status page in headless Chromium;
# in Vulkan builds with a device, --backend vulkan (4 slots) against the Vulkan CLI and alone.
moex_hub_script_test(hub_api test_api.py api-work TIMEOUT 600 LABELS "hub;api" SKIP77
  ENV "MOEX_LOG=warn;${MOEX_VK_TEST_ENV}")
# What agents use (test_api_agents.py): Jinja chat templates (the GGUF's, a file's, /apply-template), grammars,
# response_format json_object / json_schema, forced tool calls and the tool round trip through the official client
# (api/agents_test.mjs: chat.completions.parse with a zod schema), the 400s of bad grammars, schemas and tools.
moex_hub_script_test(hub_api_agents test_api_agents.py api-agents-work TIMEOUT 600 LABELS "hub;api" SKIP77
  ENV "MOEX_LOG=warn")

# The scheduler's batching, text and limits over a scripted engine (no model).
# A thinking model's answer split into reasoning and content, whole and in random pieces.
moex_c_test(test_reasoning SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_reasoning.c LIBS moex_serve TIMEOUT 60 LABELS hub)
moex_c_test(test_scheduler SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_scheduler.c LIBS moex_serve
            ARGS ${moex_vocab}/ggml-vocab-qwen2.gguf TIMEOUT 120 LABELS "hub;api")

# moex-hub serve against hostile and careless HTTP clients (test_api_hostile.py): bytes after a body, keys
# checked on the headers, framing, h2c, JSON errors everywhere, who gets the weights, /health, worker names.
moex_hub_script_test(hub_api_hostile test_api_hostile.py api-hostile-work TIMEOUT 300 LABELS "hub;api")

# Tool calls out of model output per chat-template family (serve/tool_calls*.c): whole and in random pieces,
# format detection (the real templates too when MOEX_TEMPLATES_DIR names them), the forced-call grammars.
moex_c_test(test_tool_calls SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tool_calls.c LIBS moex_serve TIMEOUT 60 LABELS hub)
set_tests_properties(test_tool_calls PROPERTIES DEPENDS peer_setup
                     ENVIRONMENT "MOEX_TEMPLATES_DIR=${CMAKE_SOURCE_DIR}/.peer/templates/models/templates")

# Constrained sampling (serve/grammar.c, serve/json_schema.c): GBNF parse errors with line and column, llama.cpp's
# sample grammars, random JSON byte by byte and in random token splits, mask == allows, UTF-8 across tokens, the
# bound on ambiguous grammars, schemas compiled (test_grammar --bench times mask and allows on the Qwen2 vocab);
# and differentially against Python's json.loads and a schema validator (test_grammar.py through grammar_check).
moex_c_test(test_grammar SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_grammar.c LIBS moex_serve TIMEOUT 60 LABELS hub)
add_executable(grammar_check ${CMAKE_CURRENT_LIST_DIR}/grammar_check.c)
target_link_libraries(grammar_check PRIVATE moex_serve)
set_target_properties(grammar_check PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
add_test(NAME hub_grammar_diff COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_grammar.py $<TARGET_FILE:grammar_check>)
set_tests_properties(hub_grammar_diff PROPERTIES TIMEOUT 120 LABELS hub)

# Jinja chat templates (serve/jinja*.c): the semantics on small templates, bad input, the bounds (test_jinja);
# and byte-identical renders against Python's jinja2 (as Hugging Face configures it) of llama.cpp's real
# templates over fixed conversations, plus random expressions (test_templates.py through jinja_render).
# The templates come from the peer's llama.cpp bundle (tests/peer/setup_peer.sh); skipped without them.
moex_c_test(test_jinja SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_jinja.c LIBS moex_serve TIMEOUT 60 LABELS hub)
add_executable(jinja_render ${CMAKE_CURRENT_LIST_DIR}/jinja_render.c)
target_link_libraries(jinja_render PRIVATE moex_serve)
set_target_properties(jinja_render PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
add_test(NAME hub_templates COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_templates.py $<TARGET_FILE:jinja_render>
         ${CMAKE_SOURCE_DIR}/.peer/templates/models/templates)
set_tests_properties(hub_templates PROPERTIES TIMEOUT 120 LABELS hub SKIP_RETURN_CODE 77 DEPENDS peer_setup)
