# common/: the GGUF reader and writer (and, in a MOEX_FUZZ tree, a short fuzz
# run), the thread pool, splitmix64, the heap, the sampler, the tokenizer (llama.cpp's vectors) and chat templates.
moex_c_test(test_gguf SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gguf.c LIBS moex_common
  ARGS ${moex_vocab}/ggml-vocab-qwen2.gguf ${moex_vocab}/ggml-vocab-llama-bpe.gguf
       ${moex_vocab}/ggml-vocab-llama-spm.gguf ${CMAKE_CURRENT_BINARY_DIR}
  TIMEOUT 60 LABELS common)
moex_c_test(test_gguf_malformed
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gguf_malformed.c ${CMAKE_SOURCE_DIR}/common/fuzz_gguf.c
  LIBS moex_common ARGS ${CMAKE_CURRENT_BINARY_DIR} TIMEOUT 60 LABELS common)
moex_c_test(test_matmul_pool SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_matmul_pool.c LIBS moex_common TIMEOUT 60
  LABELS common)
moex_c_test(test_rng SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_rng.c LIBS moex_common TIMEOUT 60 LABELS common)
moex_c_test(test_heap SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_heap.c LIBS moex_common TIMEOUT 60 LABELS common)
moex_c_test(test_quantile SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_quantile.c LIBS moex_common TIMEOUT 60 LABELS common)
moex_c_test(test_sampler SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sampler.c LIBS moex_common TIMEOUT 120 LABELS common)
# gpt-oss's vocabulary comes from tests/peer/setup_peer.sh (.peer/vocab: made from npm's o200k ranks, 8 MB, not
# in the repository); its checks are skipped without it unless MOEX_REQUIRE_PEER=1.
moex_c_test(test_tokenizer SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tokenizer.c LIBS moex_common
            ARGS ${moex_vocab} ${CMAKE_SOURCE_DIR}/.peer/vocab TIMEOUT 120 LABELS "common;tokenizer")
set_tests_properties(test_tokenizer PROPERTIES DEPENDS peer_setup)
moex_c_test(test_chat SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_chat.c LIBS moex_common
            ARGS ${moex_vocab}/ggml-vocab-qwen2.gguf ${moex_vocab}/ggml-vocab-llama-spm.gguf TIMEOUT 60 LABELS common)

# Fuzz tree only (CC=clang -DMOEX_FUZZ=ON): seeds from the writer, then a 20 s fuzz run.
if(MOEX_FUZZ)
  add_executable(gguf_fuzz_seeds ${CMAKE_CURRENT_LIST_DIR}/gguf_fuzz_seeds.c)
  target_link_libraries(gguf_fuzz_seeds PRIVATE moex_common)
  set_target_properties(gguf_fuzz_seeds PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  set(moex_gguf_seeds ${CMAKE_BINARY_DIR}/fuzz-seeds/gguf)
  add_test(NAME gguf_fuzz_seeds COMMAND sh -c "mkdir -p '${moex_gguf_seeds}' && exec \"$0\" '${moex_gguf_seeds}' '${moex_vocab}/ggml-vocab-llama-spm.gguf'"
    $<TARGET_FILE:gguf_fuzz_seeds>)
  set_tests_properties(gguf_fuzz_seeds PROPERTIES FIXTURES_SETUP gguf_seeds LABELS fuzz)
  add_test(NAME fuzz_gguf COMMAND sh ${CMAKE_SOURCE_DIR}/tests/fuzz/run_fuzz.sh ${CMAKE_BINARY_DIR} fuzz_gguf 20
    ${moex_gguf_seeds} ${CMAKE_SOURCE_DIR}/tests/fuzz/gguf)
  set_tests_properties(fuzz_gguf PROPERTIES FIXTURES_REQUIRED gguf_seeds TIMEOUT 120 LABELS fuzz)
endif()
