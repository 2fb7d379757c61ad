// Unicode character classes as byte-level grammar: the choice of the UTF-8 byte sequences of a
// set of codepoints. Only well-formed UTF-8 is matched (no surrogates, nothing past U+10FFFF,
// no overlong forms), so a grammar built from these classes also keeps the output valid UTF-8,
// and a token that ends inside a multi-byte character leaves the matcher inside that character.
#ifndef LLM_STRUCTURED_UTF8_CLASS_H_
#define LLM_STRUCTURED_UTF8_CLASS_H_

#include <cstdint>
#include <string>
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

// Appends the UTF-8 encoding of `cp` (cp <= kMaxCodepoint).
void AppendUtf8(uint32_t cp, std::string* out);

// Decodes one UTF-8 character of `text` at *pos and advances *pos past it. Returns -1 (and
// advances one byte) at an invalid sequence.
int32_t DecodeUtf8(std::string_view text, size_t* pos);

// Reads `digits` hex digits of `text` at *pos (an escape's \xHH, \uHHHH, \UHHHHHHHH) and
// advances *pos past them; -1 when fewer are there.
int32_t ReadHexDigits(std::string_view text, size_t* pos, int digits);

}  // namespace llm::structured

#endif  // LLM_STRUCTURED_UTF8_CLASS_H_
