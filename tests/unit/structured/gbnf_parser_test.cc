// ParseGbnf: strings each construct accepts and rejects, and what it refuses (by name).
#include "structured/gbnf_parser.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/structured/test_util.h"

namespace llm::structured {
namespace {

using testing::CompileForBytes;
using testing::Matches;

using Case = testing::FrontEndCase;

class GbnfCaseTest : public ::testing::TestWithParam<Case> {};

TEST_P(GbnfCaseTest, AcceptsAndRejects) {
  testing::ExpectAcceptsAndRejects(ParseGbnf(GetParam().text), GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Constructs, GbnfCaseTest,
    ::testing::Values(
        Case{R"(root ::= "hello")", {"hello"}, {"", "hell", "hello!", "Hello"}},
        Case{R"(root ::= "a" | "bc" | "")", {"a", "bc", ""}, {"b", "abc", "c"}},
        Case{"root ::= [a-c]+ [0-9]*", {"a", "abc012", "cc9"}, {"", "0", "ad", "a0a"}},
        Case{"root ::= [^a-c\\n]", {"d", "Z", "\xC3\xA9", "\xE2\x82\xAC"}, {"a", "\n", "", "dd"}},
        Case{"root ::= .", {"x", "\xC3\xA9", "\xF0\x9F\x98\x80"}, {"", "\xC3", "\xFF", "ab"}},
        Case{"root ::= [α-γ]", {"\xCE\xB1", "\xCE\xB3"}, {"\xCE\xB4", "a"}},
        Case{R"(root ::= "x"{2,3})", {"xx", "xxx"}, {"x", "xxxx"}},
        Case{R"(root ::= "x"{2})", {"xx"}, {"x", "xxx"}},
        Case{R"(root ::= "x"{2,})", {"xx", "xxxxx"}, {"x"}},
        Case{R"(root ::= "x"{,2})", {"", "x", "xx"}, {"xxx"}},
        Case{R"(root ::= ("ab" | "c")? "d")", {"d", "abd", "cd"}, {"ab", "abcd"}},
        Case{"root ::= \"\\x41\\u00e9\\t\\\"\\\\\"", {"A\xC3\xA9\t\"\\"}, {"A"}},
        Case{"root ::= [\\]\\[\\-]", {"]", "[", "-"}, {"\\"}},
        // Rules in any order, recursion (balanced parentheses), comments, continuation lines.
        Case{"# balanced\nroot ::= item*  # items\nitem ::= \"(\" item* \")\"\n",
             {"", "()", "(())()", "((()))"},
             {"(", ")", "(()", "())"}},
        Case{"root ::= a\n    | b\na ::= \"x\"\nb ::= (\n  \"y\"\n  | \"z\"\n)\n",
             {"x", "y", "z"},
             {"", "xy"}},
        // llama.cpp's JSON grammar (grammars/json.gbnf, shortened).
        Case{R"(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)",
             {"{}", R"({"a": 1, "b": [true, null, "x\n"]})", "{\"k\":{\"n\":-0.5e3}}\n"},
             {"[]", R"({"a" 1})", R"({"a": tru})", "{\"a\":\"\x01\"}"}}));

TEST(GbnfParserTest, RefusesNamingTheConstruct) {
  struct Refusal {
    std::string grammar;
    std::string message;
  };
  for (const Refusal& r : std::vector<Refusal>{
           {R"(root ::= <[1000]>)", "token references"},
           {R"(root ::= item)", "undefined rule 'item'"},
           {R"(item ::= "x")", "no rule 'root'"},
           {"root ::= \"x\"\nroot ::= \"y\"", "defined twice"},
           {R"(root ::= "x)", "unterminated string"},
           {R"(root ::= [a-)", "unterminated character class"},
           {R"(root ::= ("x")", "expected ')'"},
           {R"(root ::= "x"{3,1})", "n < m"},
           {R"(root ::= "x" @)", "unexpected character '@'"},
       }) {
    absl::StatusOr<Grammar> g = ParseGbnf(r.grammar);
    ASSERT_FALSE(g.ok()) << r.grammar;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(g.status().message()), ::testing::HasSubstr(r.message)) << r.grammar;
  }
}

// What parses but cannot be compiled: left recursion and grammars that match nothing.
TEST(GbnfParserTest, CompileRefusesLeftRecursionAndEmptyLanguages) {
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"root ::= list\nlist ::= list \",\" \"x\" | \"x\"", "left recursion in rule 'list'"},
           {"root ::= a\na ::= b? c | \"z\"\nb ::= \"b\"\nc ::= a \"c\"", "left recursion"},
           {"root ::= a\na ::= \"x\" a", "matches no string"},
       }) {
    absl::StatusOr<Grammar> g = ParseGbnf(text);
    ASSERT_TRUE(g.ok()) << g.status();
    absl::StatusOr<std::shared_ptr<const CompiledGrammar>> c =
        CompiledGrammar::Compile(*g, testing::ByteVocab());
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(c.status().message()), ::testing::HasSubstr(message));
  }
}

// A dead alternative (a rule that never completes) is dropped, not offered: after "a" only
// "b" may follow, although `dead` starts with "x".
TEST(GbnfParserTest, DeadAlternativesAreNotOffered) {
  absl::StatusOr<Grammar> g = ParseGbnf("root ::= \"a\" dead | \"ab\"\ndead ::= \"x\" dead");
  ASSERT_TRUE(g.ok());
  auto c = CompileForBytes(*g);
  ASSERT_NE(c, nullptr);
  GrammarMatcher m(c);
  ASSERT_TRUE(m.AcceptString("a"));
  EXPECT_FALSE(m.AcceptString("x"));
  EXPECT_TRUE(Matches(c, "ab"));
}

}  // namespace
}  // namespace llm::structured
