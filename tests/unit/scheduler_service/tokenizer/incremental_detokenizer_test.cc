// The incremental detokenizer over the three fixture tokenizers: the deltas add up to the
// full decode for every prefix of the output, never split a character, put Metaspace
// spaces right using the prompt, and stop strings split across tokens end the output (from
// min_tokens on).
#include "scheduler_service/tokenizer/incremental_detokenizer.h"

#include <memory>
#include <string>
#include <vector>

#include "common/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/scheduler_service/tokenizer/test_data.h"

namespace llm {
namespace {

using ::llm::testing::LoadTokenizer;
using ::testing::HasSubstr;
using ::testing::Not;

const char kMultilingual[] =
    "Hello, world! 中文字符 and 日本語. Emoji 👨‍👩‍👧‍👦 🦩🪐 done; "
    "e\u0301 "
    "Z\u0351a\u0357\n  indented  line 12345 <tool_call> it's";

class DetokenizerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    tok_ = LoadTokenizer(GetParam());
    ASSERT_NE(tok_, nullptr);
  }
  std::unique_ptr<IncrementalDetokenizer> Create(std::span<const TokenId> prompt,
                                                 DetokenizeOptions options = {}) {
    return TokenizerDetokenizerFactory(tok_).Create(prompt, options);
  }
  std::shared_ptr<const Tokenizer> tok_;
};

// For every prefix of the output: the deltas are final text (a prefix of the whole
// output's decode, whole characters only), and with Flush they equal the decode of the
// prefix. A prefix that ends inside a character decodes to U+FFFD there; so does Flush.
// (Hugging Face's ByteFallback decoder then also turns the complete characters of the same
// run of byte tokens into U+FFFD; those were released already and stay as they were.)
TEST_P(DetokenizerTest, DeltasAddUpToTheFullDecodeForEveryPrefix) {
  const std::vector<TokenId> ids = tok_->Encode(kMultilingual, false);
  ASSERT_GT(ids.size(), 20u);
  const std::string whole = tok_->Decode(ids, /*skip_special_tokens=*/true);
  int incomplete_prefixes = 0;
  for (size_t k = 0; k <= ids.size(); ++k) {
    const std::span<const TokenId> prefix(ids.data(), k);
    const std::string full = tok_->Decode(prefix, /*skip_special_tokens=*/true);
    auto detok = Create({});
    std::string deltas;
    for (const TokenId id : prefix) {
      const auto delta = detok->Append({&id, 1});
      EXPECT_FALSE(delta.stopped);
      // Complete characters only: the fixture text has no U+FFFD of its own.
      EXPECT_TRUE(IsValidUtf8(delta.text));
      EXPECT_THAT(delta.text, Not(HasSubstr(std::string(kReplacementChar))));
      deltas += delta.text;
    }
    ASSERT_TRUE(whole.starts_with(deltas)) << "k=" << k << " deltas: " << deltas;
    const std::string flushed = detok->Flush();
    EXPECT_EQ(detok->output_text(), deltas + flushed);
    if (!full.ends_with(kReplacementChar)) {
      EXPECT_EQ(deltas + flushed, full) << "k=" << k;
    } else {
      ++incomplete_prefixes;
      EXPECT_TRUE(flushed.ends_with(kReplacementChar)) << "k=" << k;
      // Byte-level decoding repairs the whole text at once, so nothing else changes.
      if (GetParam() == "llama3_style") {
        EXPECT_EQ(deltas + flushed, full) << "k=" << k;
      }
    }
  }
  EXPECT_GT(incomplete_prefixes, 0) << "the text should have characters made of byte tokens";
}

TEST_P(DetokenizerTest, ManyTokensPerAppendGiveTheSameText) {
  const std::vector<TokenId> ids = tok_->Encode(kMultilingual, false);
  auto detok = Create({});
  std::string text;
  for (size_t i = 0; i < ids.size(); i += 3) {
    text +=
        detok->Append(std::span<const TokenId>(ids).subspan(i, std::min<size_t>(3, ids.size() - i)))
            .text;
  }
  text += detok->Flush();
  EXPECT_EQ(text, tok_->Decode(ids, true));
}

