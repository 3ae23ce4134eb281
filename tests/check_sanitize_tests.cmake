# Run by the sanitize_tests target once its executables are built: every test labelled
# `sanitize` must have its executable, or the sanitizer trees (which build only that target)
# would report it "Not Run" at best. Fails the build naming each test whose executable is missing.
execute_process(COMMAND ${CTEST_COMMAND} --test-dir ${BUILD_DIR} -L sanitize --show-only=json-v1
  OUTPUT_VARIABLE listing RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "ctest --show-only failed (${result})")
endif()
string(JSON test_count LENGTH "${listing}" tests)
if(test_count EQUAL 0)
  message(FATAL_ERROR "no test is labelled sanitize in ${BUILD_DIR}")
endif()
math(EXPR last "${test_count} - 1")
set(missing "")
foreach(index RANGE ${last})
  string(JSON name GET "${listing}" tests ${index} name)
  # ctest leaves "command" out of the listing when it cannot find the test's executable.
  string(JSON executable ERROR_VARIABLE no_command GET "${listing}" tests ${index} command 0)
  if(no_command OR NOT EXISTS "${executable}")
    list(APPEND missing ${name})
  endif()
endforeach()
if(missing)
  list(JOIN missing ", " missing)
  message(FATAL_ERROR "tests labelled sanitize without an executable: ${missing}. Add their "
                      "targets to sanitize_test_executables in tests/CMakeLists.txt.")
endif()
message(STATUS "${test_count} tests labelled sanitize, each with its executable")
