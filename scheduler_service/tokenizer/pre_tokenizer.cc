#include "scheduler_service/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "scheduler_service/tokenizer/byte_level.h"
#include "scheduler_service/tokenizer/json_util.h"
#include "scheduler_service/tokenizer/regex.h"

namespace llm {
namespace {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Range {
  size_t begin;
  size_t end;
  bool flag;  // is a match (before the behavior is applied) / is removed (after)
};

// Splits `piece` at the given matches as Hugging Face's NormalizedString::split does, and
// passes the non-empty, non-removed parts to `sink`.
void SplitAt(const PreToken& piece, const std::vector<std::pair<size_t, size_t>>& matches,
             Behavior behavior, bool invert, PreTokenizer::Sink sink) {
  const std::string& s = piece.text;
  std::vector<Range> ranges;
  ranges.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (prev != b) ranges.push_back({prev, b, invert});
    ranges.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != s.size()) ranges.push_back({prev, s.size(), invert});

  std::vector<Range> splits;
  splits.reserve(ranges.size());
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kRemoved:
      splits = ranges;
      break;
    case Behavior::kIsolated:
      for (const Range& r : ranges) splits.push_back({r.begin, r.end, false});
      break;
    case Behavior::kContiguous:
      for (const Range& r : ranges) {
        if (r.flag == previous_match && !splits.empty()) {
          splits.back().end = r.end;
        } else {
          splits.push_back({r.begin, r.end, false});
        }
        previous_match = r.flag;
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const Range& r : ranges) {
        if (r.flag && !previous_match && !splits.empty()) {
          splits.back().end = r.end;
        } else {
          splits.push_back({r.begin, r.end, false});
        }
        previous_match = r.flag;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = ranges.rbegin(); it != ranges.rend(); ++it) {
        if (it->flag && !previous_match && !splits.empty()) {
          splits.back().begin = it->begin;
        } else {
          splits.push_back({it->begin, it->end, false});
        }
        previous_match = it->flag;
      }
      std::reverse(splits.begin(), splits.end());
      break;
  }
  for (const Range& r : splits) {
    if (r.flag || r.begin == r.end) continue;
    sink({s.substr(r.begin, r.end - r.begin), piece.at_start && r.begin == 0});
  }
}

// SplitAt with Isolated and no invert (what the GPT-2, Llama 3 and Qwen2 patterns use),
// streamed: every match and every gap between matches is a piece.
void SplitIsolated(const PreToken& piece, const Regex& regex, PreTokenizer::Sink sink) {
  const std::string& s = piece.text;
  auto emit = [&](size_t begin, size_t end) {
    if (begin < end) sink({s.substr(begin, end - begin), piece.at_start && begin == 0});
  };
  size_t prev = 0;
  regex.ForEachMatch(s, [&](size_t begin, size_t end) {
    emit(prev, begin);
    emit(begin, end);
    prev = end;
  });
  emit(prev, s.size());
}

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void PreTokenize(PreToken piece, Sink sink) const override { Run(0, std::move(piece), sink); }

 private:
  // Each part takes the pieces of the one before, depth first.
  void Run(size_t i, PreToken piece, Sink sink) const {
    if (i == parts_.size()) {
      sink(std::move(piece));
      return;
    }
    parts_[i]->PreTokenize(std::move(piece),
                           [this, i, sink](PreToken p) { Run(i + 1, std::move(p), sink); });
  }

  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void PreTokenize(PreToken piece, Sink sink) const override {
    if (behavior_ == Behavior::kIsolated && !invert_) {
      SplitIsolated(piece, *pattern_, sink);
    } else {
      SplitAt(piece, pattern_->FindAll(piece.text), behavior_, invert_, sink);
    }
  }

 private:
  std::unique_ptr<Regex> pattern_;
  Behavior behavior_;
  bool invert_;
};

constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> split)
      : add_prefix_space_(add_prefix_space), split_(std::move(split)) {}
  void PreTokenize(PreToken piece, Sink sink) const override {
    if (add_prefix_space_ && (piece.text.empty() || piece.text[0] != ' ')) {
      piece.text.insert(0, " ");
    }
    auto map_bytes = [sink](PreToken p) {
      std::string mapped;
      AppendByteLevelChars(p.text, &mapped);
      sink({std::move(mapped), p.at_start});
    };
    if (split_ != nullptr) {
      SplitIsolated(piece, *split_, map_bytes);
    } else {
      map_bytes(std::move(piece));
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> split_;  // null without use_regex
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  MetaspacePreTokenizer(std::string replacement, Prepend prepend, bool split,
                        std::unique_ptr<Regex> replacement_regex)
      : replacement_(std::move(replacement)),
        prepend_(prepend),
        split_(split),
        replacement_regex_(std::move(replacement_regex)) {}
  void PreTokenize(PreToken piece, Sink sink) const override {
    std::string text;
    text.reserve(piece.text.size() + replacement_.size());
    for (const char c : piece.text) {
      if (c == ' ') {
        text.append(replacement_);
      } else {
        text.push_back(c);
      }
    }
    const bool prepend =
        prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && piece.at_start);
    if (prepend && !text.starts_with(replacement_)) text.insert(0, replacement_);
    PreToken replaced{std::move(text), piece.at_start};
    if (!split_) {
      if (!replaced.text.empty()) sink(std::move(replaced));
      return;
    }
    SplitAt(replaced, replacement_regex_->FindAll(replaced.text), Behavior::kMergedWithNext, false,
            sink);
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
  std::unique_ptr<Regex> replacement_regex_;
};

absl::StatusOr<Behavior> ParseBehavior(const nlohmann::json& spec) {
  ASSIGN_OR_RETURN(std::string b, json_util::GetString(spec, "behavior", "Split", "Isolated"));
  if (b == "Removed") return Behavior::kRemoved;
  if (b == "Isolated") return Behavior::kIsolated;
  if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (b == "Contiguous") return Behavior::kContiguous;
  return absl::InvalidArgumentError(
      absl::StrCat("pre_tokenizer Split: unknown behavior '", b, "'"));
}

}  // namespace

void PreTokenizer::PreTokenizeAll(std::vector<PreToken>* pieces) const {
  std::vector<PreToken> out;
  for (PreToken& p : *pieces) {
    PreTokenize(std::move(p), [&out](PreToken q) { out.push_back(std::move(q)); });
  }
  *pieces = std::move(out);
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const nlohmann::json& spec) {
  if (spec.is_null()) return nullptr;
  const std::string type = json_util::TypeOf(spec);
  if (type == "Sequence") {
    auto it = spec.find("pretokenizers");
    if (it == spec.end() || !it->is_array()) {
      return absl::InvalidArgumentError("pre_tokenizer Sequence: missing 'pretokenizers'");
    }
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const auto& sub : *it) {
      ASSIGN_OR_RETURN(auto part, ParsePreTokenizer(sub));
      if (part != nullptr) parts.push_back(std::move(part));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  if (type == "Split") {
    ASSIGN_OR_RETURN(auto pattern, json_util::GetPattern(spec, "pre_tokenizer Split"));
    ASSIGN_OR_RETURN(Behavior behavior, ParseBehavior(spec));
    return std::make_unique<SplitPreTokenizer>(std::move(pattern), behavior,
                                               json_util::GetBool(spec, "invert", false));
  }
  if (type == "ByteLevel") {
    std::unique_ptr<Regex> split;
    if (json_util::GetBool(spec, "use_regex", true)) {
      ASSIGN_OR_RETURN(split, Regex::Compile(kGpt2Pattern));
    }
    return std::make_unique<ByteLevelPreTokenizer>(
        json_util::GetBool(spec, "add_prefix_space", true), std::move(split));
  }
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(std::string replacement,
                     json_util::GetString(spec, "replacement", "Metaspace", "\xE2\x96\x81"));
    if (replacement.empty()) {
      return absl::InvalidArgumentError("pre_tokenizer Metaspace: empty replacement");
    }
    // Older files spell prepend_scheme as add_prefix_space (true = "always").
    std::string scheme = json_util::GetBool(spec, "add_prefix_space", true) ? "always" : "never";
    ASSIGN_OR_RETURN(scheme, json_util::GetString(spec, "prepend_scheme", "Metaspace", scheme));
    MetaspacePreTokenizer::Prepend prepend;
    if (scheme == "always") {
      prepend = MetaspacePreTokenizer::Prepend::kAlways;
    } else if (scheme == "first") {
      prepend = MetaspacePreTokenizer::Prepend::kFirst;
    } else if (scheme == "never") {
      prepend = MetaspacePreTokenizer::Prepend::kNever;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("pre_tokenizer Metaspace: unknown prepend_scheme '", scheme, "'"));
    }
    ASSIGN_OR_RETURN(auto regex, Regex::CompileLiteral(replacement));
    return std::make_unique<MetaspacePreTokenizer>(
        replacement, prepend, json_util::GetBool(spec, "split", true), std::move(regex));
  }
  if (type == "Digits") {
    // char::is_numeric is \p{N}; one piece per digit, or per run of digits.
    const bool individual = json_util::GetBool(spec, "individual_digits", false);
    ASSIGN_OR_RETURN(auto digit, Regex::Compile(R"(\p{N})"));
    return std::make_unique<SplitPreTokenizer>(
        std::move(digit), individual ? Behavior::kIsolated : Behavior::kContiguous, false);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported pre_tokenizer type '", type,
                   "' (supported: ByteLevel, Split, Metaspace, Digits, Sequence)"));
}

}  // namespace llm
