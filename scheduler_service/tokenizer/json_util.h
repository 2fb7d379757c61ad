// Small helpers to read tokenizer.json fields with errors that name the field. Internal to
// the tokenizer library.
#ifndef LLM_SCHEDULER_SERVICE_TOKENIZER_JSON_UTIL_H_
#define LLM_SCHEDULER_SERVICE_TOKENIZER_JSON_UTIL_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "scheduler_service/tokenizer/regex.h"
#include "scheduler_service/tokenizer/string_view_compat.h"

namespace llm::json_util {

// obj[key] as a string; `fallback` when absent or null.
inline absl::StatusOr<std::string> GetString(const nlohmann::json& obj, std::string_view key,
                                             std::string_view what,
                                             std::string_view fallback = "") {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::string(fallback);
  if (!it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(what), ": field '", ToAbsl(key), "' is not a string"));
  }
  return it->get<std::string>();
}

inline bool GetBool(const nlohmann::json& obj, std::string_view key, bool fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_boolean()) return fallback;
  return it->get<bool>();
}

// A `pattern` object: {"String": "..."} or {"Regex": "..."}, compiled.
inline absl::StatusOr<std::unique_ptr<Regex>> GetPattern(const nlohmann::json& obj,
                                                         std::string_view what) {
  auto it = obj.find("pattern");
  if (it == obj.end() || !it->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(what), ": missing 'pattern'"));
  }
  if (auto s = it->find("String"); s != it->end() && s->is_string()) {
    return Regex::CompileLiteral(s->get<std::string>());
  }
  if (auto r = it->find("Regex"); r != it->end() && r->is_string()) {
    return Regex::Compile(r->get<std::string>());
  }
  return absl::InvalidArgumentError(
      absl::StrCat(ToAbsl(what), ": 'pattern' must be {\"String\": ...} or {\"Regex\": ...}"));
}

// The "type" of a component, for error messages and dispatch.
inline std::string TypeOf(const nlohmann::json& spec) {
  auto it = spec.find("type");
  return it != spec.end() && it->is_string() ? it->get<std::string>() : std::string("<none>");
}

}  // namespace llm::json_util

#endif  // LLM_SCHEDULER_SERVICE_TOKENIZER_JSON_UTIL_H_
