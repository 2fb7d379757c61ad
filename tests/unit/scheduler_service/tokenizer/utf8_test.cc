// UTF-8 repair follows Unicode's "maximal subpart" practice, the one of Rust's
// from_utf8_lossy and Python's decode(errors="replace"), which the Hugging Face fixtures
// rely on: checked here by counting replacement characters per kind of damage.
#include "scheduler_service/tokenizer/utf8.h"

#include <string>

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

}  // namespace
}  // namespace llm
