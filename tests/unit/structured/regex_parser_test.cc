// ParseRegex / RegexToExpr: strings each construct accepts and rejects, and what it refuses.
#include "structured/regex_parser.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/structured/test_util.h"

namespace llm::structured {
namespace {

using testing::CompileForBytes;

using Case = testing::FrontEndCase;

class RegexCaseTest : public ::testing::TestWithParam<Case> {};

TEST_P(RegexCaseTest, AcceptsAndRejects) {
  testing::ExpectAcceptsAndRejects(ParseRegex(GetParam().text), GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Constructs, RegexCaseTest,
    ::testing::Values(
        Case{"abc", {"abc"}, {"", "ab", "abcd"}}, Case{"^abc$", {"abc"}, {"^abc$", "abcabc"}},
        Case{"a|bc|", {"a", "bc", ""}, {"abc", "b"}},
        // Hex escapes, in a class too (é as octal escapes, which end after 3 digits).
        Case{R"(\x41\u00e9[\x30-\x32])", {"A\303\2511"}, {"A\303\251", "a\303\2511", "A\303\2513"}},
        Case{"colou?r", {"color", "colour"}, {"colouur"}},
        Case{"a*b+", {"b", "aabbb"}, {"", "a", "ba"}}, Case{"x{3}", {"xxx"}, {"xx", "xxxx"}},
        Case{"x{2,}", {"xx", "xxxxxx"}, {"x"}}, Case{"x{1,3}y", {"xy", "xxxy"}, {"y", "xxxxy"}},
        Case{"x{,2}", {"x{,2}"}, {"", "xx"}},  // as Python: not a quantifier, literal text
        Case{"a+?b*?", {"a", "aabb"}, {"b"}},  // lazy: the same language
        Case{R"(\d\w\s)", {"0a ", "9_\t"}, {"a0 ", "00x"}},
        Case{R"(\D\W\S)", {"a-x", "\xC3\xA9!\xC3\xA9"}, {"0--", "a_a", "a-\n"}},
        Case{R"([a-c0-2_])", {"a", "c", "1", "_"}, {"d", "3", ""}},
        Case{R"([^a-c])", {"d", "\xE2\x82\xAC", "\n"}, {"a", "b"}},
        Case{R"([\d.-]+)", {"1.5", "-2", "..."}, {"a", "1,5"}},
        Case{R"([\]\\-])", {"]", "\\", "-"}, {"a"}}, Case{R"([]a])", {"]", "a"}, {"b"}},
        Case{".", {"a", "\xC3\xA9", "\xF0\x9F\x98\x80"}, {"\n", "", "\xC3"}},
        Case{R"(\.\*\+\?\(\)\[\{\|\^\$)", {".*+?()[{|^$"}, {"a"}},
        Case{R"(\x41\u00e9\n\t)", {"A\xC3\xA9\n\t"}, {"A"}},
        Case{"(ab)+(?:cd)?(?P<x>e|f)(?<y>g)",
             {"abe"
              "g",
              "ababcdfg"},
             {"cdeg", "abg"}},
        Case{"caf\xC3\xA9|[\xCE\xB1-\xCF\x89]+", {"caf\xC3\xA9", "\xCE\xB1\xCF\x89"}, {"cafe"}},
        Case{R"((\+\d{1,3} )?\(\d{3}\) \d{3}-\d{4})",
             {"(020) 555-1234", "+44 (020) 555-1234"},
             {"+44(020) 555-1234", "(02) 555-1234"}}));

TEST(RegexParserTest, RefusesNamingTheConstruct) {
  for (const auto& [regex, message] : std::vector<std::pair<std::string, std::string>>{
           {"a(?=b)", "lookaround"},
           {"a(?!b)", "lookaround"},
           {"(?<=a)b", "lookaround"},
           {"(a)\\1", "backreferences"},
           {"\\bword\\b", "word boundaries"},
           {"a^b", "anchor '^' inside"},
           {"a$b", "anchor '$' inside"},
           {"(?i)abc", "inline flags"},
           {"a*+", "possessive"},
           {"\\p{L}", "Unicode properties"},
           {"[[:alpha:]]", "POSIX classes"},
           {"(ab", "missing ')'"},
           {"ab)", "unbalanced ')'"},
           {"[ab", "missing ']'"},
           {"*a", "without an operand"},
           {"x{3,1}", "n < m"},
           {"[z-a]", "bad range"},
       }) {
    absl::StatusOr<Grammar> g = ParseRegex(regex);
    ASSERT_FALSE(g.ok()) << regex;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(g.status().message()), ::testing::HasSubstr(message)) << regex;
  }
}

// A bounded repetition too large to unroll is refused, not compiled for minutes.
TEST(RegexParserTest, HugeRepetitionIsRefusedAtCompile) {
  absl::StatusOr<Grammar> g = ParseRegex("[a-z]{1000000}");
  ASSERT_TRUE(g.ok());
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> c =
      CompiledGrammar::Compile(*g, testing::ByteVocab());
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), ::testing::HasSubstr("too large"));
}

}  // namespace
}  // namespace llm::structured
