# moex-worker --backend vulkan (issue 5): the Vulkan core against the CPU core
# on the same DISPATCH frames, then a hub with one Vulkan and one CPU worker
# under --verify. Exit code 77 = no Vulkan device: skipped, not failed.
set(moex_worker_vk_dir ${CMAKE_BINARY_DIR}/worker-vk-fixtures)
set(moex_worker_vk_models "")
foreach(wtype q8_0 q4_K_M)
  set(model ${moex_worker_vk_dir}/qwen3moe-${wtype}.gguf)
  list(APPEND moex_worker_vk_models ${model})
  add_test(NAME worker_vk_model_${wtype}
           COMMAND $<TARGET_FILE:moex-gguf> gen --arch qwen3moe --preset test
                   --vocab ${MOEX_FIXTURES}/vocab/ggml-vocab-llama-spm.gguf --type ${wtype} --seed 5 --quiet -o ${model})
  set_tests_properties(worker_vk_model_${wtype} PROPERTIES FIXTURES_SETUP worker_vk_models TIMEOUT 60)
endforeach()
file(MAKE_DIRECTORY ${moex_worker_vk_dir})

moex_c_test(test_worker_vk SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_worker_vk.c LIBS moex_worker
  ARGS ${moex_worker_vk_models} TIMEOUT 120)
set_tests_properties(test_worker_vk PROPERTIES FIXTURES_REQUIRED worker_vk_models SKIP_RETURN_CODE 77
  LABELS "worker;vulkan" ENVIRONMENT "MOEX_VK_CACHE=${CMAKE_BINARY_DIR}/vk-cache")

add_test(NAME dist_worker_vk
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/dist/test_worker_vk.py ${CMAKE_BINARY_DIR}/bin
          ${MOEX_FIXTURES}/vocab ${CMAKE_BINARY_DIR}/dist-vk-work)
set_tests_properties(dist_worker_vk PROPERTIES TIMEOUT 300 LABELS "dist;vulkan" RUN_SERIAL TRUE SKIP_RETURN_CODE 77
  ENVIRONMENT "MOEX_LOG=warn;MOEX_VK_CACHE=${CMAKE_BINARY_DIR}/vk-cache")
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/dist-vk-work)
