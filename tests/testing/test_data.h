// Where a test finds the committed test data (models, tokenizers, fixtures).
#ifndef LLM_TESTS_TESTING_TEST_DATA_H_
#define LLM_TESTS_TESTING_TEST_DATA_H_

#include <cstdlib>
#include <string>

namespace llm::testing {

// $LLM_TEST_DATA_DIR when it is set and not empty (the device kit runs test binaries built here
// on a GPU machine, whose checkout is elsewhere: tools/gpu/run_kit.sh sets it), else the
// tests/data of the source tree the binary was built from (the LLM_TEST_DATA_DIR definition
// llm_add_test gives every test).
inline std::string TestDataDir() {
  const char* dir = std::getenv("LLM_TEST_DATA_DIR");
  if (dir != nullptr && *dir != '\0') return dir;
  return LLM_TEST_DATA_DIR;
}

// Where tools/models/fetch_model.sh keeps the real models (`make test` fetches them first):
// $LLM_MODELS_CACHE, else ~/.cache/llm-models; `file` inside it.
inline std::string CachedModelPath(const std::string& file) {
  const char* env = std::getenv("LLM_MODELS_CACHE");
  const char* home = std::getenv("HOME");
  const std::string dir = env != nullptr    ? env
                          : home != nullptr ? std::string(home) + "/.cache/llm-models"
                                            : "";
  return dir + "/" + file;
}

}  // namespace llm::testing

#endif  // LLM_TESTS_TESTING_TEST_DATA_H_