// The prompt's last tokens give the context: the first output word of a Metaspace tokenizer
// keeps its leading space, as in the decode of prompt and output together.
TEST_P(DetokenizerTest, OutputAfterAPromptHasTheRightSpaces) {
  const std::vector<TokenId> all = tok_->Encode("The capital of France is Paris, a city.", true);
  for (size_t split = 2; split + 1 < all.size(); ++split) {
    const std::span<const TokenId> prompt(all.data(), split);
    const std::span<const TokenId> output(all.data() + split, all.size() - split);
    const std::string whole = tok_->Decode(all, true);
    const std::string before = tok_->Decode(prompt, true);
    ASSERT_TRUE(whole.starts_with(before));
    auto detok = Create(prompt);
    std::string text;
    for (const TokenId id : output) text += detok->Append({&id, 1}).text;
    text += detok->Flush();
    EXPECT_EQ(text, whole.substr(before.size())) << "split at " << split;
  }
  // And the first generated word after "is" starts with a space.
  const std::vector<TokenId> prompt = tok_->Encode("The capital of France is", true);
  const std::vector<TokenId> answer = tok_->Encode("The capital of France is Paris", true);
  ASSERT_TRUE(std::equal(prompt.begin(), prompt.end(), answer.begin()));
  auto detok = Create(prompt);
  std::string text;
  for (size_t i = prompt.size(); i < answer.size(); ++i)
    text += detok->Append({&answer[i], 1}).text;
  EXPECT_EQ(text + detok->Flush(), " Paris");
}

// Characters that the vocabulary spells with several byte tokens come out whole.
TEST_P(DetokenizerTest, ByteTokensNeverSplitACharacter) {
  const std::string rare = "\U0001FAE8\U0001F9A9\u0F00\uA9C1";  // unlikely to be in a small vocab
  const std::vector<TokenId> ids = tok_->Encode(rare, false);
  ASSERT_GT(ids.size(), 4u) << "expected byte tokens";
  auto detok = Create({});
  std::vector<std::string> deltas;
  for (const TokenId id : ids) {
    auto d = detok->Append({&id, 1});
    if (!d.text.empty()) deltas.push_back(d.text);
  }
  std::string joined;
  for (const auto& d : deltas) {
    EXPECT_TRUE(IsValidUtf8(d));
    EXPECT_THAT(d, Not(HasSubstr(std::string(kReplacementChar))));
    joined += d;
  }
  EXPECT_EQ(joined + detok->Flush(), rare);
}

// A truncated character at the end of generation becomes U+FFFD on Flush, as in a full
// decode.
TEST_P(DetokenizerTest, FlushReleasesAnIncompleteCharacterAsReplacement) {
  const std::vector<TokenId> ids = tok_->Encode("ok \U0001FAE8", false);
  const std::vector<TokenId> truncated(ids.begin(), ids.end() - 1);
  auto detok = Create({});
  std::string text = detok->Append(truncated).text;
  EXPECT_THAT(text, Not(HasSubstr(std::string(kReplacementChar))));
  text += detok->Flush();
  EXPECT_EQ(text, tok_->Decode(truncated, true));
  EXPECT_THAT(text, HasSubstr(std::string(kReplacementChar)));
}

