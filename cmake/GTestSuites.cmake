# convnn_add_gtest_suites(<target> [TIMEOUT <seconds>]): one CTest test per GoogleTest suite of
# <target>, named after the suite and running it with --gtest_filter=<suite>.*, listed from the
# binary after each link as gtest_discover_tests does.
#
# Why not gtest_discover_tests: it makes one CTest test, so one process, per test, and each process
# spends about a second loading LibTorch before its test starts: with ~1,000 tests that was most of
# ctest's time and most of the baseline-ISA and device-generic passes' (issue 44). A suite per
# process keeps the failing test's name in the output (GoogleTest prints it) and leaves enough
# tests (~120) to spread over the cores.
set(CONVNN_GTEST_SUITES_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/gtest_suites_listing.cmake")

function(convnn_add_gtest_suites target)
  cmake_parse_arguments(arg "" "TIMEOUT" "" ${ARGN})
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 1200)
  endif()
  set(listing_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake")
  set(include_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites_include.cmake")
  add_custom_command(
    TARGET ${target} POST_BUILD
    COMMAND "${CMAKE_COMMAND}" "-Dexecutable=$<TARGET_FILE:${target}>" "-Doutput=${listing_file}"
            "-Dtimeout=${arg_TIMEOUT}" -P "${CONVNN_GTEST_SUITES_SCRIPT}"
    BYPRODUCTS "${listing_file}"
    COMMENT "Listing the GoogleTest suites of ${target} for CTest"
    VERBATIM)
  # Before the first build there is no listing: CTest then reports one failing test that says so.
  file(WRITE "${include_file}"
       "if(EXISTS [=[${listing_file}]=])\n"
       "  include([=[${listing_file}]=])\n"
       "else()\n"
       "  add_test([=[${target}_NOT_BUILT]=] [=[${target}_NOT_BUILT]=])\n"
       "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include_file}")
endfunction()
