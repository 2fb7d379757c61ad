// GrammarMatcher: the fast mask against the brute force (every id offered to AcceptToken) on
// real vocabularies, at every state along real documents and random walks of several grammars;
// rollback, termination, special and stop tokens.
#include "structured/grammar_matcher.h"

#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "structured/gbnf_parser.h"
#include "structured/grammar_cache.h"
#include "structured/json_schema_converter.h"
#include "structured/regex_parser.h"
#include "tests/unit/structured/test_util.h"

namespace llm::structured {
namespace {

using testing::AllowedIds;
using testing::BruteForceMask;
using testing::FastMask;

constexpr char kPersonSchema[] = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer"},
    "email": {"type": "string", "format": "uuid"},
    "tags": {"type": "array", "items": {"enum": ["red", "green", 3, null]}, "maxItems": 3},
    "address": {"$ref": "#/$defs/address"},
    "score": {"type": ["number", "null"]}
  },
  "required": ["name", "age", "address"],
  "$defs": {"address": {"type": "object",
      "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "[0-9]{5}"}},
      "required": ["city"]}}
})";

struct Document {
  const char* name;
  GrammarSpec spec;
  std::string text;  // in the grammar's language
};

std::vector<Document> Documents() {
  GrammarSpec schema{GrammarKind::kJsonSchema, kPersonSchema};
  GrammarSpec object{GrammarKind::kJsonObject};
  GrammarSpec regex{GrammarKind::kRegex,
                    R"((\+\d{1,3} )?\(\d{3}\) \d{3}-\d{4}|[a-z]+@[a-z]+\.(com|org))"};
  GrammarSpec gbnf{GrammarKind::kGrammar,
                   R"(root ::= "SELECT " cols " FROM " name (" WHERE " name "=" num)? ";"
cols ::= "*" | name ("," " "? name)*
name ::= [a-z_] [a-z_0-9]*
num ::= [0-9]+)"};
  GrammarSpec choice{GrammarKind::kChoice, "", {"positive", "negative", "neutral", "negative!"}};
  // llama.cpp's grammars/json.gbnf: small rules (ws) that the automaton inlines.
  GrammarSpec json_gbnf{GrammarKind::kGrammar, R"(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20})"};
  return {
      {"schema", schema,
       R"({"name": "Ada Lovelace", "age": 36, "tags": ["red", 3, null], "address": {"city": "London", "zip": "12345"}, "score": -1.5e3})"},
      {"schema_compact_order", schema, R"({"name":"Bob","age":0,"address":{"city":"Z\u00e9"}})"},
      {"json_object", object,
       "{\n  \"items\": [1, 2.5, {\"k\": \"v\\n\\\"q\\\"\"}, [], {}],\n  \"ok\": true,\n  "
       "\"none\": null,\n"
       "  \"text\": \"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\"\n}"},
      {"regex", regex, "+44 (020) 555-1234"},
      {"gbnf", gbnf, "SELECT id, name FROM users WHERE id=42;"},
      {"choice", choice, "negative!"},
      // Longer than fortune-bpe's longest token: copies of the repetition share token sets.
      {"long_max_length",
       GrammarSpec{GrammarKind::kJsonSchema, R"({"type": "string", "maxLength": 60})"},
       "\"The quick brown fox jumps over the lazy dog, then naps. Zzz\""},
      {"json_gbnf", json_gbnf, "{\"a\": [1, -2.5e3, \"x y\"],\n  \"b\": {\"c\": null} }\n"},
  };
}

class MatcherVocabTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string which = GetParam();
    // llama2_style: a SentencePiece vocabulary with byte-fallback tokens (<0xE2> ...), which
    // end inside multi-byte characters.
    const std::string path = which == "smollm2" ? testing::SmolLM2Path()
                             : which == "llama2"
                                 ? llm::testing::TestDataDir() + "/tokenizer/llama2_style"
                                 : testing::FortuneBpePath();
    absl::StatusOr<testing::Vocab> v = testing::LoadVocab(
        path, which == "llama2" ? VocabEncoding::kSentencePiece : VocabEncoding::kByteLevel);
    if (!v.ok()) GTEST_SKIP() << "no vocabulary at " << path << ": " << v.status();
    vocab_ = std::move(v).value();
  }
  testing::Vocab vocab_;
};

