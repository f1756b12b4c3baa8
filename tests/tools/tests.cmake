# moex-gguf: `info`, `tokenize`/`detokenize` (llama.cpp's vectors through the
# CLI), and `gen` (random-weight test models): a checker that opens generated
# models with our reader and compares tensors, shapes, types, hyperparameters
# and weight statistics with expectations of its own, and the weights re-derived
# bit for bit by an independent NumPy implementation of the PRNG.
add_test(NAME gguf_info COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/gguf_info_test.sh $<TARGET_FILE:moex-gguf>
  ${moex_vocab}/ggml-vocab-qwen2.gguf 151936 ${CMAKE_BINARY_DIR}/tests)
set_tests_properties(gguf_info PROPERTIES TIMEOUT 60 LABELS tools)
add_test(NAME test_tokenizer_cli
         COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_tokenizer_cli.py $<TARGET_FILE:moex-gguf> ${moex_vocab})
set_tests_properties(test_tokenizer_cli PROPERTIES TIMEOUT 120 LABELS "tools;tokenizer")

add_executable(test_gen_check ${CMAKE_CURRENT_LIST_DIR}/test_gen_check.c)
target_link_libraries(test_gen_check PRIVATE moex_kernels Threads::Threads ${MATH_LIB})
set_target_properties(test_gen_check PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
foreach(group models determinism usage)
  add_test(NAME gen_${group}
           COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/test_gen.sh ${group} $<TARGET_FILE:moex-gguf>
                   $<TARGET_FILE:test_gen_check> ${MOEX_FIXTURES} ${CMAKE_BINARY_DIR}/tests/gen_${group})
  set_tests_properties(gen_${group} PROPERTIES TIMEOUT 180 LABELS "tools;gen")
endforeach()
add_test(NAME gen_prng
         COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_gen_prng.py $<TARGET_FILE:moex-gguf>
                 ${moex_vocab}/ggml-vocab-llama-spm.gguf ${CMAKE_BINARY_DIR}/tests/gen_prng)
set_tests_properties(gen_prng PROPERTIES TIMEOUT 60 LABELS "tools;gen")
# `quantize`: types per llama.cpp's rule, values within each type's error
# (read back by tests/ref's NumPy decoders), metadata copied, bad usage.
add_test(NAME gguf_quantize
         COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_quantize.py $<TARGET_FILE:moex-gguf>
                 ${moex_vocab}/ggml-vocab-llama-spm.gguf ${CMAKE_BINARY_DIR}/tests/gguf_quantize)
set_tests_properties(gguf_quantize PROPERTIES TIMEOUT 300 LABELS "tools;quantize")
# train/: two training steps, the GGUF export checked against PyTorch's logits,
# quantized and run (skipped without PyTorch).
add_test(NAME train_export COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/test_train_export.sh ${CMAKE_SOURCE_DIR}
         ${CMAKE_BINARY_DIR}/bin ${CMAKE_BINARY_DIR}/tests/train_export)
set_tests_properties(train_export PROPERTIES TIMEOUT 300 LABELS "tools;train" SKIP_RETURN_CODE 77)

# The source tree's own rules (docs/ARCHITECTURE.md): one engine constructor.
add_test(NAME source_rules COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/check_source_rules.py
         ${CMAKE_SOURCE_DIR})
set_tests_properties(source_rules PROPERTIES TIMEOUT 60 LABELS tools)
