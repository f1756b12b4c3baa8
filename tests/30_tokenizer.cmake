# Tokenizer: llama.cpp's test vectors for three vocabularies, properties, CLI.
moex_c_test(test_tokenizer SOURCES test_tokenizer.c LIBS moex_common
            ARGS ${MOEX_FIXTURES}/vocab TIMEOUT 120 LABELS tokenizer)

add_test(NAME test_tokenizer_cli
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/test_tokenizer_cli.py
                 $<TARGET_FILE:moex-gguf> ${MOEX_FIXTURES}/vocab)
set_tests_properties(test_tokenizer_cli PROPERTIES TIMEOUT 120 LABELS tokenizer)

# Speed benchmark (not a test): bench_tokenizer VOCAB.gguf [MB]
add_executable(bench_tokenizer bench_tokenizer.c)
target_link_libraries(bench_tokenizer PRIVATE moex_common)
set_target_properties(bench_tokenizer PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
