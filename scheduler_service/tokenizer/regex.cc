#include "scheduler_service/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "scheduler_service/tokenizer/string_view_compat.h"

namespace llm {
namespace {

pcre2_code* Code(void* p) { return static_cast<pcre2_code*>(p); }

// Match data sized for the largest pattern seen by this thread, reused across calls.
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
thread_local std::unique_ptr<pcre2_match_data, MatchDataDeleter> tls_match_data;

std::string Pcre2Message(int error) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(error, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

std::string WithUnicodeWhiteSpace(std::string_view pattern) {
  // Unicode's White_Space property, which \s means to HF tokenizers (Oniguruma / Rust regex).
  constexpr std::string_view kSpace =
      "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
      "\\x{205F}\\x{3000}";
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  size_t class_start = 0;  // where the class's first member starts (a ']' there is literal)
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      if (e == 'Q') {  // \Q...\E: quoted, copied as is
        const size_t end = pattern.find("\\E", i + 2);
        const size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
        out.append(pattern.substr(i, stop - i));
        i = stop - 1;
      } else if (e == 's') {
        if (in_class) {
          out.append(kSpace);
        } else {
          absl::StrAppend(&out, "[", ToAbsl(kSpace), "]");
        }
        ++i;
      } else if (e == 'S' && !in_class) {
        absl::StrAppend(&out, "[^", ToAbsl(kSpace), "]");
        ++i;
      } else {
        out.append(pattern.substr(i, 2));
        ++i;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      class_start = out.size() + 1;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') {
        out.append("[^");
        ++i;
        class_start = out.size();
        continue;
      }
    } else if (in_class && c == ']' && out.size() != class_start) {
      in_class = false;
    }
    out.push_back(c);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  const std::string rewritten = WithUnicodeWhiteSpace(pattern);
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "regex '", ToAbsl(pattern), "' does not compile at ", offset, ": ", Pcre2Message(error)));
  }
  std::unique_ptr<Regex> regex(new Regex());
  regex->pattern_ = std::string(pattern);
  regex->code_ = code;
  regex->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return regex;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::CompileLiteral(std::string_view literal) {
  // \Q...\E quotes everything except a literal "\E", which is spliced in separately.
  std::string pattern;
  size_t pos = 0;
  while (pos <= literal.size()) {
    const size_t e = literal.find("\\E", pos);
    const std::string_view part =
        literal.substr(pos, e == std::string_view::npos ? std::string_view::npos : e - pos);
    if (!part.empty()) absl::StrAppend(&pattern, "\\Q", ToAbsl(part), "\\E");
    if (e == std::string_view::npos) break;
    absl::StrAppend(&pattern, "\\\\E");
    pos = e + 2;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Regex> regex, Compile(pattern));
  regex->literal_ = std::string(literal);
  return regex;
}

Regex::~Regex() { pcre2_code_free(Code(code_)); }

std::vector<std::pair<size_t, size_t>> Regex::FindAll(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  ForEachMatch(text, [&matches](size_t s, size_t e) { matches.emplace_back(s, e); });
  return matches;
}

void Regex::ForEachMatch(std::string_view text, absl::FunctionRef<void(size_t, size_t)> fn) const {
  if (literal_.has_value() && !literal_->empty()) {
    for (size_t pos = text.find(*literal_); pos != std::string_view::npos;
         pos = text.find(*literal_, pos + literal_->size())) {
      fn(pos, pos + literal_->size());
    }
    return;
  }
  if (tls_match_data == nullptr) tls_match_data.reset(pcre2_match_data_create(16, nullptr));
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  size_t last_match_end = std::string_view::npos;
  while (start <= text.size()) {
    // fn may run other matches on this thread: take the match data afresh each time and
    // read what is needed before calling it.
    pcre2_match_data* md = tls_match_data.get();
    int rc = jit_ ? pcre2_jit_match(Code(code_), subject, text.size(), start, 0, md, nullptr)
                  : PCRE2_ERROR_JIT_BADOPTION;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_JIT_BADOPTION) {
      rc = pcre2_match(Code(code_), subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
    }
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH, or a resource limit: the rest is no match
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t s = ov[0], e = ov[1];
    if (s == e && last_match_end == e) {
      // An empty match right after the previous one: step one character on.
      if (start >= text.size()) break;
      start += Utf8CharLength(static_cast<unsigned char>(text[start]));
      continue;
    }
    last_match_end = e;
    if (e == s) {
      start = e < text.size() ? e + Utf8CharLength(static_cast<unsigned char>(text[e]))
                              : text.size() + 1;
    } else {
      start = e;
    }
    fn(s, e);
  }
}

}  // namespace llm
