// The `normalizer` of a tokenizer.json: Sequence, Prepend, Replace (String or Regex pattern),
// Strip, NFC and NFD. The compatibility forms NFKC and NFKD, Precompiled, Lowercase,
// BertNormalizer, StripAccents and Nmt are not implemented: loading one fails with an error
// that names it, rather than tokenizing differently from Hugging Face.
// Immutable after parsing; Normalize is thread-safe.
#ifndef LLM_SCHEDULER_SERVICE_TOKENIZER_NORMALIZER_H_
#define LLM_SCHEDULER_SERVICE_TOKENIZER_NORMALIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace llm {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites *text (valid UTF-8) in place.
  virtual void Normalize(std::string* text) const = 0;
};

// A null JSON value gives a null normalizer. Unknown or unsupported types fail with
// INVALID_ARGUMENT naming the type.
absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const nlohmann::json& spec);

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_TOKENIZER_NORMALIZER_H_
