// The tokenizer against the Hugging Face tokenizers library: token ids and decodes recorded
// by tools/tokenizer/make_fixtures.py for three tokenizers written by make_tokenizers.py
// (Llama 3 style byte-level BPE, Llama 2 style byte-fallback BPE with Prepend/Replace,
// Mistral style with Metaspace), plus round trips, loading errors and long inputs.
#include "scheduler_service/tokenizer/tokenizer.h"

#include <sys/resource.h>

#include <string>
#include <thread>
#include <vector>

#include "common/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "scheduler_service/tokenizer/unicode_normalization.h"
#include "tests/unit/scheduler_service/tokenizer/test_data.h"

namespace llm {
namespace {

using ::llm::testing::HexToBytes;
using ::llm::testing::LoadTokenizer;
using ::llm::testing::ReadDataFile;
using ::llm::testing::ReadJson;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

class FixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureTest, EncodeMatchesHuggingFace) {
  auto tok = LoadTokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  const auto fixtures = ReadJson(GetParam() + "/fixtures.json");
  ASSERT_GT(fixtures["encode"].size(), 20u);
  for (const auto& c : fixtures["encode"]) {
    const std::string text = HexToBytes(c["bytes_hex"]);
    SCOPED_TRACE("text: " + Utf8Lossy(text));
    EXPECT_THAT(tok->Encode(text, /*add_special_tokens=*/true),
                ElementsAreArray(c["ids_with_special"].get<std::vector<TokenId>>()));
    EXPECT_THAT(tok->Encode(text, /*add_special_tokens=*/false),
                ElementsAreArray(c["ids_without_special"].get<std::vector<TokenId>>()));
  }
}

TEST_P(FixtureTest, DecodeOfEncodedTextMatchesHuggingFace) {
  auto tok = LoadTokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  const auto fixtures = ReadJson(GetParam() + "/fixtures.json");
  for (const auto& c : fixtures["encode"]) {
    const auto ids = c["ids_with_special"].get<std::vector<TokenId>>();
    SCOPED_TRACE("text: " + Utf8Lossy(HexToBytes(c["bytes_hex"])));
    EXPECT_EQ(tok->Decode(ids, /*skip_special_tokens=*/false), c["decoded"].get<std::string>());
    EXPECT_EQ(tok->Decode(ids, /*skip_special_tokens=*/true), c["decoded_skip"].get<std::string>());
  }
}

TEST_P(FixtureTest, DecodeOfBrokenBytesAndSpecialTokensMatchesHuggingFace) {
  auto tok = LoadTokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  const auto cases = ReadJson(GetParam() + "/fixtures.json")["decode"];
  ASSERT_GE(cases.size(), 5u);
  for (const auto& c : cases) {
    const auto ids = c["ids"].get<std::vector<TokenId>>();
    SCOPED_TRACE("ids: " + c["ids"].dump());
    EXPECT_EQ(tok->Decode(ids, false), c["text"].get<std::string>());
    EXPECT_EQ(tok->Decode(ids, true), c["text_skip"].get<std::string>());
  }
}

// Decode(Encode(text)) gives the text back for ASCII, CJK, emoji (with ZWJ sequences, skin
// tones and flags) and combining marks; for Llama 2 style the leading space the normalizer
// adds is stripped again.
TEST_P(FixtureTest, MultilingualRoundTrip) {
  auto tok = LoadTokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  const std::vector<std::string> texts = {
      "Plain ASCII, with punctuation: (a+b)*c != d; it's \"quoted\".",
      "中文：我们今天去公园散步。日本語、한국어 텍스트。",
      "Emoji 👨‍👩‍👧‍👦 family, 👍🏽 tone, 🇯🇵 flag, 🦩🪐🧬 rare "
      "ones.",
      "Combining: e\u0301 a\u0300 Z\u0351\u0352a\u0357 \u0915\u094d\u0937 \u0e2a\u0e27\u0e31",
      "Mixed\tcontrol\nlines\r\n  and   spaces   ",
  };
  // Qwen2 style normalizes to NFC first: decomposed marks come back composed.
  const bool nfc = GetParam() == "qwen2_style";
  for (const std::string& text : texts) {
    const std::vector<TokenId> ids = tok->Encode(text, /*add_special_tokens=*/true);
    EXPECT_EQ(tok->Decode(ids, /*skip_special_tokens=*/true), nfc ? ToNfc(text) : text);
  }
  std::string all;
  for (const auto& t : texts) all += t + "\n";
  EXPECT_EQ(tok->Decode(tok->Encode(all, false), true), nfc ? ToNfc(all) : all);
}

// Invalid UTF-8 is encoded as its lossy repair (one U+FFFD per invalid sequence).
TEST_P(FixtureTest, InvalidUtf8IsEncodedAsItsRepair) {
  auto tok = LoadTokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  for (const std::string& bad : {std::string("ok \xff\xfe end"), std::string("\xe4\xbd"),
                                 std::string("a\xf0\x9f\x98 b"), std::string("\xed\xa0\x80")}) {
    const std::vector<TokenId> ids = tok->Encode(bad, false);
    EXPECT_EQ(ids, tok->Encode(Utf8Lossy(bad), false));
    const std::string decoded = tok->Decode(ids, true);
    EXPECT_TRUE(IsValidUtf8(decoded));
    EXPECT_THAT(decoded, HasSubstr(std::string(kReplacementChar)));
  }
}

// Inputs of 1 MB (one long word, whitespace, CJK, random bytes, English) encode and decode
// back. A quadratic merge loop or regex would not finish within the test's timeout.
TEST_P(FixtureTest, LongInputsRoundTrip) {
  auto tok = LoadTokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  constexpr size_t kSize = 1 << 20;
  std::string english;
  std::string sample = ReadDataFile("english_sample.txt");
  sample.erase(0, sample.find_first_not_of(" \n"));  // the license title is indented
  while (english.size() < kSize) english += sample;
  std::string cjk;
  while (cjk.size() < kSize) cjk += "我们今天去公园散步天气很好";
  std::string random(kSize, '\0');
  uint64_t state = 42;
  for (char& c : random) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    c = static_cast<char>(state >> 56);
    if (c == '<') c = 'x';  // no special tokens by chance
  }
  const std::vector<std::string> inputs = {std::string(kSize, 'a'),
                                           std::string(kSize, ' '),
                                           std::string(kSize, '\n'),
                                           cjk,
                                           random,
                                           english};
  for (const std::string& input : inputs) {
    // Text that starts with a space gets no extra "▁" from a Metaspace pre-tokenizer, and the
    // decoder drops one leading space (as the Hugging Face library does), so leading spaces
    // do not survive a Mistral or Metaspace style round trip.
    const bool metaspace = GetParam() == "mistral_style" || GetParam() == "metaspace_style";
    if (metaspace && input[0] == ' ') continue;
    const std::vector<TokenId> ids = tok->Encode(input, false);
    EXPECT_LE(ids.size(), input.size() * 3);  // at most one token per byte of the repair
    const std::string expected =
        GetParam() == "qwen2_style" ? ToNfc(Utf8Lossy(input)) : Utf8Lossy(input);
    const std::string decoded = tok->Decode(ids, true);
    // Llama 2 style strips the one space its normalizer prepended.
    EXPECT_TRUE(decoded == expected) << "decoded " << decoded.size() << " bytes of "
                                     << expected.size() << ", first 40: " << decoded.substr(0, 40);
  }
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  EXPECT_LT(usage.ru_maxrss, 2L * 1024 * 1024) << "peak RSS in KiB";
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, FixtureTest,
                         ::testing::Values("llama3_style", "llama2_style", "mistral_style",
                                           "metaspace_style", "qwen2_style"));

