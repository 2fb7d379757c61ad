// Tests of real model files (tools/models/fetch_model.sh's, which `make test` runs first): a
// fixture that skips when the file is not in the cache, naming the path and the command that
// fetches it; test names from the fetch names; and the golden JSON files that
// tools/models/make_real_golden.py writes into tests/data/models/real/.
#ifndef LLM_TESTS_TESTING_REAL_MODEL_FILE_TEST_H_
#define LLM_TESTS_TESTING_REAL_MODEL_FILE_TEST_H_

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/test_data.h"

namespace llm::testing {

// A test parameterized by a real model file. `Param` has the members `const char* fetch_name`
// (fetch_model.sh's name) and `const char* file` (its file in the cache). A subclass's SetUp
// calls this one's first and returns when IsSkipped().
template <typename Param>
class RealModelFileTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    path_ = CachedModelPath(this->GetParam().file);
    if (!std::filesystem::exists(path_)) {
      GTEST_SKIP() << path_ << " is not there (tools/models/fetch_model.sh "
                   << this->GetParam().fetch_name << " fetches it)";
    }
  }
  std::string path_;
};

// The test name of a RealModelFileTest's instance: its fetch name with '-' as '_'.
struct FetchNameOfParam {
  template <typename Param>
  std::string operator()(const ::testing::TestParamInfo<Param>& info) const {
    std::string name = info.param.fetch_name;
    std::replace(name.begin(), name.end(), '-', '_');
    return name;
  }
};

// tests/data/models/real/<stem of model_file>.golden.json, parsed; null, failing the test, when
// it cannot be read.
inline nlohmann::json ReadRealGolden(const std::string& model_file) {
  const std::string path = TestDataDir() + "/models/real/" +
                           std::filesystem::path(model_file).stem().string() + ".golden.json";
  std::ifstream in(path);
  EXPECT_TRUE(in) << "no golden file " << path;
  if (!in) return nullptr;
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

}  // namespace llm::testing

#endif  // LLM_TESTS_TESTING_REAL_MODEL_FILE_TEST_H_
