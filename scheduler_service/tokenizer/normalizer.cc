#include "scheduler_service/tokenizer/normalizer.h"

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"
#include "scheduler_service/tokenizer/json_util.h"
#include "scheduler_service/tokenizer/regex.h"
#include "scheduler_service/tokenizer/unicode_normalization.h"

namespace llm {
namespace {

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  void Normalize(std::string* text) const override {
    for (const auto& p : parts_) p->Normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

// Prepends `prepend` to non-empty text.
class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prepend) : prepend_(std::move(prepend)) {}
  void Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prepend_);
  }

 private:
  std::string prepend_;
};

// Replaces every match of the pattern with `content`.
class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Normalize(std::string* text) const override {
    const auto matches = pattern_->FindAll(*text);
    if (matches.empty()) return;
    std::string out;
    out.reserve(text->size() + matches.size() * content_.size());
    size_t prev = 0;
    for (const auto& [s, e] : matches) {
      out.append(*text, prev, s - prev);
      out.append(content_);
      prev = e;
    }
    out.append(*text, prev, std::string::npos);
    *text = std::move(out);
  }

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

// Removes Unicode whitespace on the left and/or the right.
class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void Normalize(std::string* text) const override {
    size_t begin = 0, end = text->size();
    if (left_) {
      while (begin < end) {
        size_t pos = begin;
        if (!IsUnicodeWhitespace(NextCodePoint(*text, &pos))) break;
        begin = pos;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>((*text)[start]) & 0xC0) == 0x80) {
          --start;
        }
        size_t pos = start;
        if (!IsUnicodeWhitespace(NextCodePoint(*text, &pos))) break;
        end = start;
      }
    }
    *text = text->substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

// Unicode canonical normalization: NFC (composed) or NFD (decomposed).
class UnicodeFormNormalizer final : public Normalizer {
 public:
  explicit UnicodeFormNormalizer(bool compose) : compose_(compose) {}
  void Normalize(std::string* text) const override {
    *text = compose_ ? ToNfc(*text) : ToNfd(*text);
  }

 private:
  bool compose_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const nlohmann::json& spec) {
  if (spec.is_null()) return nullptr;
  const std::string type = json_util::TypeOf(spec);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    auto it = spec.find("normalizers");
    if (it == spec.end() || !it->is_array()) {
      return absl::InvalidArgumentError("normalizer Sequence: missing 'normalizers'");
    }
    for (const auto& sub : *it) {
      ASSIGN_OR_RETURN(auto part, ParseNormalizer(sub));
      if (part != nullptr) parts.push_back(std::move(part));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  if (type == "Prepend") {
    ASSIGN_OR_RETURN(std::string prepend, json_util::GetString(spec, "prepend", "Prepend"));
    return std::make_unique<PrependNormalizer>(std::move(prepend));
  }
  if (type == "Replace") {
    ASSIGN_OR_RETURN(auto pattern, json_util::GetPattern(spec, "normalizer Replace"));
    ASSIGN_OR_RETURN(std::string content, json_util::GetString(spec, "content", "Replace"));
    return std::make_unique<ReplaceNormalizer>(std::move(pattern), std::move(content));
  }
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(json_util::GetBool(spec, "strip_left", false),
                                             json_util::GetBool(spec, "strip_right", false));
  }
  if (type == "NFC" || type == "NFD") return std::make_unique<UnicodeFormNormalizer>(type == "NFC");
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported normalizer type '", type,
                   "' (supported: Sequence, Prepend, Replace, Strip, NFC, NFD)"));
}

}  // namespace llm
