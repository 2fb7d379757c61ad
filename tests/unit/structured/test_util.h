// Helpers for the tests of structured/: a byte vocabulary, real vocabularies read through the
// tokenizer library (tests only: the library itself does not depend on it), and the brute-force
// mask every fast mask is compared with.
#ifndef LLM_TESTS_UNIT_STRUCTURED_TEST_UTIL_H_
#define LLM_TESTS_UNIT_STRUCTURED_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler_service/tokenizer/grammar_vocabulary.h"
#include "scheduler_service/tokenizer/tokenizer.h"
#include "structured/compiled_grammar.h"
#include "structured/grammar.h"
#include "structured/grammar_matcher.h"
#include "structured/tokenizer_info.h"
#include "tests/testing/test_data.h"

namespace llm::structured::testing {

// Token i is the byte i (0-255); 256 is a stop token, 257 a special token.
inline std::shared_ptr<const TokenizerInfo> ByteVocab() {
  static const std::shared_ptr<const TokenizerInfo> info = [] {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
    bytes.push_back("");
    bytes.push_back("<special>");
    return *TokenizerInfo::Create(std::move(bytes), 258, {256}, {257});
  }();
  return info;
}

inline std::shared_ptr<const CompiledGrammar> CompileForBytes(const Grammar& g) {
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> c =
      CompiledGrammar::Compile(g, ByteVocab());
  return c.ok() ? *c : nullptr;
}

// The whole of `text` is in the grammar's language.
inline bool Matches(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.AcceptString(text) && m.CanTerminate();
}

// A front end's case: its source text (a grammar, a regex), and strings the grammar made of it
// must match and must not.
struct FrontEndCase {
  std::string text;
  std::vector<std::string> accepted;
  std::vector<std::string> rejected;
};
// Named in messages by its text (gtest would print the struct's bytes).
inline void PrintTo(const FrontEndCase& c, std::ostream* os) { *os << c.text; }

// The grammar a front end made of `c.text` matches every accepted string and no rejected one.
inline void ExpectAcceptsAndRejects(const absl::StatusOr<Grammar>& g, const FrontEndCase& c) {
  ASSERT_TRUE(g.ok()) << g.status();
  auto compiled = CompileForBytes(*g);
  ASSERT_NE(compiled, nullptr) << g->ToString();
  for (const std::string& s : c.accepted) EXPECT_TRUE(Matches(compiled, s)) << "'" << s << "'";
  for (const std::string& s : c.rejected) EXPECT_FALSE(Matches(compiled, s)) << "'" << s << "'";
}

// A tokenizer's vocabulary as TokenizerInfo, built as the scheduler and the workers build it
// (GrammarVocabulary); FAILED_PRECONDITION when the spelling it reads from the tokenizer's
// decoder is not `encoding`, the one the test expects of that tokenizer.
struct Vocab {
  std::unique_ptr<Tokenizer> tokenizer;
  std::shared_ptr<const TokenizerInfo> info;
};

inline absl::StatusOr<Vocab> LoadVocab(const std::string& path, VocabEncoding encoding) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromDirectory(path);
  if (!tok.ok()) return tok.status();
  Vocab v;
  v.tokenizer = std::move(tok).value();
  const VocabEncoding read = VocabEncodingOf(v.tokenizer->token_spelling());
  if (read != encoding) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": the tokenizer's spelling was read as ", static_cast<int>(read),
                     ", expected ", static_cast<int>(encoding)));
  }
  absl::StatusOr<std::shared_ptr<const TokenizerInfo>> info =
      GrammarVocabulary(*v.tokenizer, v.tokenizer->vocab_size());
  if (!info.ok()) return info.status();
  v.info = *info;
  return v;
}

inline std::string SmolLM2Path() {
  return llm::testing::CachedModelPath("SmolLM2-135M-Instruct.Q4_1.gguf");
}
inline std::string FortuneBpePath() { return llm::testing::TestDataDir() + "/models/fortune-bpe"; }

// Token ids whose bytes concatenate to `text`: the tokenizer's own encoding where its bytes are
// exactly the text, else (a SentencePiece normalizer that prepends a space) the longest
// matching token at each position.
inline std::vector<int32_t> TokenizeExactly(const Vocab& v, const std::string& text) {
  std::vector<int32_t> ids;
  std::string bytes;
  for (TokenId id : v.tokenizer->Encode(text, false)) {
    ids.push_back(id);
    bytes += v.info->token_bytes(id);
  }
  if (bytes == text) return ids;
  ids.clear();
  for (size_t pos = 0; pos < text.size();) {
    int32_t best = -1;
    size_t best_len = 0;
    for (int32_t id : v.info->sorted_ids()) {
      const std::string_view b = v.info->token_bytes(id);
      if (b.size() > best_len && std::string_view(text).substr(pos).starts_with(b)) {
        best = id;
        best_len = b.size();
      }
    }
    if (best < 0) return {};
    ids.push_back(best);
    pos += best_len;
  }
  return ids;
}

// The mask by definition: each id in turn offered to AcceptToken (and taken back).
inline std::vector<uint32_t> BruteForceMask(GrammarMatcher* m) {
  const TokenizerInfo& tok = m->grammar().tokenizer();
  std::vector<uint32_t> mask(tok.bitmask_words(), 0);
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (!m->AcceptToken(id)) continue;
    mask[id >> 5] |= uint32_t{1} << (id & 31);
    m->Rollback(1);
  }
  return mask;
}

// The fast mask, written over garbage so that a word it fails to write shows.
inline std::vector<uint32_t> FastMask(GrammarMatcher* m) {
  std::vector<uint32_t> mask(m->grammar().tokenizer().bitmask_words(), 0xA5A5A5A5u);
  m->FillNextTokenBitmask(mask.data());
  return mask;
}

inline std::vector<int32_t> AllowedIds(const std::vector<uint32_t>& mask) {
  std::vector<int32_t> ids;
  for (size_t w = 0; w < mask.size(); ++w) {
    for (int b = 0; b < 32; ++b) {
      if ((mask[w] >> b) & 1) ids.push_back(static_cast<int32_t>(w * 32 + b));
    }
  }
  return ids;
}

}  // namespace llm::structured::testing

#endif  // LLM_TESTS_UNIT_STRUCTURED_TEST_UTIL_H_
