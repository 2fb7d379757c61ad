// Tokenizer::FromGguf: the tiny GGUF (tools/models/make_tiny_gguf.py: fortune-llama's
// tokenizer.json written in GGUF's gpt2 form) encodes and decodes as the tokenizer.json does;
// SmolLM2-135M-Instruct's GGUF (tools/models/fetch_smollm2.sh) as the Hugging Face tokenizers
// library does (fixture by tools/models/make_smollm2_tokenizer_fixture.py).
#include "scheduler_service/tokenizer/gguf_tokenizer.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "scheduler_service/tokenizer/tokenizer.h"
#include "tests/testing/gguf_builder.h"
#include "tests/testing/test_data.h"

namespace llm {
namespace {

const std::string kData = LLM_TEST_DATA_DIR;

const std::vector<std::string> kTexts = {
    "The capital of France is",
    "Hello, world!",
    "  leading spaces and trailing   ",
    "tabs\tand\nnewlines\r\n\n\nmixed",
    "1234567890 and 3.14159 and 1,000,000",
    "I'm sure they'll say it's what we've done, didn't we?",
    "UPPER lower MiXeD CaSe",
    "naïve café résumé coöperate",
    "日本語のテキストです。",
    "Русский текст с пунктуацией.",
    "emoji 😀🎉👍🏽 and flags 🇫🇷",
    "<|begin_of_text|>special<|end_of_text|> tokens <|end_of_text|>",
    "def foo(x):\n    return x ** 2  # square\n",
    "https://example.com/path?query=1&b=2#frag",
    "",
    " ",
    "\n\n",
    "12345678901234567890",
    "a\u0301 e\u0300 (combining)",
    "\xff\xfe invalid utf-8",
};

TEST(GgufTokenizerTest, TinyGgufEqualsTokenizerJson) {
  auto hf = Tokenizer::FromDirectory(kData + "/../../models/fortune-llama");
  ASSERT_TRUE(hf.ok()) << hf.status();
  auto gg = Tokenizer::FromDirectory(kData + "/models/fortune-llama-f16.gguf");
  ASSERT_TRUE(gg.ok()) << gg.status();
  EXPECT_EQ((*gg)->vocab_size(), (*hf)->vocab_size());
  EXPECT_EQ((*gg)->bos_token_id(), (*hf)->bos_token_id());
  EXPECT_EQ((*gg)->eos_token_ids(), (*hf)->eos_token_ids());
  EXPECT_EQ((*gg)->add_bos_token(), (*hf)->add_bos_token());
  EXPECT_TRUE((*gg)->IsSpecialToken(0));
  for (const std::string& text : kTexts) {
    for (bool special : {false, true}) {
      const std::vector<TokenId> want = (*hf)->Encode(text, special);
      const std::vector<TokenId> got = (*gg)->Encode(text, special);
      EXPECT_EQ(got, want) << "\"" << text << "\" add_special_tokens=" << special;
      EXPECT_EQ((*gg)->Decode(got), (*hf)->Decode(want)) << text;
      EXPECT_EQ((*gg)->Decode(got, true), (*hf)->Decode(want, true)) << text;
    }
  }
}

std::string SmolLm2Path() { return testing::CachedModelPath("SmolLM2-135M-Instruct.Q4_1.gguf"); }

TEST(GgufTokenizerTest, SmolLm2EqualsHuggingFaceTokenizers) {
  const std::string path = SmolLm2Path();
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << path << " is not there (tools/models/fetch_smollm2.sh fetches it)";
  }
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto tok = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 49152);
  EXPECT_EQ((*tok)->bos_token_id(), 1);
  EXPECT_EQ((*tok)->eos_token_ids(), std::vector<TokenId>{2});
  EXPECT_FALSE((*tok)->add_bos_token());
  absl::StatusOr<std::string> tmpl = (*file)->GetString("tokenizer.chat_template");
  ASSERT_TRUE(tmpl.ok());
  EXPECT_NE(tmpl->find("<|im_start|>"), std::string::npos);
  const GgufChatInfo chat = GgufChatInfoOf(**file);
  EXPECT_EQ(chat.chat_template, *tmpl);
  EXPECT_EQ(chat.bos_token, "<|im_start|>");
  EXPECT_EQ(chat.eos_token, "<|im_end|>");