// At every step of each document, tokenized as the model's tokenizer would, the fast mask equals
// the brute force, and allows the document's next token; at the end only stop tokens remain.
TEST_P(MatcherVocabTest, MaskEqualsBruteForceAlongDocuments) {
  GrammarCache cache(vocab_.info);
  for (const Document& doc : Documents()) {
    SCOPED_TRACE(doc.name);
    absl::StatusOr<std::shared_ptr<const CompiledGrammar>> g = cache.Get(doc.spec);
    ASSERT_TRUE(g.ok()) << g.status();
    if (std::string(doc.name) == "long_max_length" && vocab_.info->max_token_length() < 50) {
      EXPECT_LT((*g)->num_token_sets(), (*g)->num_precomputed_positions() / 2);  // merged
    }
    GrammarMatcher m(*g);
    const std::vector<int32_t> ids = testing::TokenizeExactly(vocab_, doc.text);
    ASSERT_FALSE(ids.empty());
    for (size_t i = 0; i <= ids.size(); ++i) {
      const std::vector<uint32_t> fast = FastMask(&m);
      ASSERT_EQ(fast, BruteForceMask(&m)) << "step " << i;
      if (i == ids.size()) break;
      const int32_t id = ids[i];
      ASSERT_TRUE((fast[id >> 5] >> (id & 31)) & 1) << "step " << i << " token " << id;
      ASSERT_TRUE(m.AcceptToken(id));
    }
    EXPECT_TRUE(m.CanTerminate());
    for (int32_t stop : vocab_.info->stop_token_ids()) {
      const std::vector<uint32_t> fast = FastMask(&m);
      EXPECT_TRUE((fast[stop >> 5] >> (stop & 31)) & 1);
    }
  }
}

// Random walks: each step samples an allowed token from the fast mask and compares the mask
// with the brute force, so that states no document reaches are checked too.
TEST_P(MatcherVocabTest, MaskEqualsBruteForceAlongRandomWalks) {
  GrammarCache cache(vocab_.info);
  std::mt19937 rng(7);
  const int steps = std::string(GetParam()) == "smollm2" ? 12 : 60;
  for (const Document& doc : Documents()) {
    SCOPED_TRACE(doc.name);
    absl::StatusOr<std::shared_ptr<const CompiledGrammar>> g = cache.Get(doc.spec);
    ASSERT_TRUE(g.ok()) << g.status();
    GrammarMatcher m(*g);
    // Start from a random prefix of the document, then walk at random.
    const std::vector<int32_t> ids = testing::TokenizeExactly(vocab_, doc.text);
    ASSERT_FALSE(ids.empty());
    const size_t prefix = std::uniform_int_distribution<size_t>(0, ids.size() / 2)(rng);
    for (size_t i = 0; i < prefix; ++i) ASSERT_TRUE(m.AcceptToken(ids[i]));
    for (int step = 0; step < steps && !m.IsTerminated(); ++step) {
      const std::vector<uint32_t> fast = FastMask(&m);
      ASSERT_EQ(fast, BruteForceMask(&m)) << "step " << step;
      const std::vector<int32_t> allowed = AllowedIds(fast);
      ASSERT_FALSE(allowed.empty());
      const int32_t id = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      ASSERT_TRUE(m.AcceptToken(id));
    }
  }
}

