#include "scheduler_service/tokenizer/incremental_detokenizer.h"

#include <utility>

#include "common/utf8.h"

namespace llm {
namespace {

// How many prompt tokens prime the window: at least this many, more (up to
// kMaxPromptContext) when their decode would start inside a character.
constexpr size_t kMinPromptContext = 4;
constexpr size_t kMaxPromptContext = 24;

bool EndsWithReplacement(const std::string& s) { return s.ends_with(kReplacementChar); }

}  // namespace

TokenizerIncrementalDetokenizer::TokenizerIncrementalDetokenizer(
    std::shared_ptr<const Tokenizer> tokenizer, std::span<const TokenId> prompt_token_ids,
    const DetokenizeOptions& options)
    : tokenizer_(std::move(tokenizer)),
      skip_special_tokens_(options.skip_special_tokens),
      min_tokens_(options.min_tokens),
      stops_(options.stop, options.include_stop_str_in_output) {
  std::span<const TokenId> context = prompt_token_ids;
  if (context.size() > kMinPromptContext) {
    const size_t max = std::min(context.size(), kMaxPromptContext);
    for (size_t n = kMinPromptContext; n <= max; ++n) {
      auto suffix = prompt_token_ids.last(n);
      context = suffix;
      if (tokenizer_->Decode(suffix, skip_special_tokens_).find(kReplacementChar) ==
          std::string::npos) {
        break;
      }
    }
  }
  ids_.assign(context.begin(), context.end());
  read_index_ = ids_.size();
  prefix_text_ = tokenizer_->Decode(ids_, skip_special_tokens_);
}

std::string TokenizerIncrementalDetokenizer::HeldText(const std::string& window_text) const {
  if (window_text.starts_with(prefix_text_)) return window_text.substr(prefix_text_.size());
  // The window's decode rewrote released text: a byte-fallback decoder turns a whole run of
  // byte tokens into one U+FFFD per byte when any of them is invalid, including complete
  // characters released before. Decode the held tokens on their own instead.
  return tokenizer_->Decode(std::span<const TokenId>(ids_).subspan(read_index_),
                            skip_special_tokens_);
}

std::string TokenizerIncrementalDetokenizer::Step(TokenId id) {
  ids_.push_back(id);
  const std::string text = tokenizer_->Decode(ids_, skip_special_tokens_);
  if (text.size() <= prefix_text_.size() || EndsWithReplacement(text)) return "";
  std::string new_text = HeldText(text);
  // The tokens just released become the context of the next ones.
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(read_index_));
  read_index_ = ids_.size();
  prefix_text_ = tokenizer_->Decode(ids_, skip_special_tokens_);
  return new_text;
}

IncrementalDetokenizer::Delta TokenizerIncrementalDetokenizer::Append(
    std::span<const TokenId> new_token_ids) {
  Delta delta;
  if (finished_) return delta;
  for (const TokenId id : new_token_ids) {
    ++num_tokens_;
    const std::string text = Step(id);
    if (text.empty()) continue;
    if (num_tokens_ < min_tokens_) {  // stop strings do not count yet
      delta.text += text;
      continue;
    }
    StopStringMatcher::Result r = stops_.Feed(text);
    delta.text += r.text;
    if (r.stopped) {
      delta.stopped = true;
      delta.stop_string = std::move(r.stop_string);
      finished_ = true;
      break;
    }
  }
  output_text_ += delta.text;
  return delta;
}

std::string TokenizerIncrementalDetokenizer::Flush() {
  if (finished_) return "";
  finished_ = true;
  std::string out;
  if (ids_.size() > read_index_) {
    std::string held = HeldText(tokenizer_->Decode(ids_, skip_special_tokens_));
    out = num_tokens_ < min_tokens_ ? std::move(held) : stops_.Feed(held).text;
  }
  out += stops_.Finish();
  output_text_ += out;
  return out;
}

std::unique_ptr<IncrementalDetokenizer> TokenizerDetokenizerFactory::Create(
    std::span<const TokenId> prompt_token_ids, const DetokenizeOptions& options) const {
  return std::make_unique<TokenizerIncrementalDetokenizer>(tokenizer_, prompt_token_ids, options);
}

}  // namespace llm