  std::ifstream in(kData + "/gguf/smollm2_tokenizer_ids.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json fixture = nlohmann::json::parse(ss.str());
  int cases = 0;
  for (const auto& c : fixture["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const std::vector<TokenId> want = c["ids"].get<std::vector<TokenId>>();
    const std::vector<TokenId> got = (*tok)->Encode(text, false);
    EXPECT_EQ(got, want) << "\"" << text << "\"";
    EXPECT_EQ((*tok)->Decode(got), c["decoded"].get<std::string>()) << text;
    ++cases;
  }
  EXPECT_EQ(cases, 50);
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// tokenizer.ggml.model "llama" (SentencePiece-style, no merges in the file): the ids and
// decodes of HF tokenizers built as transformers builds it from such a file
// (tools/models/make_spm_gguf_tokenizer.py).
TEST(GgufTokenizerTest, SentencePieceStyleEqualsHuggingFaceTokenizers) {
  auto file = GgufFile::Open(kData + "/gguf/llama2-style-tokenizer.gguf");
  ASSERT_TRUE(file.ok()) << file.status();
  auto tok = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->bos_token_id(), 1);
  EXPECT_TRUE((*tok)->add_bos_token());
  const nlohmann::json fixture = ReadJson(kData + "/gguf/llama2_style_gguf_ids.json");
  int cases = 0;
  for (const auto& c : fixture["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const std::vector<TokenId> got = (*tok)->Encode(text, false);
    EXPECT_EQ(got, c["ids"].get<std::vector<TokenId>>()) << "\"" << text << "\"";
    EXPECT_EQ((*tok)->Encode(text, true), c["ids_special"].get<std::vector<TokenId>>()) << text;
    EXPECT_EQ((*tok)->Decode(got), c["decoded"].get<std::string>()) << text;
    ++cases;
  }
  EXPECT_EQ(cases, 18);
}

// A GGUF image with the given tokenizer.ggml.model and .pre and two tokens.
std::vector<std::byte> TinyTokenizerGguf(const std::string& model, const std::string& pre) {
  testing::GgufBuilder g;
  g.Header(3, 0, 4).KeyString("tokenizer.ggml.model", model).KeyString("tokenizer.ggml.pre", pre);
  g.KeyStrings("tokenizer.ggml.tokens", {"a", "b", "ab"});
  g.KeyStrings("tokenizer.ggml.merges", {"a b"});
  return g.b;
}

TEST(GgufTokenizerTest, UnsupportedKindsAreNamed) {
  std::vector<std::byte> image = TinyTokenizerGguf("bert", "default");
  auto f = GgufFile::FromBuffer(image, "t.gguf");
  ASSERT_TRUE(f.ok()) << f.status();
  auto tok = Tokenizer::FromGguf(**f);
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(tok.status().message()), ::testing::HasSubstr("\"bert\""));
  image = TinyTokenizerGguf("gpt2", "chameleon");
  f = GgufFile::FromBuffer(image, "t.gguf");
  tok = Tokenizer::FromGguf(**f);
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(tok.status().message()), ::testing::HasSubstr("\"chameleon\""));
  for (const char* pre : {"gpt-2", "olmo"}) {  // llama.cpp splits OLMo's as GPT-2's
    image = TinyTokenizerGguf("gpt2", pre);
    f = GgufFile::FromBuffer(image, "t.gguf");
    tok = Tokenizer::FromGguf(**f);
    ASSERT_TRUE(tok.ok()) << pre << ": " << tok.status();
    EXPECT_EQ((*tok)->Encode("ab", false), std::vector<TokenId>{2}) << pre;
  }
}

}  // namespace
}  // namespace llm
