// A detokenizer for tests that needs no tokenizer.
#ifndef LLM_TESTS_TESTING_FAKE_DETOKENIZER_H_
#define LLM_TESTS_TESTING_FAKE_DETOKENIZER_H_

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "scheduler_service/core/detokenizer.h"

namespace llm {

// Text for tests: token t reads "<t>", released one token late (as a detokenizer holds back
// an incomplete character) and the rest on Flush. Stop strings are searched in the text from
// the min_tokens-th token on; at one, the text ends before it (after it with
// include_stop_str_in_output).
class FakeDetokenizer : public IncrementalDetokenizer {
 public:
  explicit FakeDetokenizer(DetokenizeOptions options) : options_(std::move(options)) {}
  Delta Append(std::span<const TokenId> ids) override {
    Delta d;
    for (TokenId t : ids) {
      if (done_) break;
      const std::string piece = "<" + std::to_string(t) + ">";
      all_ += piece;
      size_t end = all_.size() - piece.size();  // all but the piece held back
      if (++num_tokens_ < options_.min_tokens) {
        search_from_ = all_.size();
      } else {
        size_t first = std::string::npos;
        for (const std::string& s : options_.stop) {
          const size_t at = all_.find(s, search_from_);
          if (at >= first) continue;
          first = at;
          end = at + (options_.include_stop_str_in_output ? s.size() : 0);
          d.stopped = done_ = true;
          d.stop_string = s;
        }
      }
      d.text += Release(end);
    }
    return d;
  }
  std::string Flush() override {
    if (done_) return {};
    done_ = true;
    return Release(all_.size());
  }
  const std::string& output_text() const override { return text_; }

 private:
  std::string Release(size_t end) {
    if (end <= released_) return {};
    std::string out = all_.substr(released_, end - released_);
    released_ = end;
    text_ += out;
    return out;
  }

  DetokenizeOptions options_;
  std::string all_;  // every token's text
  size_t released_ = 0;
  size_t search_from_ = 0;
  int num_tokens_ = 0;
  bool done_ = false;
  std::string text_;
};

// The text FakeDetokenizer gives these tokens.
inline std::string FakeText(const std::vector<TokenId>& tokens) {
  std::string text;
  for (TokenId t : tokens) text += "<" + std::to_string(t) + ">";
  return text;
}

class FakeDetokenizerFactory : public DetokenizerFactory {
 public:
  std::unique_ptr<IncrementalDetokenizer> Create(std::span<const TokenId>,
                                                 const DetokenizeOptions& o) const override {
    return std::make_unique<FakeDetokenizer>(o);
  }
};

}  // namespace llm

#endif  // LLM_TESTS_TESTING_FAKE_DETOKENIZER_H_