TEST(TokenizerTest, SpecialTokenIdsComeFromTheConfigs) {
  auto llama3 = LoadTokenizer("llama3_style");
  ASSERT_NE(llama3, nullptr);
  const auto bos = llama3->TokenToId("<|begin_of_text|>");
  ASSERT_TRUE(bos.has_value());
  EXPECT_EQ(llama3->bos_token_id(), bos);
  EXPECT_TRUE(llama3->add_bos_token());
  // generation_config.json lists two eos ids.
  EXPECT_THAT(llama3->eos_token_ids(), ElementsAreArray({*llama3->TokenToId("<|end_of_text|>"),
                                                         *llama3->TokenToId("<|eot_id|>")}));
  EXPECT_TRUE(llama3->IsSpecialToken(*bos));
  EXPECT_FALSE(llama3->IsSpecialToken(*llama3->TokenToId("<tool_call>")));
  EXPECT_EQ(llama3->Encode("hi", true).front(), *bos);
  EXPECT_NE(llama3->Encode("hi", false).front(), *bos);

  // Qwen2 style: no bos token at all, two eos ids, nothing added to the text.
  auto qwen2 = LoadTokenizer("qwen2_style");
  ASSERT_NE(qwen2, nullptr);
  EXPECT_FALSE(qwen2->bos_token_id().has_value());
  EXPECT_FALSE(qwen2->add_bos_token());
  EXPECT_THAT(qwen2->eos_token_ids(), ElementsAreArray({*qwen2->TokenToId("<|im_end|>"),
                                                        *qwen2->TokenToId("<|endoftext|>")}));
  EXPECT_EQ(qwen2->Encode("hi", true), qwen2->Encode("hi", false));

  auto llama2 = LoadTokenizer("llama2_style");
  ASSERT_NE(llama2, nullptr);
  EXPECT_EQ(llama2->bos_token_id(), llama2->TokenToId("<s>"));
  EXPECT_THAT(llama2->eos_token_ids(), ElementsAreArray({*llama2->TokenToId("</s>")}));
  EXPECT_EQ(llama2->IdToToken(*llama2->TokenToId("<0x0A>")), "<0x0A>");
  EXPECT_GE(llama2->vocab_size(), 2500);
}

