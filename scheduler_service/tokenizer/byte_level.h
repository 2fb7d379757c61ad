// GPT-2's byte-level alphabet: each of the 256 byte values as one printable Unicode
// character (bytes_to_unicode), so that byte-level BPE vocabularies are text. Immutable
// tables built once; thread-safe.
#ifndef LLM_SCHEDULER_SERVICE_TOKENIZER_BYTE_LEVEL_H_
#define LLM_SCHEDULER_SERVICE_TOKENIZER_BYTE_LEVEL_H_

#include <string>
#include <string_view>

namespace llm {

// Appends the byte-level characters of the bytes of `text` to *out.
void AppendByteLevelChars(std::string_view text, std::string* out);

// Appends to *out the bytes that the byte-level characters of `token` stand for. Returns
// false, leaving *out as it was, when a character of `token` is not in the alphabet (then
// the Hugging Face decoder uses the token's own bytes).
bool AppendBytesOfByteLevelToken(std::string_view token, std::string* out);

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_TOKENIZER_BYTE_LEVEL_H_
