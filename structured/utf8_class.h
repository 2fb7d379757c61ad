// Unicode character classes as byte-level grammar: the choice of the UTF-8 byte sequences of a
// set of codepoints. Only well-formed UTF-8 is matched (no surrogates, nothing past U+10FFFF,
// no overlong forms), so a grammar built from these classes also keeps the output valid UTF-8,
// and a token that ends inside a multi-byte character leaves the matcher inside that character.
#ifndef LLM_STRUCTURED_UTF8_CLASS_H_
#define LLM_STRUCTURED_UTF8_CLASS_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "structured/grammar.h"

namespace llm::structured {

constexpr uint32_t kMaxCodepoint = 0x10FFFF;

struct CodepointRange {
  uint32_t lo;
  uint32_t hi;  // inclusive
};

// One character whose codepoint is in `ranges` (negated: any codepoint not in them).
Expr Utf8Class(std::vector<CodepointRange> ranges, bool negated);

// Any one character (any valid UTF-8 sequence).
inline Expr AnyUtf8Char() { return Utf8Class({}, /*negated=*/true); }

// The UTF-8 encoding and decoding themselves (AppendUtf8, DecodeUtf8) are common/utf8.h's.

// Reads `digits` hex digits of `text` at *pos (an escape's \xHH, \uHHHH, \UHHHHHHHH) and
// advances *pos past them; -1 when fewer are there.
int32_t ReadHexDigits(std::string_view text, size_t* pos, int digits);

}  // namespace llm::structured

#endif  // LLM_STRUCTURED_UTF8_CLASS_H_
