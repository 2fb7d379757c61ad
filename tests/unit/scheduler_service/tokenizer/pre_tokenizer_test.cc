// Pre-tokenizers against the pieces the Hugging Face library's pre_tokenize_str gives
// (tools/tokenizer/make_fixtures.py): the GPT-2 (ByteLevel use_regex), Llama 3 and Qwen2
// split patterns, Metaspace, and each Split behavior.
#include "scheduler_service/tokenizer/pre_tokenizer.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "scheduler_service/tokenizer/regex.h"
#include "tests/unit/scheduler_service/tokenizer/test_data.h"

namespace llm {
namespace {

using ::llm::testing::ReadJson;
using ::testing::ElementsAreArray;

TEST(PreTokenizerTest, MatchesHuggingFacePreTokenizeStr) {
  const auto fixtures = ReadJson("pretokenize_fixtures.json");
  int checked = 0;
  for (const auto& [name, entry] : fixtures.items()) {
    if (!entry.is_object()) continue;  // tokenizers_version
    SCOPED_TRACE(name);
    auto pre = ParsePreTokenizer(entry["pre_tokenizer"]);
    ASSERT_TRUE(pre.ok()) << pre.status();
    for (const auto& c : entry["cases"]) {
      const std::string text = c["text"];
      SCOPED_TRACE("text: " + text);
      // As in the Hugging Face library, empty text has no piece to pre-tokenize.
      std::vector<PreToken> pieces;
      if (!text.empty()) pieces.push_back({text, true});
      (*pre)->PreTokenizeAll(&pieces);
      std::vector<std::string> got;
      for (const auto& p : pieces) got.push_back(p.text);
      EXPECT_THAT(got, ElementsAreArray(c["pieces"].get<std::vector<std::string>>()));
      ++checked;
    }
  }
  EXPECT_GT(checked, 200);
}

TEST(PreTokenizerTest, UnknownTypeIsNamed) {
  auto pre = ParsePreTokenizer(nlohmann::json{{"type", "UnicodeScripts"}});
  ASSERT_FALSE(pre.ok());
  EXPECT_THAT(std::string(pre.status().message()), ::testing::HasSubstr("UnicodeScripts"));
  auto bad_regex = ParsePreTokenizer(nlohmann::json{
      {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}});
  ASSERT_FALSE(bad_regex.ok());
  EXPECT_THAT(std::string(bad_regex.status().message()), ::testing::HasSubstr("(unclosed"));
}

// \s is Unicode's White_Space, as HF tokenizers has it: U+180E MONGOLIAN VOWEL SEPARATOR (a
// space to PCRE2's tables, not to Unicode since 6.3) is not one; NEL, NBSP and the
// ideographic space are. Inside a class, and \S, likewise.
TEST(RegexTest, WhitespaceIsUnicodeWhiteSpace) {
  auto space = Regex::Compile(R"(\s+)");
  ASSERT_TRUE(space.ok()) << space.status();
  const std::string text = "a\u180Eb c\u0085d\u00A0e\u3000f";
  const auto matches = (*space)->FindAll(text);
  ASSERT_EQ(matches.size(), 4u);
  EXPECT_EQ(text.substr(matches[0].first, matches[0].second - matches[0].first), " ");
  EXPECT_EQ(text.substr(matches[1].first, matches[1].second - matches[1].first), "\u0085");
  auto not_space = Regex::Compile(R"(\S+)");
  ASSERT_TRUE(not_space.ok());
  EXPECT_EQ((*not_space)->FindAll("a\u180Eb c").size(), 2u);  // "a\u180Eb", "c"
  auto in_class = Regex::Compile(R"([^\s\p{L}]+)");
  ASSERT_TRUE(in_class.ok());
  EXPECT_EQ((*in_class)->FindAll("a\u180E1 2").size(), 2u);  // "\u180E1", "2"
  // Quoted text is left alone; other escapes too.
  EXPECT_EQ(WithUnicodeWhiteSpace(R"(\Q\s\E\d\\s)"), R"(\Q\s\E\d\\s)");
}

TEST(RegexTest, LiteralPatternsAreNotRegexes) {
  auto literal = Regex::CompileLiteral("a.b\\E(");
  ASSERT_TRUE(literal.ok()) << literal.status();
  using Matches = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ((*literal)->FindAll("xa.b\\E(y axb\\E("), (Matches{{1, 7}}));
}

}  // namespace
}  // namespace llm