// Tokenizer::PreTokenize shows the words the model gets: here those of the Llama 3 split
// regex and byte-level mapping, as the Hugging Face library's pre_tokenize_str gives them.
TEST(TokenizerTest, PreTokenizeShowsTheModelsWords) {
  auto tok = LoadTokenizer("llama3_style");
  ASSERT_NE(tok, nullptr);
  const auto fixtures = ReadJson("pretokenize_fixtures.json")["llama3"]["cases"];
  ASSERT_FALSE(fixtures.empty());
  for (const auto& c : fixtures) {
    EXPECT_EQ(tok->PreTokenize(c["text"].get<std::string>()),
              c["pieces"].get<std::vector<std::string>>());
  }
}

// Without a post_processor, add_bos_token from tokenizer_config.json decides.
TEST(TokenizerTest, AddBosTokenFromConfigWithoutPostProcessor) {
  auto spec = ReadJson("llama2_style/tokenizer.json");
  spec["post_processor"] = nullptr;
  const std::string config_on = R"({"bos_token": "<s>", "add_bos_token": true})";
  const std::string config_off = R"({"bos_token": "<s>", "add_bos_token": false})";
  auto on = Tokenizer::FromJson(spec.dump(), config_on);
  auto off = Tokenizer::FromJson(spec.dump(), config_off);
  ASSERT_TRUE(on.ok()) << on.status();
  ASSERT_TRUE(off.ok()) << off.status();
  const TokenId bos = *(*on)->TokenToId("<s>");
  EXPECT_EQ((*on)->Encode("Hello", true).front(), bos);
  EXPECT_NE((*off)->Encode("Hello", true).front(), bos);
  EXPECT_EQ((*on)->Encode("Hello", false), (*off)->Encode("Hello", true));
}

// RobertaProcessing / BertProcessing put their cls token before and sep token after.
TEST(TokenizerTest, ClsSepPostProcessors) {
  auto spec = ReadJson("llama3_style/tokenizer.json");
  auto plain = Tokenizer::FromJson(spec.dump());
  ASSERT_TRUE(plain.ok()) << plain.status();
  const TokenId cls = *(*plain)->TokenToId("<|begin_of_text|>");
  const TokenId sep = *(*plain)->TokenToId("<|end_of_text|>");
  for (const std::string& type : {"RobertaProcessing", "BertProcessing"}) {
    spec["post_processor"] = {
        {"type", type}, {"cls", {"<|begin_of_text|>", cls}}, {"sep", {"<|end_of_text|>", sep}}};
    auto tok = Tokenizer::FromJson(spec.dump());
    ASSERT_TRUE(tok.ok()) << tok.status();
    std::vector<TokenId> expected = {cls};
    for (const TokenId id : (*tok)->Encode("a b", false)) expected.push_back(id);
    expected.push_back(sep);
    EXPECT_EQ((*tok)->Encode("a b", true), expected) << type;
  }
}

