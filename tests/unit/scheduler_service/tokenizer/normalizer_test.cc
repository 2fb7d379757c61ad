// Normalizers against what the Hugging Face library's normalize_str gives
// (tools/tokenizer/make_fixtures.py): Llama 2's Prepend + Replace, Strip, Replace with a
// regex and with a string, NFC (Qwen2's) and NFD.
#include "scheduler_service/tokenizer/normalizer.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/scheduler_service/tokenizer/test_data.h"

namespace llm {
namespace {

using ::llm::testing::ReadJson;

TEST(NormalizerTest, MatchesHuggingFaceNormalizeStr) {
  const auto fixtures = ReadJson("normalize_fixtures.json");
  int checked = 0;
  for (const auto& [name, entry] : fixtures.items()) {
    if (!entry.is_object()) continue;  // tokenizers_version
    SCOPED_TRACE(name);
    auto normalizer = ParseNormalizer(entry["normalizer"]);
    ASSERT_TRUE(normalizer.ok()) << normalizer.status();
    ASSERT_NE(*normalizer, nullptr);
    for (const auto& c : entry["cases"]) {
      std::string text = c["text"];
      SCOPED_TRACE("text: " + text);
      (*normalizer)->Normalize(&text);
      EXPECT_EQ(text, c["normalized"].get<std::string>());
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(NormalizerTest, CompatibilityFormsAndOthersAreRefusedByName) {
  for (const std::string& type : {"NFKC", "NFKD", "Lowercase", "BertNormalizer", "Precompiled"}) {
    auto normalizer = ParseNormalizer(nlohmann::json{{"type", type}});
    ASSERT_FALSE(normalizer.ok()) << type;
    EXPECT_THAT(std::string(normalizer.status().message()), ::testing::HasSubstr(type));
  }
}

}  // namespace
}  // namespace llm
