# Whole-model checks against the independent NumPy reference (tests/ref).
# Python with numpy: Debian's interpreter (the first python3 on PATH lacks numpy).
set(MOEX_REF_PYTHON /usr/bin/python3 CACHE FILEPATH "python3 with numpy, for the reference tests")

# The reference's own pieces: decoders against hand-made blocks and a scalar
# transcription of ggml's loops; forward-pass identities on tiny models.
add_test(NAME ref_dequant COMMAND ${MOEX_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/ref/test_ref_dequant.py)
add_test(NAME ref_model COMMAND ${MOEX_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/ref/test_ref_model.py)
set_tests_properties(ref_dequant ref_model PROPERTIES TIMEOUT 60 LABELS "ref")

# Engine vs reference: one test per architecture x weight type (generated
# model, 12-token prompt, 12 greedy tokens, all 23 logit rows compared).
foreach(arch qwen3moe qwen3 llama mixtral)
  foreach(wtype f32 mixed q4_K_M)
    add_test(NAME models_${arch}_${wtype}
             COMMAND ${MOEX_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/test_models.py
                     --hub $<TARGET_FILE:moex-hub> --gguf $<TARGET_FILE:moex-gguf>
                     --fixtures ${MOEX_FIXTURES}
                     --workdir ${CMAKE_CURRENT_BINARY_DIR}/models/${arch}_${wtype}
                     --arch ${arch} --type ${wtype})
    set_tests_properties(models_${arch}_${wtype} PROPERTIES TIMEOUT 120 LABELS "models")
  endforeach()
endforeach()

# The prompt in chunks of 5 tokens: the KV cache must carry across passes.
add_test(NAME models_qwen3moe_q4_K_M_batch5
         COMMAND ${MOEX_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/test_models.py
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
           COMMAND ${MOEX_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/test_models.py
                   --peer ${CMAKE_SOURCE_DIR}/.peer/bin/llama_peer --gguf $<TARGET_FILE:moex-gguf>
                   --fixtures ${MOEX_FIXTURES} --workdir ${CMAKE_CURRENT_BINARY_DIR}/models/ref_vs_llamacpp_${arch}
                   --arch ${arch} --type ${wtype} --seed 4)
  set_tests_properties(ref_vs_llamacpp_${arch}_${wtype} PROPERTIES TIMEOUT 120 LABELS "ref;peer"
                       SKIP_RETURN_CODE 77 RESOURCE_LOCK moex_peer DEPENDS peer_setup)
endforeach()
