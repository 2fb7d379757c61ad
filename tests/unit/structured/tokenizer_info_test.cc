// TokenToBytes and TokenizerInfo: token strings of byte-level and SentencePiece vocabularies to
// the bytes the tokenizer's decoder writes for them, and the sorted prefix order.
#include "structured/tokenizer_info.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/structured/test_util.h"

namespace llm::structured {
namespace {

TEST(TokenToBytesTest, ByteLevel) {
  EXPECT_EQ(*TokenToBytes("\xC4\xA0hello", VocabEncoding::kByteLevel), " hello");  // Ġhello
  EXPECT_EQ(*TokenToBytes("\xC4\x8A", VocabEncoding::kByteLevel), "\n");           // Ċ
  EXPECT_EQ(*TokenToBytes("\xC3\xA3\xC4\xA3", VocabEncoding::kByteLevel), "\xE3\x81");
  EXPECT_EQ(*TokenToBytes("{\"", VocabEncoding::kByteLevel), "{\"");
  EXPECT_FALSE(TokenToBytes("\xE2\x82\xAC", VocabEncoding::kByteLevel).ok());  // € is no byte
}

TEST(TokenToBytesTest, SentencePiece) {
  EXPECT_EQ(*TokenToBytes("\xE2\x96\x81hello", VocabEncoding::kSentencePiece), " hello");
  EXPECT_EQ(*TokenToBytes("<0x0A>", VocabEncoding::kSentencePiece), "\n");
  EXPECT_EQ(*TokenToBytes("<0xE2>", VocabEncoding::kSentencePiece), "\xE2");
  EXPECT_EQ(*TokenToBytes("<0xZZ>", VocabEncoding::kSentencePiece), "<0xZZ>");
  EXPECT_EQ(*TokenToBytes("a\xE2\x96\x81\xE2\x96\x81", VocabEncoding::kSentencePiece), "a  ");
}

// Each token's bytes, concatenated, are the text the ids decode to (valid UTF-8 texts), after
// `prefix`: the space a SentencePiece normalizer prepends, which its decoder strips again but a
// grammar sees as the model writes it.
void ExpectBytesMatchDecode(const std::string& path, VocabEncoding encoding,
                            const std::vector<std::string>& texts, const std::string& prefix = "") {
  absl::StatusOr<testing::Vocab> v = testing::LoadVocab(path, encoding);
  if (!v.ok()) GTEST_SKIP() << "no vocabulary at " << path << ": " << v.status();
  for (const std::string& text : texts) {
    std::string bytes;
    for (TokenId id : v->tokenizer->Encode(text, false)) bytes += v->info->token_bytes(id);
    EXPECT_EQ(v->tokenizer->Decode(v->tokenizer->Encode(text, false)), text);
    EXPECT_EQ(bytes, prefix + text);
  }
}

// If a test skips, its vocabulary was missing: a skip here would hide a broken test tokenizer.
void ExpectBytesMatchDecodeHere(const std::string& style, VocabEncoding encoding,
                                const std::vector<std::string>& texts,
                                const std::string& prefix = "") {
  const std::string path = llm::testing::TestDataDir() + "/tokenizer/" + style;
  absl::StatusOr<testing::Vocab> v = testing::LoadVocab(path, encoding);
  ASSERT_TRUE(v.ok()) << v.status();
  ExpectBytesMatchDecode(path, encoding, texts, prefix);
}

TEST(TokenizerInfoTest, ByteLevelBytesMatchDecodeOnSmolLM2) {
  ExpectBytesMatchDecode(testing::SmolLM2Path(), VocabEncoding::kByteLevel,
                         {"{\"name\": \"caf\xC3\xA9\", \"n\": [1, 2]}\n", "\xF0\x9F\x98\x80 \t x"});
}

TEST(TokenizerInfoTest, ByteLevelBytesMatchDecodeOnFortune) {
  ExpectBytesMatchDecode(testing::FortuneBpePath(), VocabEncoding::kByteLevel,
                         {"{\"a\": [true, null]}", "Hello world\n"});
}

TEST(TokenizerInfoTest, SentencePieceBytesMatchDecodeOnLlama2Style) {
  ExpectBytesMatchDecode(llm::testing::TestDataDir() + "/tokenizer/llama2_style",
                         VocabEncoding::kSentencePiece,
                         {"{\"a\": 1}", "caf\xC3\xA9 \xE2\x82\xAC\n x"}, /*prefix=*/" ");
}

// The spelling each committed tokenizer style is read with (from its decoder), and its bytes.
TEST(TokenizerInfoTest, SpellingReadFromTheDecoderOfEachTokenizerStyle) {
  const std::vector<std::string> texts = {"{\"a\": [1, 2.5e3, \"x y\"]}", "caf\xC3\xA9 ok\n"};
  ExpectBytesMatchDecodeHere("llama3_style", VocabEncoding::kByteLevel, texts);
  ExpectBytesMatchDecodeHere("qwen2_style", VocabEncoding::kByteLevel, texts);
  ExpectBytesMatchDecodeHere("mistral_style", VocabEncoding::kSentencePiece, texts, " ");
  ExpectBytesMatchDecodeHere("metaspace_style", VocabEncoding::kSentencePiece, texts, " ");
}

TEST(TokenizerInfoTest, SortedIdsShareLongestPrefixes) {
  auto info = TokenizerInfo::Create({"ab", "a", "", "b", "abc", "<s>", "ab"}, 8, {5}, {});
  ASSERT_TRUE(info.ok());
  // Empty and stop tokens are left out; equal bytes are ordered by id.
  EXPECT_EQ((*info)->sorted_ids(), (std::vector<int32_t>{1, 0, 6, 4, 3}));
  EXPECT_EQ((*info)->sorted_lcp(), (std::vector<int32_t>{0, 1, 2, 2, 0}));
  EXPECT_EQ((*info)->max_token_length(), 3);
  EXPECT_EQ((*info)->bitmask_words(), 1);
  EXPECT_TRUE((*info)->is_stop(5));
}

// SkipPrefix jumps past every token that starts with a dead prefix, and no further.
TEST(TokenizerInfoTest, SkipPrefixLeavesTheSubtree) {
  auto info = TokenizerInfo::Create({"a", "ab", "abc", "abd", "ac", "b", "abca"}, 7, {}, {});
  ASSERT_TRUE(info.ok());
  // Sorted: a ab abc abca abd ac b.
  ASSERT_EQ((*info)->sorted_ids(), (std::vector<int32_t>{0, 1, 2, 6, 3, 4, 5}));
  EXPECT_EQ((*info)->sorted_bytes(3), "abca");
  EXPECT_EQ((*info)->SkipPrefix(1, 2), 5u);  // past ab*: at "ac"
  EXPECT_EQ((*info)->SkipPrefix(2, 3), 4u);  // past abc*: at "abd"
  EXPECT_EQ((*info)->SkipPrefix(0, 1), 6u);  // past a*: at "b"
  EXPECT_EQ((*info)->SkipPrefix(6, 1), 7u);  // the end
}

TEST(TokenizerInfoTest, FromVocabDecodesNormalTokensOnly) {
  using Type = VocabToken::Type;
  auto info = TokenizerInfo::FromVocab({{"\xC4\xA0"
                                         "a",
                                         Type::kNormal},
                                        {"<|end|>", Type::kSpecial},
                                        {"Hello world", Type::kAddedText},
                                        {"", Type::kNormal}},
                                       VocabEncoding::kByteLevel, 5, {1});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ((*info)->token_bytes(0), " a");
  EXPECT_TRUE((*info)->is_stop(1));  // stop wins over special
  EXPECT_EQ((*info)->token_bytes(2), "Hello world");
  EXPECT_EQ((*info)->sorted_ids(), (std::vector<int32_t>{0, 2}));
  auto bad = TokenizerInfo::FromVocab({{"ok", Type::kNormal}, {"\xE2\x82\xAC", Type::kNormal}},
                                      VocabEncoding::kByteLevel, 2, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("token id 1"), std::string::npos);
}

TEST(TokenizerInfoTest, RefusesIdsOutOfRange) {
  EXPECT_FALSE(TokenizerInfo::Create({"a"}, 1, {1}, {}).ok());
  EXPECT_FALSE(TokenizerInfo::Create({"a"}, 1, {}, {-1}).ok());
  EXPECT_FALSE(TokenizerInfo::Create({"a", "b"}, 1, {}, {}).ok());
}

}  // namespace
}  // namespace llm::structured
