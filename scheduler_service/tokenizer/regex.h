// A compiled PCRE2 pattern in Unicode mode (PCRE2_UTF | PCRE2_UCP), JIT-compiled when the
// platform allows, for the split patterns of tokenizer.json files (GPT-2, Llama 3, Qwen2
// use \p{L}, \p{N}, (?i:...) and lookahead, which PCRE2 supports as Oniguruma does).
// \s and \S mean Unicode's White_Space property and its complement, as in HF tokenizers
// (Oniguruma): PCRE2's \s also takes U+180E MONGOLIAN VOWEL SEPARATOR, which Unicode 6.3 moved
// out of White_Space, so Compile rewrites them as explicit classes (WithUnicodeWhiteSpace).
// Not matched to HF: characters added after the Unicode version of Debian's PCRE2 tables
// (\p{L}, \p{N} of newer letters and digits), which pre-tokenize differently.
// Immutable after Compile; FindAll is thread-safe. Owns the compiled code.
#ifndef LLM_SCHEDULER_SERVICE_TOKENIZER_REGEX_H_
#define LLM_SCHEDULER_SERVICE_TOKENIZER_REGEX_H_

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace llm {

// `pattern` with \s (outside and inside classes) and \S (outside classes) replaced by explicit
// classes of Unicode White_Space; \Q...\E quoted text untouched. \S inside a class is left
// to PCRE2 (no tokenizer pattern known to us uses it).
std::string WithUnicodeWhiteSpace(std::string_view pattern);

class Regex {
 public:
  // Fails with INVALID_ARGUMENT naming the pattern and PCRE2's message.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  // A pattern that matches `literal` exactly (searched with a plain string search).
  static absl::StatusOr<std::unique_ptr<Regex>> CompileLiteral(std::string_view literal);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The [start, end) byte ranges of the successive non-overlapping matches in `text`
  // (valid UTF-8). Like Oniguruma's find_iter, an empty match right after the previous
  // match is skipped.
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const;
  // The same matches, streamed: `fn(start, end)` for each, in order. `fn` may use other
  // Regex objects (even this one) on other text.
  void ForEachMatch(std::string_view text, absl::FunctionRef<void(size_t, size_t)> fn) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  std::string pattern_;
  std::optional<std::string> literal_;  // set by CompileLiteral
  void* code_ = nullptr;                // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_TOKENIZER_REGEX_H_
