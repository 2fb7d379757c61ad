// Debian's Abseil keeps its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW 0), so
// std::string_view has to be converted for absl::StrCat and heterogeneous hash lookups.
#ifndef LLM_SCHEDULER_SERVICE_TOKENIZER_STRING_VIEW_COMPAT_H_
#define LLM_SCHEDULER_SERVICE_TOKENIZER_STRING_VIEW_COMPAT_H_

#include <string_view>

#include "absl/strings/string_view.h"

namespace llm {

inline absl::string_view ToAbsl(std::string_view s) { return {s.data(), s.size()}; }

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_TOKENIZER_STRING_VIEW_COMPAT_H_
