// UTF-8 repair follows Unicode's "maximal subpart" practice, the one of Rust's
// from_utf8_lossy and Python's decode(errors="replace"), which the Hugging Face fixtures
// rely on: checked here by counting replacement characters per kind of damage.
#include "common/utf8.h"

#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"

namespace llm {
namespace {

int CountReplacements(const std::string& s) {
  int n = 0;
  for (size_t pos = s.find(kReplacementChar); pos != std::string::npos;
       pos = s.find(kReplacementChar, pos + 1)) {
    ++n;
  }
  return n;
}

TEST(Utf8Test, ValidTextIsUnchanged) {
  const std::string text = "ascii 中文 👨‍👩‍👧 e\u0301 \U0010FFFF";
  EXPECT_TRUE(IsValidUtf8(text));
  EXPECT_EQ(Utf8Lossy(text), text);
}

TEST(Utf8Test, OneReplacementPerMaximalSubpart) {
  // A truncated 4-byte sequence is one subpart; so is a truncated 3-byte one.
  EXPECT_EQ(CountReplacements(Utf8Lossy("\xF0\x9F\x98")), 1);
  EXPECT_EQ(CountReplacements(Utf8Lossy("\xE4\xBD")), 1);
  // Overlongs, surrogates and stray continuation bytes: one per byte.
  EXPECT_EQ(CountReplacements(Utf8Lossy("\xC0\xAF")), 2);
  EXPECT_EQ(CountReplacements(Utf8Lossy("\xED\xA0\x80")), 3);
  EXPECT_EQ(CountReplacements(Utf8Lossy("\x80\x80")), 2);
  EXPECT_EQ(Utf8Lossy("a\xFF"
                      "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(ValidUtf8Prefix("abc\xE4\xBD"), 3u);
}

TEST(Utf8Test, SplitUtf8CharsKeepsEachCharacterWhole) {
  EXPECT_EQ(SplitUtf8Chars("a\u00e9\u4e2d\U0001F600"),
            (std::vector<std::string_view>{"a", "\u00e9", "\u4e2d", "\U0001F600"}));
  EXPECT_TRUE(SplitUtf8Chars("").empty());
}

TEST(Utf8Test, SplitUtf8CharsGivesIllFormedBytesBackWhole) {
  // Stray continuation bytes and 0xF8-0xFF stand alone; a sequence cut short by the end stays
  // one piece; a lead byte takes its length in bytes, whatever they are.
  EXPECT_EQ(SplitUtf8Chars("\x80\xF8x\xFF"),
            (std::vector<std::string_view>{"\x80", "\xF8", "x", "\xFF"}));
  EXPECT_EQ(SplitUtf8Chars("ab\xE4\xBD"), (std::vector<std::string_view>{"a", "b", "\xE4\xBD"}));
  EXPECT_EQ(SplitUtf8Chars("\xE9 xy"), (std::vector<std::string_view>{"\xE9 x", "y"}));
  std::string joined;
  for (std::string_view ch : SplitUtf8Chars("\xC3(\xF0\x9F\x98\xFE\x80")) joined += ch;
  EXPECT_EQ(joined, "\xC3(\xF0\x9F\x98\xFE\x80");
}

TEST(Utf8Test, Utf8CharCodePointDecodesOneCharacter) {
  EXPECT_EQ(Utf8CharCodePoint("a"), 0x61u);
  EXPECT_EQ(Utf8CharCodePoint("\u00e9"), 0xE9u);
  EXPECT_EQ(Utf8CharCodePoint("\u3000"), 0x3000u);
  EXPECT_EQ(Utf8CharCodePoint("\U0001F600"), 0x1F600u);
  // A lone lead byte is its own value: 0xC9 masked as the lead of a pair would be U+0009, a
  // tab, and text cut after it would lose it to a strip.
  EXPECT_EQ(Utf8CharCodePoint("\xC9"), 0xC9u);
  EXPECT_EQ(Utf8CharCodePoint("\xF8"), 0xF8u);
}

// The grammar engine's decoder (regex and GBNF literals, token texts): a well-formed character
// gives its code point; anything else is -1 and costs exactly one byte, so a scan goes on.
TEST(Utf8Test, DecodeUtf8AcceptsOnlyWellFormedCharacters) {
  const std::string_view text = "a\u00e9\u3000\U0001F600";
  size_t pos = 0;
  std::vector<int32_t> cps;
  while (pos < text.size()) cps.push_back(DecodeUtf8(text, &pos));
  EXPECT_EQ(cps, (std::vector<int32_t>{0x61, 0xE9, 0x3000, 0x1F600}));
  EXPECT_EQ(pos, text.size());

  for (std::string_view bad : {"\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80",
                               "\xF8\x88\x80\x80", "\x80", "\xE4\xBD"}) {
    size_t p = 0;
    EXPECT_EQ(DecodeUtf8(bad, &p), -1) << "at " << testing::PrintToString(std::string(bad));
    EXPECT_EQ(p, 1u);
  }
}

TEST(Utf8Test, Utf8EncodedLengthMatchesAppendUtf8) {
  for (uint32_t cp : {0x0u, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xFFFFu, 0x10000u, 0x10FFFFu}) {
    std::string bytes;
    AppendUtf8(cp, &bytes);
    EXPECT_EQ(Utf8EncodedLength(cp), static_cast<int>(bytes.size())) << cp;
    size_t pos = 0;
    EXPECT_EQ(DecodeUtf8(bytes, &pos), static_cast<int32_t>(cp));
  }
}

}  // namespace
}  // namespace llm
