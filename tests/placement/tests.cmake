# placement/: the consistent-hash ring.
moex_c_test(test_placement SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_placement.c LIBS moex_placement TIMEOUT 60
  LABELS placement)
