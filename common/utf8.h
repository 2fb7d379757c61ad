// UTF-8 helpers for the tokenizer, the chat templates and the grammar engine (structured/):
// validation, lossy repair, code point iteration and splitting into characters.
// Stateless free functions; thread-safe.
#ifndef LLM_COMMON_UTF8_H_
#define LLM_COMMON_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace llm {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// The length of the longest prefix of `s` that is valid UTF-8 (all of it when valid).
size_t ValidUtf8Prefix(std::string_view s);
inline bool IsValidUtf8(std::string_view s) { return ValidUtf8Prefix(s) == s.size(); }

// `s` with each invalid sequence replaced by U+FFFD, one per maximal subpart of an
// ill-formed sequence: the policy of Rust's String::from_utf8_lossy and Python's
// bytes.decode("utf-8", "replace") (Unicode's recommended practice).
std::string Utf8Lossy(std::string_view s);

// Decodes the code point starting at s[*pos] (which must be valid UTF-8) and advances *pos.
uint32_t NextCodePoint(std::string_view s, size_t* pos);
// Decodes the character at s[*pos] and advances *pos past it when it is well-formed UTF-8 (by
// the rules of IsValidUtf8); otherwise returns -1 and advances one byte.
int32_t DecodeUtf8(std::string_view s, size_t* pos);
// The byte length of the UTF-8 character whose lead byte is `lead` (1 for a stray byte).
inline size_t Utf8CharLength(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? (lead < 0xC0 ? 1 : 2) : lead < 0xF0 ? 3 : 4;
}
// The byte length of the UTF-8 encoding of `code_point`.
inline int Utf8EncodedLength(uint32_t code_point) {
  return code_point < 0x80 ? 1 : code_point < 0x800 ? 2 : code_point < 0x10000 ? 3 : 4;
}
void AppendUtf8(uint32_t code_point, std::string* out);

// `s` split into its characters, each a view of its bytes: as long as its lead byte says
// (Utf8CharLength), cut short by the end of `s`. 0xF8-0xFF, which begin no sequence, stand alone.
// Ill-formed input splits by the same rule; the pieces always join back to `s`.
std::vector<std::string_view> SplitUtf8Chars(std::string_view s);
// The code point of one character of SplitUtf8Chars. One cut short decodes from the bytes it
// has, so a lone lead byte is its own value (0xC9 stays 0xC9 rather than becoming a tab).
uint32_t Utf8CharCodePoint(std::string_view ch);

// Unicode White_Space (what Rust's char::is_whitespace answers).
bool IsUnicodeWhitespace(uint32_t code_point);

}  // namespace llm

#endif  // LLM_COMMON_UTF8_H_
