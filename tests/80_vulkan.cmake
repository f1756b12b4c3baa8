# Vulkan backend on whatever device is there (lavapipe in CI): every kernel
# against the CPU backend / float64, then whole models against --backend cpu.
# Exit code 77 = no Vulkan device: skipped, not failed.
set(MOEX_VK_TEST_CACHE ${CMAKE_BINARY_DIR}/vk-cache)
function(moex_vk_test name)
  moex_c_test(${name} ${ARGN})
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 LABELS vulkan
                       ENVIRONMENT "MOEX_VK_CACHE=${MOEX_VK_TEST_CACHE}")
endfunction()

moex_vk_test(test_vk_layout SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_vk_layout.c LIBS moex_kernels TIMEOUT 120)
moex_vk_test(test_vk_matmul SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_vk_matmul.c LIBS moex_kernels TIMEOUT 120)
add_test(NAME test_vk_matmul_shared COMMAND test_vk_matmul --no-subgroup)
set_tests_properties(test_vk_matmul_shared PROPERTIES SKIP_RETURN_CODE 77 LABELS vulkan TIMEOUT 120
                     ENVIRONMENT "MOEX_VK_CACHE=${MOEX_VK_TEST_CACHE}")
add_executable(test_vk_ops ${CMAKE_CURRENT_LIST_DIR}/test_vk_ops.c)
target_link_libraries(test_vk_ops PRIVATE moex_kernels Threads::Threads ${MATH_LIB})
set_target_properties(test_vk_ops PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
foreach(sub norm rope attention router experts fused)
  add_test(NAME test_vk_${sub} COMMAND test_vk_ops ${sub})
  set_tests_properties(test_vk_${sub} PROPERTIES SKIP_RETURN_CODE 77 LABELS vulkan TIMEOUT 120
                       ENVIRONMENT "MOEX_VK_CACHE=${MOEX_VK_TEST_CACHE}")
endforeach()

# Whole models: generated once per build tree, then vulkan vs cpu.
add_executable(test_vk_forward ${CMAKE_CURRENT_LIST_DIR}/test_vk_forward.c)
target_link_libraries(test_vk_forward PRIVATE moex_hub Threads::Threads ${MATH_LIB})
set_target_properties(test_vk_forward PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
set(moex_vk_model_dir ${CMAKE_BINARY_DIR}/vk-models)
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
                   --vocab ${MOEX_FIXTURES}/vocab/${vocab}.gguf --type ${wtype} --seed 1 --quiet -o ${model})
  set_tests_properties(vk_gen_${arch}_${wtype} PROPERTIES FIXTURES_SETUP vk_models LABELS vulkan TIMEOUT 120)
  add_test(NAME test_vk_forward_${arch}_${wtype} COMMAND test_vk_forward ${model} ${extra})
  set_tests_properties(test_vk_forward_${arch}_${wtype} PROPERTIES FIXTURES_REQUIRED vk_models SKIP_RETURN_CODE 77
                       LABELS vulkan TIMEOUT 180 ENVIRONMENT "MOEX_VK_CACHE=${MOEX_VK_TEST_CACHE}")
endforeach()
file(MAKE_DIRECTORY ${moex_vk_model_dir})

# Speed (not a test): tests/vk/bench_h200.sh runs it on a GPU machine.
add_executable(bench_vk ${CMAKE_CURRENT_LIST_DIR}/bench_vk.c)
target_link_libraries(bench_vk PRIVATE moex_hub Threads::Threads ${MATH_LIB})

# GPU timestamps per op (MOEX_VK_PROFILE=1): same model test, tables checked.
add_test(NAME test_vk_profile COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/vk/check_vkprof.py
         $<TARGET_FILE:test_vk_forward> ${moex_vk_model_dir}/qwen3moe_q4_K_M.gguf)
set_tests_properties(test_vk_profile PROPERTIES FIXTURES_REQUIRED vk_models SKIP_RETURN_CODE 77 LABELS vulkan
                     TIMEOUT 180 ENVIRONMENT "MOEX_VK_CACHE=${MOEX_VK_TEST_CACHE}")
