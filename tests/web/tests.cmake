# web/: the browser worker in headless Chromium (WebGPU on SwiftShader). Each
# test exits 77 (skipped) when emcc's output or chromium is missing, unless
# MOEX_REQUIRE_WEB=1 is set (then it fails). web/setup_web.sh installs both.
set(moex_web_dir ${CMAKE_BINARY_DIR}/web)
add_test(NAME web_kernels COMMAND ${MOEX_PYTHON} ${CMAKE_SOURCE_DIR}/tests/web/test_kernels.py ${moex_web_dir})
set_tests_properties(web_kernels PROPERTIES TIMEOUT 900 LABELS "web;slow" SKIP_RETURN_CODE 77)  # WGSL and WASM: nothing for ASan to see
add_test(NAME web_end_to_end
  COMMAND ${MOEX_PYTHON} ${CMAKE_SOURCE_DIR}/tests/web/test_e2e.py ${CMAKE_BINARY_DIR}/bin ${MOEX_FIXTURES}/vocab
          ${CMAKE_BINARY_DIR}/web-work ${moex_web_dir})
set_tests_properties(web_end_to_end PROPERTIES TIMEOUT 900 LABELS "web;dist" RESOURCE_LOCK moex_ports SKIP_RETURN_CODE 77
  ENVIRONMENT "MOEX_LOG=warn")

# The native figure docs/BROWSER.md compares the browser's with (not a test).
add_executable(bench_web_native_ffn ${CMAKE_SOURCE_DIR}/tests/web/bench_native_ffn.c)
target_link_libraries(bench_web_native_ffn PRIVATE moex_kernels)
add_test(NAME web_session
  COMMAND ${MOEX_PYTHON} ${CMAKE_SOURCE_DIR}/tests/web/test_session.py ${CMAKE_BINARY_DIR}/bin ${MOEX_FIXTURES}/vocab
          ${CMAKE_BINARY_DIR}/web-work ${moex_web_dir})
set_tests_properties(web_session PROPERTIES TIMEOUT 300 LABELS "web;slow" RESOURCE_LOCK moex_ports SKIP_RETURN_CODE 77
  ENVIRONMENT "MOEX_LOG=warn")

# The WASM module's C entry points compiled natively: runs everywhere (no emcc
# needed), under the sanitizers in sanitizer builds.
moex_c_test(test_wasm_api SOURCES ${CMAKE_SOURCE_DIR}/tests/web/test_wasm_api.c ${CMAKE_SOURCE_DIR}/web/wasm/moex_wasm.c
  LIBS moex_worker moex_proto moex_kernels TIMEOUT 60 LABELS "web;worker")
