// Finds stop strings in text that arrives in pieces (one sequence's output), as vLLM's
// stop checks do: a stop string may span pieces; text that could still be the start of a
// stop string is held back until it cannot; at a stop, the output ends before the stop
// string (or after it, with include_stop_str_in_output) and nothing after it is released.
// Among stop strings found, the one that starts first wins (then the shortest).
// Not thread-safe; one per sequence.
#ifndef LLM_SCHEDULER_SERVICE_TOKENIZER_STOP_STRING_MATCHER_H_
#define LLM_SCHEDULER_SERVICE_TOKENIZER_STOP_STRING_MATCHER_H_

#include <string>
#include <string_view>
#include <vector>

namespace llm {

class StopStringMatcher {
 public:
  struct Result {
    std::string text;  // text that is final and may be emitted
    bool stopped = false;
    std::string stop_string;
  };

  // Empty stop strings are ignored; invalid UTF-8 in one is replaced by U+FFFD.
  StopStringMatcher(std::vector<std::string> stop, bool include_stop_str_in_output);

  // Feeds the next piece of text (valid UTF-8). After a stop, returns empty results.
  Result Feed(std::string_view text);
  // The sequence ended for another reason: releases the held-back text.
  std::string Finish();

  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stop_;
  bool include_stop_;
  std::string pending_;  // held back: a suffix that is a proper prefix of a stop string
  bool stopped_ = false;
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_TOKENIZER_STOP_STRING_MATCHER_H_
