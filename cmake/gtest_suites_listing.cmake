# Run by convnn_add_gtest_suites (GTestSuites.cmake) after each link of a test binary: writes the
# CTest file that adds one test per GoogleTest suite.
#   cmake -Dexecutable=BIN -Doutput=FILE -Dtimeout=SECONDS -P gtest_suites_listing.cmake
execute_process(COMMAND "${executable}" --gtest_list_tests
                OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE status TIMEOUT 300)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${executable} --gtest_list_tests failed (${status}):\n${listing}\n${errors}")
endif()
# A suite's line is its name and a dot, unindented, perhaps followed by "  # TypeParam = ..."; its
# tests' lines are indented. gtest_main's "Running main() from ..." line has no dot at the end.
string(REPLACE "\n" ";" lines "${listing}")
set(content "")
set(count 0)
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ #]+)\\.( +#.*)?$")
    set(suite "${CMAKE_MATCH_1}")
    string(APPEND content
           "add_test([=[${suite}]=] [=[${executable}]=] [=[--gtest_filter=${suite}.*]=])\n"
           "set_tests_properties([=[${suite}]=] PROPERTIES TIMEOUT ${timeout})\n")
    math(EXPR count "${count} + 1")
  endif()
endforeach()
if(count EQUAL 0)
  message(FATAL_ERROR "${executable} --gtest_list_tests listed no suite:\n${listing}")
endif()
file(WRITE "${output}" "${content}")
