#include "scheduler_service/tokenizer/stop_string_matcher.h"

#include <algorithm>
#include <utility>

#include "common/utf8.h"

namespace llm {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop, bool include_stop_str_in_output)
    : include_stop_(include_stop_str_in_output) {
  for (std::string& s : stop) {
    // Output text is valid UTF-8; a repaired stop string can only match at character
    // boundaries, so held-back text never splits a character.
    if (!s.empty()) stop_.push_back(IsValidUtf8(s) ? std::move(s) : Utf8Lossy(s));
  }
}

StopStringMatcher::Result StopStringMatcher::Feed(std::string_view text) {
  Result result;
  if (stopped_) return result;
  pending_.append(text);
  // Invariant: no stop string starts in text already released (its start would have been
  // held back), so searching the pending text is enough.
  size_t best_pos = std::string::npos;
  const std::string* best = nullptr;
  for (const std::string& s : stop_) {
    const size_t pos = pending_.find(s);
    if (pos == std::string::npos) continue;
    if (best == nullptr || pos < best_pos || (pos == best_pos && s.size() < best->size())) {
      best_pos = pos;
      best = &s;
    }
  }
  if (best != nullptr) {
    stopped_ = true;
    result.stopped = true;
    result.stop_string = *best;
    result.text = pending_.substr(0, best_pos + (include_stop_ ? best->size() : 0));
    pending_.clear();
    return result;
  }
  size_t hold = 0;
  for (const std::string& s : stop_) {
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k) {
      if (std::string_view(pending_).ends_with(std::string_view(s).substr(0, k))) {
        hold = k;
        break;
      }
    }
  }
  result.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return result;
}

std::string StopStringMatcher::Finish() {
  if (stopped_) return "";
  return std::exchange(pending_, "");
}

}  // namespace llm
