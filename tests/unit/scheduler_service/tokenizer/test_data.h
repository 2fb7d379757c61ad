// Paths and readers for tests/data/tokenizer, shared by the tokenizer tests.
#ifndef LLM_TESTS_UNIT_SCHEDULER_SERVICE_TOKENIZER_TEST_DATA_H_
#define LLM_TESTS_UNIT_SCHEDULER_SERVICE_TOKENIZER_TEST_DATA_H_

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "scheduler_service/tokenizer/tokenizer.h"

namespace llm::testing {

inline std::string TokenizerDataDir() { return LLM_TOKENIZER_TEST_DATA; }

inline std::string ReadDataFile(const std::string& relative) {
  std::ifstream in(TokenizerDataDir() + "/" + relative, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << relative;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline nlohmann::json ReadJson(const std::string& relative) {
  return nlohmann::json::parse(ReadDataFile(relative));
}

inline std::string HexToBytes(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// Loads tests/data/tokenizer/<name>; fails the test when it does not load.
inline std::shared_ptr<const Tokenizer> LoadTokenizer(const std::string& name) {
  auto tok = Tokenizer::FromDirectory(TokenizerDataDir() + "/" + name);
  EXPECT_TRUE(tok.ok()) << tok.status();
  if (!tok.ok()) return nullptr;
  return std::shared_ptr<const Tokenizer>(std::move(tok).value());
}

}  // namespace llm::testing

#endif  // LLM_TESTS_UNIT_SCHEDULER_SERVICE_TOKENIZER_TEST_DATA_H_
