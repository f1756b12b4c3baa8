# engine/: whole models against the independent NumPy reference (tests/ref),
# and (Vulkan builds) the Vulkan engine against the CPU engine.

# Where and why a kernel failed, through the CPU forward pass's errors (a tiny model built in memory).
moex_c_test(test_forward_errors SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_forward_errors.c LIBS moex_engine TIMEOUT 60
  LABELS engine)

# moex_engine_open, the constructor every program uses, on the shipped model (CPU; Vulkan where built).
moex_c_test(test_engine_open SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_engine_open.c LIBS moex_engine
  ARGS ${CMAKE_SOURCE_DIR}/train/model/brown-moe-q8_0.gguf TIMEOUT 120 LABELS engine)
# its Vulkan part as every Vulkan test runs (lavapipe preloaded under the sanitizers: its allocations are known)
set_tests_properties(test_engine_open PROPERTIES ENVIRONMENT "${MOEX_VK_TEST_ENV}")

# The reference's own pieces: decoders against hand-made blocks and a scalar
# transcription of ggml's loops; forward-pass identities on tiny models.
add_test(NAME ref_dequant COMMAND ${MOEX_PYTHON} ${CMAKE_SOURCE_DIR}/tests/ref/test_ref_dequant.py)
add_test(NAME ref_model COMMAND ${MOEX_PYTHON} ${CMAKE_SOURCE_DIR}/tests/ref/test_ref_model.py)
set_tests_properties(ref_dequant ref_model PROPERTIES TIMEOUT 60 LABELS "ref")

# The MoE plan (group by expert, combine in slot order) both executors share.
moex_c_test(test_moe_plan SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_moe_plan.c LIBS moex_engine TIMEOUT 60 LABELS engine)

# Engine vs reference: one test per architecture x weight type (generated
# model, 12-token prompt, 12 greedy tokens, all 23 logit rows compared).
foreach(arch qwen3moe qwen3 llama mixtral)
  foreach(wtype f32 mixed q4_K_M)
    add_test(NAME models_${arch}_${wtype}
             COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_models.py
                     --hub $<TARGET_FILE:moex-hub> --gguf $<TARGET_FILE:moex-gguf>
                     --fixtures ${MOEX_FIXTURES}
                     --workdir ${CMAKE_CURRENT_BINARY_DIR}/models/${arch}_${wtype}
                     --arch ${arch} --type ${wtype})
    set_tests_properties(models_${arch}_${wtype} PROPERTIES TIMEOUT 120 LABELS "models")
  endforeach()
endforeach()
# MXFP4 (gpt-oss's expert type, CPU only so far): every weight in it, MoE and dense.
foreach(arch qwen3moe qwen3)
  add_test(NAME models_${arch}_mxfp4
           COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_models.py
                   --hub $<TARGET_FILE:moex-hub> --gguf $<TARGET_FILE:moex-gguf>
                   --fixtures ${MOEX_FIXTURES}
                   --workdir ${CMAKE_CURRENT_BINARY_DIR}/models/${arch}_mxfp4
                   --arch ${arch} --type mxfp4)
  set_tests_properties(models_${arch}_mxfp4 PROPERTIES TIMEOUT 120 LABELS "models")
endforeach()

# The prompt in chunks of 5 tokens: the KV cache must carry across passes.
add_test(NAME models_qwen3moe_q4_K_M_batch5
         COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_models.py
                 --hub $<TARGET_FILE:moex-hub> --gguf $<TARGET_FILE:moex-gguf>
                 --fixtures ${MOEX_FIXTURES}
                 --workdir ${CMAKE_CURRENT_BINARY_DIR}/models/qwen3moe_q4_K_M_batch5
                 --arch qwen3moe --type q4_K_M --batch 5 --seed 2)
set_tests_properties(models_qwen3moe_q4_K_M_batch5 PROPERTIES TIMEOUT 120 LABELS "models")

# The reference itself against llama.cpp (the peer in <repo>/.peer, set up by
# tests/peer/setup_peer.sh; skipped when absent): qwen3moe f32 to float32
# rounding, mixtral q4_K_M through the reference's emulation of 8-bit activations.
foreach(case qwen3moe:f32 mixtral:q4_K_M)
  string(REPLACE ":" ";" parts ${case})
  list(GET parts 0 arch)
  list(GET parts 1 wtype)
  add_test(NAME ref_vs_llamacpp_${arch}_${wtype}
           COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_models.py
                   --peer ${CMAKE_SOURCE_DIR}/.peer/bin/llama_peer --gguf $<TARGET_FILE:moex-gguf>
                   --fixtures ${MOEX_FIXTURES} --workdir ${CMAKE_CURRENT_BINARY_DIR}/models/ref_vs_llamacpp_${arch}
                   --arch ${arch} --type ${wtype} --seed 4)
  set_tests_properties(ref_vs_llamacpp_${arch}_${wtype} PROPERTIES TIMEOUT 120 LABELS "ref;peer"
                       SKIP_RETURN_CODE 77 RESOURCE_LOCK moex_peer DEPENDS peer_setup)
