# llama.cpp peer (prebuilt, from the npm registry, into <repo>/.peer): our
# logits against llama.cpp's on every architecture. Skipped (exit 77) where
# the peer cannot be set up. The tests share .peer, so they run one at a time.
# Tolerances (tests/peer/peer_compare.py), relative L2 per logit row: f32 1e-3
# (measured 4e-7 dense, 2.9e-4 MoE), f16 5e-3, bf16 2e-2, quantized 5e-2
# (measured <= 1.8e-2), plus on MoE up to 2 rows below 0.5 where a near-tied
# router choice flipped (measured up to 0.32).
# Installs the peer first (npm; skipped where npm cannot reach its registry), so
# every test that uses it finds it built, whatever order ctest picks.
add_test(NAME peer_setup COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/setup_peer.sh)
set_tests_properties(peer_setup PROPERTIES TIMEOUT 600 LABELS "peer" SKIP_RETURN_CODE 77 RESOURCE_LOCK moex_peer)
foreach(arch qwen3moe qwen3 llama mixtral)
  add_test(NAME peer_logits_${arch}
           COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/peer_compare.py
                   --hub $<TARGET_FILE:moex-hub> --gguf $<TARGET_FILE:moex-gguf> --fixtures ${MOEX_FIXTURES}
                   --workdir ${CMAKE_BINARY_DIR}/tests/peer_${arch} --arch ${arch} --type f32,q4_K,mixed)
  set_tests_properties(peer_logits_${arch} PROPERTIES TIMEOUT 300 LABELS "peer" SKIP_RETURN_CODE 77
                       RESOURCE_LOCK moex_peer DEPENDS peer_setup)
endforeach()
# MXFP4 rows against llama.cpp's libggml (llama_peer dequant / quantize): MoEx's
# dequantization of every exponent and code, and its quantizer, bit for bit.
moex_c_test(test_peer_mxfp4 SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_peer_mxfp4.c LIBS moex_kernels
  ARGS ${CMAKE_CURRENT_LIST_DIR}/setup_peer.sh ${CMAKE_SOURCE_DIR}/.peer ${CMAKE_BINARY_DIR}/tests/peer_mxfp4
  TIMEOUT 120 LABELS peer)
set_tests_properties(test_peer_mxfp4 PROPERTIES SKIP_RETURN_CODE 77 RESOURCE_LOCK moex_peer DEPENDS peer_setup)
# The benchmark script end to end on a tiny model (the real run: bench/bench_local.sh BUILD_DIR).
add_test(NAME peer_bench_smoke
         COMMAND sh ${CMAKE_SOURCE_DIR}/bench/bench_local.sh ${CMAKE_BINARY_DIR} --smoke)
set_tests_properties(peer_bench_smoke PROPERTIES TIMEOUT 300 LABELS "peer" SKIP_RETURN_CODE 77
                     RESOURCE_LOCK moex_peer DEPENDS peer_setup)
# The tokenizer: moex-gguf tokenize --batch against llama.cpp (llama_peer tokenize), id for
# id, on the vocab fixtures, gpt-oss's o200k first: the fixtures' texts and 10,000 random
# strings, special-token parsing off and on (about 25 s, most of it llama.cpp's std::regex).
add_test(NAME peer_tokenize
         COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/peer_tokenize.py --gguf $<TARGET_FILE:moex-gguf>
                 --vocab-dir ${moex_vocab})
# "slow": the sanitizer pass leaves it out (llama.cpp's side is most of its time; test_tokenizer runs our side there)
set_tests_properties(peer_tokenize PROPERTIES TIMEOUT 300 LABELS "peer;tokenizer;slow" SKIP_RETURN_CODE 77
                     RESOURCE_LOCK moex_peer DEPENDS peer_setup)
