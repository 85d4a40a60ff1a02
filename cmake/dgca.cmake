# Helpers shared by every folder's CMakeLists.txt.
#
# dgca_glob_sources(VAR DIR): the .cc files of DIR (not recursive) that are
# not tests (*_test.cc) and not program entry points (main.cc). New files are
# picked up at build time (CONFIGURE_DEPENDS), so adding a file needs no edit.
function(dgca_glob_sources var dir)
  file(GLOB srcs CONFIGURE_DEPENDS ${dir}/*.cc)
  list(FILTER srcs EXCLUDE REGEX ".*_test\\.cc$")
  list(FILTER srcs EXCLUDE REGEX ".*/main\\.cc$")
  set(${var} ${srcs} PARENT_SCOPE)
endfunction()

# dgca_add_test(NAME SRC [TIMEOUT T] LIBS...): one GoogleTest executable
# NAME from SRC, registered with ctest. Tests run from the repository root
# and find ../shared/data through DGCA_SHARED_DATA; TIMEOUT defaults to
# 600 s.
function(dgca_add_test name src)
  if(NOT DGCA_BUILD_TESTS OR NOT GTest_FOUND)
    return()
  endif()
  cmake_parse_arguments(ARG "" "TIMEOUT" "" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  add_executable(${name} ${src})
  target_link_libraries(${name} PRIVATE ${ARG_UNPARSED_ARGUMENTS} GTest::gtest GTest::gtest_main)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
    ENVIRONMENT "DGCA_SHARED_DATA=${DGCA_SHARED_DATA};DGCA_BUILD_DIR=${CMAKE_BINARY_DIR};DGCA_SOURCE_DIR=${CMAKE_SOURCE_DIR}"
    TIMEOUT ${ARG_TIMEOUT})
endfunction()

# dgca_add_tests(DIR [SUFFIX S] LIBS...): dgca_add_test for every
# DIR/*_test.cc, named after the file (plus S: the CUDA emulator builds
# model/cuda's tests again as foo_test_emu).
function(dgca_add_tests dir)
  cmake_parse_arguments(ARG "" "SUFFIX" "" ${ARGN})
  file(GLOB tests CONFIGURE_DEPENDS ${dir}/*_test.cc)
  foreach(t ${tests})
    get_filename_component(name ${t} NAME_WE)
    dgca_add_test(${name}${ARG_SUFFIX} ${t} ${ARG_UNPARSED_ARGUMENTS})
  endforeach()
endfunction()
