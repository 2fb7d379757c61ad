// Text helpers of the output parsers (tool_call_parser.h, reasoning_parser.h), which read a
// model's output as it streams and must hold back text that may become a marker.
#ifndef LLM_SCHEDULER_SERVICE_HTTP_PARTIAL_MARKER_H_
#define LLM_SCHEDULER_SERVICE_HTTP_PARTIAL_MARKER_H_

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace llm::openai {

inline bool IsAsciiSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// The length of the longest suffix of `text` that is a proper prefix of `marker`: text that
// must wait for the next delta to tell whether the marker begins there.
inline size_t PartialMarker(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (marker.starts_with(text.substr(text.size() - n))) return n;
  }
  return 0;
}

}  // namespace llm::openai

#endif  // LLM_SCHEDULER_SERVICE_HTTP_PARTIAL_MARKER_H_
