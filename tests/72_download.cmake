# Expert download (issue 4): workers without --model fetch their experts from
# the hub over HTTP (tests/dist/test_download.py): equality with --local,
# cache contents, resume with Range, repair of corrupt files, bad tokens and
# paths. Real hub and worker processes on loopback.
add_test(NAME dist_download
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/dist/test_download.py ${CMAKE_BINARY_DIR}/bin
          ${MOEX_FIXTURES}/vocab ${CMAKE_BINARY_DIR}/download-work)
set_tests_properties(dist_download PROPERTIES TIMEOUT 120 LABELS dist RUN_SERIAL TRUE)
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/download-work)