// A stop string that spans several tokens ends the output before it; nothing after it is
// ever emitted, whether tokens come one at a time or all at once.
TEST_P(DetokenizerTest, StopStringAcrossTokensIsCaught) {
  const std::string text =
      "The quick brown fox jumps over the lazy dog and keeps running far away.";
  const std::string stop = "lazy dog";
  const std::vector<TokenId> ids = tok_->Encode(text, false);
  // The stop string is really split across tokens.
  bool in_one_token = false;
  for (const TokenId id : ids) {
    in_one_token |= tok_->Decode(std::vector<TokenId>{id}, true).find(stop) != std::string::npos;
  }
  ASSERT_FALSE(in_one_token);
  const std::string full = tok_->Decode(ids, true);
  const size_t at = full.find(stop);
  ASSERT_NE(at, std::string::npos);

  for (const bool include : {false, true}) {
    DetokenizeOptions options;
    options.stop = {"never appears", stop};
    options.include_stop_str_in_output = include;
    const std::string expected = full.substr(0, at + (include ? stop.size() : 0));
    // One token at a time.
    auto detok = Create({}, options);
    std::string out;
    bool stopped = false;
    for (const TokenId id : ids) {
      auto d = detok->Append({&id, 1});
      ASSERT_FALSE(stopped && !d.text.empty()) << "text after the stop";
      out += d.text;
      if (d.stopped) {
        stopped = true;
        EXPECT_EQ(d.stop_string, stop);
      }
    }
    EXPECT_TRUE(stopped);
    EXPECT_EQ(out, expected);
    EXPECT_EQ(detok->Flush(), "");
    EXPECT_EQ(detok->output_text(), expected);
    // All at once.
    auto batch = Create({}, options);
    auto d = batch->Append(ids);
    EXPECT_TRUE(d.stopped);
    EXPECT_EQ(d.text, expected);
    EXPECT_TRUE(batch->Append(ids).text.empty());
  }
}

// With min_tokens, stop strings are searched only in the text released from the
// min_tokens-th token on: an earlier occurrence passes as plain text.
TEST_P(DetokenizerTest, StopStringsCountFromMinTokens) {
  const std::string stop = "lazy dog";
  const std::vector<TokenId> ids = tok_->Encode("A lazy dog met another lazy dog today.", false);
  const std::string full = tok_->Decode(ids, true);
  const size_t first = full.find(stop);
  const size_t second = full.find(stop, first + 1);
  ASSERT_NE(second, std::string::npos);
  // The tokens that complete the first occurrence.
  size_t k = 0;
  while (tok_->Decode(std::span<const TokenId>(ids).first(k), true).size() < first + stop.size()) {
    ++k;
  }
  for (const int min_tokens : {0, static_cast<int>(k) + 1}) {
    SCOPED_TRACE(min_tokens);
    DetokenizeOptions options;
    options.stop = {stop};
    options.min_tokens = min_tokens;
    auto detok = Create({}, options);
    std::string out;
    bool stopped = false;
    for (const TokenId id : ids) {
      auto d = detok->Append({&id, 1});
      out += d.text;
      stopped |= d.stopped;
    }
    EXPECT_TRUE(stopped);
    EXPECT_EQ(out, full.substr(0, min_tokens == 0 ? first : second));
  }
}

// Text that may begin a stop string is held back, then released when it does not.
TEST_P(DetokenizerTest, PossibleStopPrefixIsHeldBack) {
  DetokenizeOptions options;
  options.stop = {"dog!"};
  const std::vector<TokenId> ids = tok_->Encode("the lazy dog", false);
  auto detok = Create({}, options);
  std::string out = detok->Append(ids).text;
  EXPECT_FALSE(out.ends_with("dog"));
  out += detok->Flush();
  EXPECT_EQ(out, tok_->Decode(ids, true));
}

// Special tokens in the output are kept or skipped on request.
TEST_P(DetokenizerTest, SpecialTokensSkippedOnRequest) {
  const TokenId eos = tok_->eos_token_ids().front();
  std::vector<TokenId> ids = tok_->Encode("Hi there", false);
  ids.push_back(eos);
  const std::string eos_text = *tok_->IdToToken(eos);
  for (const bool skip : {true, false}) {
    DetokenizeOptions options;
    options.skip_special_tokens = skip;
    auto detok = Create({}, options);
    std::string out = detok->Append(ids).text;
    out += detok->Flush();
    EXPECT_EQ(out, tok_->Decode(ids, skip));
    EXPECT_EQ(out.find(eos_text) != std::string::npos, !skip);
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, DetokenizerTest,
                         ::testing::Values("llama3_style", "llama2_style", "mistral_style",
                                           "metaspace_style", "qwen2_style"));

}  // namespace
}  // namespace llm
