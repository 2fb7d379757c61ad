# GoogleTest built from source for LLM_KERNELS_ONLY builds (GPU machines without the -dev
# packages). Debian's googletest package puts the sources in /usr/src/googletest.
if(NOT EXISTS "${LLM_GTEST_SOURCE_DIR}/CMakeLists.txt")
  message(FATAL_ERROR "LLM_KERNELS_ONLY needs GoogleTest sources: pass "
                      "-DLLM_GTEST_SOURCE_DIR=<path to googletest> (now ${LLM_GTEST_SOURCE_DIR})")
endif()
set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
add_subdirectory("${LLM_GTEST_SOURCE_DIR}" "${CMAKE_BINARY_DIR}/_googletest" EXCLUDE_FROM_ALL)
# GoogleTest 1.11+ defines the GTest:: aliases itself; older releases do not.
foreach(lib gtest gtest_main gmock)
  if(NOT TARGET GTest::${lib})
    add_library(GTest::${lib} ALIAS ${lib})
  endif()
endforeach()
