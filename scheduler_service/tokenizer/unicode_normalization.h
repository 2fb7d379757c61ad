// Unicode canonical normalization forms NFC and NFD (UAX #15), for tokenizer.json
// normalizers (Qwen2's is NFC). Tables come from Python's unicodedata
// (unicode_nfc_data.inc, written by tools/tokenizer/make_unicode_tables.py); the Hugging
// Face library may use a different Unicode version, which matters only for characters
// added in between. The compatibility forms NFKC / NFKD are not implemented.
// Stateless; thread-safe.
#ifndef LLM_SCHEDULER_SERVICE_TOKENIZER_UNICODE_NORMALIZATION_H_
#define LLM_SCHEDULER_SERVICE_TOKENIZER_UNICODE_NORMALIZATION_H_

#include <string>
#include <string_view>

namespace llm {

// `text` must be valid UTF-8. Text below U+0300 throughout is returned as is, quickly.
std::string ToNfc(std::string_view text);
std::string ToNfd(std::string_view text);

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_TOKENIZER_UNICODE_NORMALIZATION_H_
