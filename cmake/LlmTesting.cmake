# llm_add_test(NAME name SOURCES ... [LIBS ...] [LABEL unit|integration|gpu|...] [PREFIX p])
# One GoogleTest binary whose cases are registered with ctest under the given label. PREFIX goes
# before each case's ctest name: the same sources built twice (tests/gpu on a device and under
# the CUDA emulation) must not register the same names, or their labels merge.
enable_testing()
include(GoogleTest)

# The Python of `make pyenv` (tools/python/requirements.txt): tests that drive the system with
# Python clients (openai, prometheus_client) run it, and skip saying so when it is missing.
set(LLM_TEST_PYTHON "${CMAKE_BINARY_DIR}/pyenv/bin/python3" CACHE FILEPATH
    "Python with the packages of tools/python/requirements.txt")

function(llm_add_test)
  cmake_parse_arguments(T "" "NAME;LABEL;PREFIX" "SOURCES;LIBS" ${ARGN})
  if(NOT T_LABEL)
    set(T_LABEL unit)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gmock GTest::gtest_main)
  # Committed test data (models, tokenizers, fixtures) is read from the source tree.
  target_compile_definitions(${T_NAME} PRIVATE
                             LLM_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data"
                             LLM_TEST_PYTHON="${LLM_TEST_PYTHON}")
  # Tests poison every KV cache they make, their workers' too (CacheEngine::PoisonByDefault),
  # so that a kernel reading a slot nobody wrote shows; a test of resident memory turns it off.
  gtest_discover_tests(${T_NAME} TEST_PREFIX "${T_PREFIX}"
                       PROPERTIES LABELS ${T_LABEL} ENVIRONMENT "LLM_POISON_KV_CACHE=1"
                       DISCOVERY_TIMEOUT 60)
  # The device kit packs the `gpu` tests (gpu_kit_binaries, tools/gpu/pack_kit.sh).
  if(T_LABEL STREQUAL "gpu")
    set_property(GLOBAL APPEND PROPERTY LLM_GPU_TEST_TARGETS ${T_NAME})
  endif()
endfunction()
