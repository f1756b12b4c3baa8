# hub/: real hub and worker processes on loopback. Equality with --local,
# worker deaths, stragglers and hedging, hostile clients, corrupt workers
# caught by --verify (test_dist.py); expert downloads (test_download.py); the
# command line and bad inputs (hub_cli_test.sh); and, in Vulkan builds, a
# Vulkan worker beside a CPU one and the hub on Vulkan (test_*_vk.py).
add_test(NAME dist_end_to_end
  COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_dist.py ${CMAKE_BINARY_DIR}/bin ${moex_vocab}
          ${CMAKE_BINARY_DIR}/dist-work)
set_tests_properties(dist_end_to_end PROPERTIES TIMEOUT 600 LABELS "hub;dist" RUN_SERIAL TRUE
  ENVIRONMENT "MOEX_LOG=warn")
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/dist-work)

# Hostile and broken peers (test_hostile.py): Python peers on real sockets
# beside real workers, one scenario per defect of issue 20 and per resource bound.
add_test(NAME dist_hostile
  COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_hostile.py ${CMAKE_BINARY_DIR}/bin ${moex_vocab}
          ${CMAKE_BINARY_DIR}/hostile-work)
set_tests_properties(dist_hostile PROPERTIES TIMEOUT 600 LABELS "hub;dist" RUN_SERIAL TRUE
  ENVIRONMENT "MOEX_LOG=warn")
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/hostile-work)

add_test(NAME dist_download
  COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_download.py ${CMAKE_BINARY_DIR}/bin ${moex_vocab}
          ${CMAKE_BINARY_DIR}/download-work)
set_tests_properties(dist_download PROPERTIES TIMEOUT 120 LABELS "hub;dist" RUN_SERIAL TRUE)
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/download-work)

add_test(NAME hub_cli COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/hub_cli_test.sh ${CMAKE_BINARY_DIR}/bin ${moex_vocab}
         ${CMAKE_BINARY_DIR}/tests/hub_cli)
set_tests_properties(hub_cli PROPERTIES TIMEOUT 120 LABELS hub)

if(MOEX_VULKAN)
  add_test(NAME dist_worker_vk
    COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_worker_vk.py ${CMAKE_BINARY_DIR}/bin ${moex_vocab}
            ${CMAKE_BINARY_DIR}/dist-vk-work)
  set_tests_properties(dist_worker_vk PROPERTIES TIMEOUT 300 LABELS "hub;dist;vulkan" RUN_SERIAL TRUE
    SKIP_RETURN_CODE 77 ENVIRONMENT "MOEX_LOG=warn;MOEX_VK_CACHE=${MOEX_VK_TEST_CACHE}")
  file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/dist-vk-work)

  add_test(NAME dist_hub_vk
    COMMAND ${MOEX_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_dist_vk.py ${CMAKE_BINARY_DIR}/bin ${moex_vocab}
            ${CMAKE_BINARY_DIR}/distvk-work)
  set_tests_properties(dist_hub_vk PROPERTIES TIMEOUT 400 LABELS "hub;dist;vulkan" RUN_SERIAL TRUE
    SKIP_RETURN_CODE 77 ENVIRONMENT "MOEX_LOG=warn;MOEX_VK_CACHE=${MOEX_VK_TEST_CACHE}")
  file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/distvk-work)
endif()
