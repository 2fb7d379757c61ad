// UTF-8 helpers for the tokenizer: validation, lossy repair and code point iteration.
// Stateless free functions; thread-safe.
#ifndef LLM_SCHEDULER_SERVICE_TOKENIZER_UTF8_H_
#define LLM_SCHEDULER_SERVICE_TOKENIZER_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

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
// The byte length of the UTF-8 character whose lead byte is `lead` (1 for a stray byte).
inline size_t Utf8CharLength(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? (lead < 0xC0 ? 1 : 2) : lead < 0xF0 ? 3 : 4;
}
void AppendUtf8(uint32_t code_point, std::string* out);

// Unicode White_Space (what Rust's char::is_whitespace answers).
bool IsUnicodeWhitespace(uint32_t code_point);

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_TOKENIZER_UTF8_H_