// An unsupported component fails to load with an error that names it.
// transformers writes "" for a BPE model without a continuing-subword prefix or an end-of-word
// suffix (SmolLM2's, GPT-2's, Qwen2's tokenizer.json as transformers saves them); HF tokenizers
// reads "" as none, and so do we: the same ids as with null.
TEST(TokenizerTest, EmptySubwordPrefixAndSuffixMeanNone) {
  const auto base = ReadJson("llama3_style/tokenizer.json");
  nlohmann::json spec = base;
  spec["model"]["continuing_subword_prefix"] = "";
  spec["model"]["end_of_word_suffix"] = "";
  auto with_empty = Tokenizer::FromJson(spec.dump());
  ASSERT_TRUE(with_empty.ok()) << with_empty.status();
  auto plain = Tokenizer::FromJson(base.dump());
  ASSERT_TRUE(plain.ok()) << plain.status();
  for (const char* text : {"Hello world", "The capital of France is Paris.", "  tabs\tand 123"}) {
    EXPECT_EQ((*with_empty)->Encode(text), (*plain)->Encode(text)) << text;
  }
}

TEST(TokenizerTest, UnsupportedComponentsFailWithTheirName) {
  const auto base = ReadJson("llama3_style/tokenizer.json");
  struct Case {
    std::string path;
    nlohmann::json value;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"/normalizer", {{"type", "NFKD"}}, "NFKD"},
      {"/normalizer", {{"type", "Sequence"}, {"normalizers", {{{"type", "NFKC"}}}}}, "NFKC"},
      {"/normalizer", {{"type", "Precompiled"}, {"precompiled_charsmap", "x"}}, "Precompiled"},
      {"/pre_tokenizer", {{"type", "Whitespace"}}, "Whitespace"},
      {"/pre_tokenizer", {{"type", "BertPreTokenizer"}}, "BertPreTokenizer"},
      {"/decoder", {{"type", "WordPiece"}, {"prefix", "##"}}, "WordPiece"},
      {"/decoder", {{"type", "CTC"}}, "CTC"},
      {"/model/type", "Unigram", "Unigram"},
      {"/model/continuing_subword_prefix", "##", "continuing_subword_prefix"},
      {"/model/end_of_word_suffix", "</w>", "end_of_word_suffix"},
      {"/post_processor", {{"type", "Weird"}}, "Weird"},
  };
  for (const Case& c : cases) {
    nlohmann::json spec = base;
    spec[nlohmann::json::json_pointer(c.path)] = c.value;
    auto tok = Tokenizer::FromJson(spec.dump());
    ASSERT_FALSE(tok.ok()) << c.path;
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(tok.status().message()), HasSubstr(c.expected));
  }
}

TEST(TokenizerTest, MissingDirectoryAndBadJsonFail) {
  auto missing = Tokenizer::FromDirectory("/nonexistent/model");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  auto bad = Tokenizer::FromJson("{not json");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  auto merge = ReadJson("llama3_style/tokenizer.json");
  merge["model"]["merges"].push_back({"not_in", "vocab_at_all"});
  auto bad_merge = Tokenizer::FromJson(merge.dump());
  EXPECT_THAT(std::string(bad_merge.status().message()), HasSubstr("not_in"));
  auto wrong_type = ReadJson("llama3_style/tokenizer.json");
  wrong_type["added_tokens"][0]["id"] = "three";
  EXPECT_EQ(Tokenizer::FromJson(wrong_type.dump()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Concurrent encodes share the word cache and agree with a single-threaded encode.
TEST(TokenizerTest, ConcurrentEncodesAgree) {
  auto tok = LoadTokenizer("llama3_style");
  ASSERT_NE(tok, nullptr);
  const std::string text = ReadDataFile("english_sample.txt").substr(0, 20000);
  const std::vector<TokenId> expected = tok->Encode(text, true);
  std::vector<std::vector<TokenId>> results(4);
  std::vector<std::thread> threads;
  for (auto& r : results) {
    threads.emplace_back([&tok, &text, &r] { r = tok->Encode(text, true); });
  }
  for (auto& t : threads) t.join();
  for (const auto& r : results) EXPECT_EQ(r, expected);
}

}  // namespace
}  // namespace llm