// Rolling back restores each earlier state's mask exactly, and the walk can be replayed.
TEST_P(MatcherVocabTest, RollbackRestoresMasks) {
  GrammarCache cache(vocab_.info);
  for (const Document& doc : Documents()) {
    SCOPED_TRACE(doc.name);
    GrammarMatcher m(*cache.Get(doc.spec));
    const std::vector<int32_t> ids = testing::TokenizeExactly(vocab_, doc.text);
    ASSERT_FALSE(ids.empty());
    std::vector<std::vector<uint32_t>> masks;
    for (TokenId id : ids) {
      masks.push_back(FastMask(&m));
      ASSERT_TRUE(m.AcceptToken(id));
    }
    masks.push_back(FastMask(&m));
    ASSERT_TRUE(m.AcceptToken(vocab_.info->stop_token_ids()[0]));
    EXPECT_TRUE(m.IsTerminated());
    m.Rollback(1);
    EXPECT_FALSE(m.IsTerminated());
    EXPECT_EQ(FastMask(&m), masks.back());
    for (size_t k = 1; k <= ids.size(); k += 3) {
      m.Rollback(static_cast<int32_t>(std::min<size_t>(3, ids.size() - m.num_steps() + 3)));
      const size_t at = m.num_steps();
      ASSERT_EQ(FastMask(&m), masks[at]) << "after rolling back to step " << at;
    }
    m.Reset();
    EXPECT_EQ(FastMask(&m), masks[0]);
    for (TokenId id : ids) ASSERT_TRUE(m.AcceptToken(id));
    EXPECT_EQ(FastMask(&m), masks.back());
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, MatcherVocabTest,
                         ::testing::Values("smollm2", "fortune", "llama2"),
                         [](const auto& info) { return std::string(info.param); });

std::shared_ptr<const CompiledGrammar> ByteGrammar(const std::string& gbnf) {
  absl::StatusOr<Grammar> g = ParseGbnf(gbnf);
  EXPECT_TRUE(g.ok()) << g.status();
  return testing::CompileForBytes(*g);
}

// Stop tokens only when the text is complete; special tokens and ids past the vocabulary never;
// after a stop token nothing, and the mask is all zero (written over garbage).
TEST(GrammarMatcherTest, StopAndSpecialTokens) {
  GrammarMatcher m(ByteGrammar(R"(root ::= "ab" "c"?)"));
  constexpr int32_t kStop = 256, kSpecial = 257;
  EXPECT_FALSE(m.AcceptToken(kStop));
  EXPECT_FALSE(m.AcceptToken(kSpecial));
  EXPECT_FALSE(m.AcceptToken(-1));
  EXPECT_FALSE(m.AcceptToken(258));
  EXPECT_EQ(AllowedIds(FastMask(&m)), std::vector<int32_t>{'a'});
  ASSERT_TRUE(m.AcceptToken('a'));
  EXPECT_FALSE(m.CanTerminate());
  ASSERT_TRUE(m.AcceptToken('b'));
  EXPECT_TRUE(m.CanTerminate());
  EXPECT_EQ(AllowedIds(FastMask(&m)), (std::vector<int32_t>{'c', kStop}));
  ASSERT_TRUE(m.AcceptToken('c'));
  EXPECT_EQ(AllowedIds(FastMask(&m)), std::vector<int32_t>{kStop});
  ASSERT_TRUE(m.AcceptToken(kStop));
  EXPECT_TRUE(m.IsTerminated());
  EXPECT_FALSE(m.CanTerminate());
  EXPECT_TRUE(AllowedIds(FastMask(&m)).empty());
  EXPECT_FALSE(m.AcceptToken('c'));
  EXPECT_FALSE(m.AcceptToken(kStop));
  EXPECT_EQ(m.num_steps(), 4);
}

// A refused token or string leaves the state as it was.
TEST(GrammarMatcherTest, RefusalLeavesStateUnchanged) {
  GrammarMatcher m(ByteGrammar(R"(root ::= "abc" | "abd")"));
  ASSERT_TRUE(m.AcceptString("ab"));
  const std::vector<uint32_t> before = FastMask(&m);
  EXPECT_FALSE(m.AcceptString("cx"));
  EXPECT_FALSE(m.AcceptToken('x'));
  EXPECT_EQ(FastMask(&m), before);
  EXPECT_EQ(m.num_steps(), 1);
  EXPECT_TRUE(m.AcceptString("d"));
  EXPECT_TRUE(m.CanTerminate());
}

// A copy is an independent fork of the sequence.
TEST(GrammarMatcherTest, CopyForks) {
  GrammarMatcher a(ByteGrammar(R"(root ::= "x" ("y" | "z"))"));
  ASSERT_TRUE(a.AcceptToken('x'));
  GrammarMatcher b = a;
  ASSERT_TRUE(a.AcceptToken('y'));
  EXPECT_TRUE(a.CanTerminate());
  EXPECT_FALSE(b.CanTerminate());
  EXPECT_EQ(AllowedIds(FastMask(&b)), (std::vector<int32_t>{'y', 'z'}));
}

// The mask leaves the padding bits past vocab_size clear, and ids without bytes unset.
TEST(GrammarMatcherTest, PaddedVocabularyBitsStayClear) {
  absl::StatusOr<std::shared_ptr<const TokenizerInfo>> info =
      TokenizerInfo::Create({"a", "b", "", "ab"}, 40, {39}, {});
  ASSERT_TRUE(info.ok());
  absl::StatusOr<Grammar> g = ParseGbnf(R"(root ::= [ab]*)");
  GrammarMatcher m(*CompiledGrammar::Compile(*g, *info));
  std::vector<uint32_t> mask(2, 0xFFFFFFFFu);
  m.FillNextTokenBitmask(mask.data());
  EXPECT_EQ(AllowedIds(mask), (std::vector<int32_t>{0, 1, 3, 39}));
  EXPECT_FALSE(m.AcceptToken(2));
  EXPECT_FALSE(m.AcceptToken(20));
}

}  // namespace
}  // namespace llm::structured