endforeach()

if(MOEX_VULKAN)
  # Whole models, generated once per build tree, then vulkan vs cpu.
  add_executable(test_vk_forward ${CMAKE_CURRENT_LIST_DIR}/test_vk_forward.c)
  target_link_libraries(test_vk_forward PRIVATE moex_engine Threads::Threads ${MATH_LIB})
  set_target_properties(test_vk_forward PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  set(moex_vk_model_dir ${CMAKE_BINARY_DIR}/vk-models)
  file(MAKE_DIRECTORY ${moex_vk_model_dir})
  set(moex_vk_models "qwen3moe:q4_K_M:ggml-vocab-llama-spm:" "llama:mixed:ggml-vocab-llama-spm:--loose")
  foreach(spec ${moex_vk_models})
    string(REPLACE ":" ";" parts ${spec})
    list(GET parts 0 arch)
    list(GET parts 1 wtype)
    list(GET parts 2 vocab)
    list(LENGTH parts np)
    set(extra "")
    if(np GREATER 3)
      list(GET parts 3 extra)
    endif()
    set(model ${moex_vk_model_dir}/${arch}_${wtype}.gguf)
    add_test(NAME vk_gen_${arch}_${wtype}
             COMMAND $<TARGET_FILE:moex-gguf> gen --arch ${arch} --preset test
                     --vocab ${moex_vocab}/${vocab}.gguf --type ${wtype} --seed 1 --quiet -o ${model})
    set_tests_properties(vk_gen_${arch}_${wtype} PROPERTIES FIXTURES_SETUP vk_models LABELS vulkan TIMEOUT 120)
    add_test(NAME test_vk_forward_${arch}_${wtype} COMMAND test_vk_forward ${model} ${extra})
    set_tests_properties(test_vk_forward_${arch}_${wtype} PROPERTIES FIXTURES_REQUIRED vk_models SKIP_RETURN_CODE 77
                         LABELS "engine;vulkan" TIMEOUT 180 ENVIRONMENT "${MOEX_VK_TEST_ENV}")
  endforeach()

  # The CLI on Vulkan: a greedy decode reads no logits back (the GPU's argmax).
  add_test(NAME vk_cli_readback COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/vk_cli_readback.sh $<TARGET_FILE:moex-hub>
           ${moex_vk_model_dir}/qwen3moe_q4_K_M.gguf ${MOEX_PYTHON})
  set_tests_properties(vk_cli_readback PROPERTIES FIXTURES_REQUIRED vk_models SKIP_RETURN_CODE 77 LABELS "engine;vulkan"
                       TIMEOUT 120 ENVIRONMENT "${MOEX_VK_TEST_ENV}")

  # GPU timestamps per op (--vk-tune profile=1): same model test, tables checked.
  add_test(NAME test_vk_profile COMMAND ${MOEX_PYTHON} ${CMAKE_SOURCE_DIR}/tests/vk/check_vkprof.py
           $<TARGET_FILE:test_vk_forward> ${moex_vk_model_dir}/qwen3moe_q4_K_M.gguf)
  set_tests_properties(test_vk_profile PROPERTIES FIXTURES_REQUIRED vk_models SKIP_RETURN_CODE 77 LABELS vulkan
                       TIMEOUT 180 ENVIRONMENT "${MOEX_VK_TEST_ENV}")

  # The whole model: prompt batch on the coop kernels vs the f32 tiles. Cold, a
  # CPU driver compiles the emulated variants in ~20 s (~140 s under ASan, whose
  # allocator slows the driver's compiler); the caches make later runs quick.
  moex_c_test(test_vk_coop_forward SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_vk_coop_forward.c LIBS moex_engine
    ARGS ${moex_vk_model_dir}/qwen3moe_q4_K_M.gguf)
  set_tests_properties(test_vk_coop_forward PROPERTIES FIXTURES_REQUIRED vk_models SKIP_RETURN_CODE 77
                       LABELS "engine;vulkan" TIMEOUT 400 ENVIRONMENT "${MOEX_VK_TEST_ENV}")

  # Several sequences in one forward (moex_vk_forward_batch): each sequence's
  # tokens and logits alone and batched with 1, 2, 3 and 8 others, bit for bit.
  moex_c_test(test_vk_batch SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_vk_batch.c LIBS moex_engine
    ARGS ${moex_vk_model_dir}/qwen3moe_q4_K_M.gguf)
  # ~85 s on 2 idle cores with lavapipe, ~105 s under ASan, 223-277 s under ASan with one core kept busy by
  # another process: a timeout with twice that room
  set_tests_properties(test_vk_batch PROPERTIES FIXTURES_REQUIRED vk_models SKIP_RETURN_CODE 77
                       LABELS "engine;vulkan" TIMEOUT 900 ENVIRONMENT "${MOEX_VK_TEST_ENV}")
  # the same code on a dense model with mixed types: the release pass only (slow), the sanitizers run the first
  add_test(NAME test_vk_batch_llama_mixed COMMAND test_vk_batch ${moex_vk_model_dir}/llama_mixed.gguf)
  set_tests_properties(test_vk_batch_llama_mixed PROPERTIES FIXTURES_REQUIRED vk_models SKIP_RETURN_CODE 77
                       LABELS "engine;vulkan;slow" TIMEOUT 600 ENVIRONMENT "${MOEX_VK_TEST_ENV}")

  # The distributed hub's GPU half (engine/vk/forward_vk_dist.c), in process:
  # against moex_vk_forward and the CPU engine, failing executors, the error path.
  set(moex_distvk_dir ${CMAKE_BINARY_DIR}/distvk-models)
  set(moex_distvk_model ${moex_distvk_dir}/qwen3moe_q4_K_M.gguf)
  file(MAKE_DIRECTORY ${moex_distvk_dir})
  add_test(NAME distvk_gen_model
           COMMAND $<TARGET_FILE:moex-gguf> gen --arch qwen3moe --preset test
                   --vocab ${moex_vocab}/ggml-vocab-llama-spm.gguf --type q4_K_M --seed 1 --quiet
                   -o ${moex_distvk_model})
  set_tests_properties(distvk_gen_model PROPERTIES FIXTURES_SETUP distvk_models LABELS vulkan TIMEOUT 120)
  moex_c_test(test_vk_dist SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_vk_dist.c LIBS moex_engine
    ARGS ${moex_distvk_model})
  set_tests_properties(test_vk_dist PROPERTIES FIXTURES_REQUIRED distvk_models SKIP_RETURN_CODE 77
                       LABELS "engine;vulkan" TIMEOUT 180 ENVIRONMENT "${MOEX_VK_TEST_ENV}")
endif()

# The default model (train/model/brown-moe-q8_0.gguf, trained on the Brown
# Corpus by train/) on held-out text (train/brown-heldout.txt): perplexity of
# moex --local against llama.cpp's perplexity on the same GGUF, Q8_0 as shipped
# and Q4_K_M quantized from it (within 1 %, top-1 ids >= 98 %); Vulkan and hub
# + 2 workers against --local (within 1 %). Windows of 128 tokens, 12 of them.
set(moex_default_model ${CMAKE_SOURCE_DIR}/train/model/brown-moe-q8_0.gguf)
set(moex_heldout ${CMAKE_SOURCE_DIR}/train/brown-heldout.txt)
foreach(case peer:q8_0 peer:q4_K_M vulkan:q8_0 dist:q8_0)
  string(REPLACE ":" ";" parts ${case})
  list(GET parts 0 mode)
  list(GET parts 1 wtype)
  if(mode STREQUAL "vulkan" AND NOT MOEX_VULKAN)
    continue()
  endif()
  add_test(NAME ppl_${mode}_${wtype}
           COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_perplexity.py --bin ${CMAKE_BINARY_DIR}/bin
                   --model ${moex_default_model} --text ${moex_heldout} --mode ${mode} --type ${wtype}
                   --peer ${CMAKE_SOURCE_DIR}/.peer/bin/llama_peer
                   --workdir ${CMAKE_CURRENT_BINARY_DIR}/ppl/${mode}_${wtype})
  set_tests_properties(ppl_${mode}_${wtype} PROPERTIES TIMEOUT 300 LABELS "ppl" SKIP_RETURN_CODE 77)
  if(mode STREQUAL "dist")   # a hub and workers on loopback ports (tests/hub/tests.cmake's lock)
    set_tests_properties(ppl_${mode}_${wtype} PROPERTIES RESOURCE_LOCK moex_ports)
  endif()
  if(mode STREQUAL "peer")
    set_tests_properties(ppl_${mode}_${wtype} PROPERTIES LABELS "ppl;peer" RESOURCE_LOCK moex_peer DEPENDS peer_setup)
  elseif(mode STREQUAL "vulkan")
    set_tests_properties(ppl_${mode}_${wtype} PROPERTIES LABELS "ppl;vulkan" ENVIRONMENT "${MOEX_VK_TEST_ENV}")
  endif()
endforeach()

# Speculative decoding: the acceptance rule (chi-square against the exact law, a wrong rule caught) and prompt
# lookup; then the CLI: greedy tokens with --lookup / --draft-model equal the plain run's (CPU, and Vulkan).
moex_c_test(test_speculate SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_speculate.c LIBS moex_engine TIMEOUT 60 LABELS engine)
set(moex_spec_vk "")
if(MOEX_VULKAN)
  set(moex_spec_vk "--vulkan")
endif()
add_test(NAME speculative_cli COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_speculative.py ${CMAKE_BINARY_DIR}/bin
         ${moex_vocab} ${CMAKE_CURRENT_BINARY_DIR}/speculative ${moex_default_model} ${moex_spec_vk})
set_tests_properties(speculative_cli PROPERTIES TIMEOUT 300 LABELS "engine;vulkan" ENVIRONMENT "${MOEX_VK_TEST_ENV}")
