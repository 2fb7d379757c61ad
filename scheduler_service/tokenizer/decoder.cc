#include "scheduler_service/tokenizer/decoder.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"
#include "scheduler_service/tokenizer/byte_level.h"
#include "scheduler_service/tokenizer/json_util.h"
#include "scheduler_service/tokenizer/regex.h"

namespace llm {
namespace {

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& p : parts_) p->DecodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

// All tokens' bytes (byte-level characters mapped back; a token with a character outside
// the alphabet, such as an added token with a space, keeps its own bytes), then one lossy
// UTF-8 conversion of the whole.
class ByteLevelDecoder final : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const std::string& t : *tokens) {
      if (!AppendBytesOfByteLevelToken(t, &bytes)) bytes.append(t);
    }
    tokens->assign(1, IsValidUtf8(bytes) ? std::move(bytes) : Utf8Lossy(bytes));
  }
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& t : *tokens) {
      const auto matches = pattern_->FindAll(t);
      if (matches.empty()) continue;
      std::string out;
      size_t prev = 0;
      for (const auto& [s, e] : matches) {
        out.append(t, prev, s - prev);
        out.append(content_);
        prev = e;
      }
      out.append(t, prev, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

// Runs of <0xXX> tokens become their bytes when those are valid UTF-8, else one U+FFFD
// per byte.
class ByteFallbackDecoder final : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string bytes;
    size_t num_bytes = 0;
    auto flush = [&] {
      if (num_bytes == 0) return;
      if (IsValidUtf8(bytes)) {
        out.push_back(bytes);
      } else {
        for (size_t i = 0; i < num_bytes; ++i) out.emplace_back(kReplacementChar);
      }
      bytes.clear();
      num_bytes = 0;
    };
    for (std::string& t : *tokens) {
      int byte = -1;
      if (t.size() == 6 && t.starts_with("<0x") && t[5] == '>') byte = ParseHexByte(t[3], t[4]);
      if (byte >= 0) {
        bytes.push_back(static_cast<char>(byte));
        ++num_bytes;
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    *tokens = std::move(out);
  }

 private:
  static int HexDigit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  }
  static int ParseHexByte(char hi, char lo) {
    const int h = HexDigit(hi), l = HexDigit(lo);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
  }
};

class FuseDecoder final : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string all;
    for (const std::string& t : *tokens) all.append(t);
    tokens->assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing copies of `content` from each token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& t : *tokens) {
      size_t begin = 0, end = t.size();
      for (size_t i = 0; i < start_ && t.compare(begin, content_.size(), content_) == 0 &&
                         begin + content_.size() <= end;
           ++i) {
        begin += content_.size();
      }
      for (size_t i = 0; i < stop_ && end >= begin + content_.size() &&
                         t.compare(end - content_.size(), content_.size(), content_) == 0;
           ++i) {
        end -= content_.size();
      }
      t = t.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

// The replacement character becomes a space, except in the first token (when a prefix
// was prepended at encode time), where it is dropped.
class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool prepends)
      : replacement_(std::move(replacement)), prepends_(prepends) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& t = (*tokens)[i];
      std::string out;
      out.reserve(t.size());
      size_t pos = 0;
      while (pos < t.size()) {
        if (t.compare(pos, replacement_.size(), replacement_) == 0) {
          if (!(i == 0 && prepends_)) out.push_back(' ');
          pos += replacement_.size();
        } else {
          out.push_back(t[pos++]);
        }
      }
      t = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool prepends_;
};

}  // namespace

std::string Decoder::Decode(std::vector<std::string> tokens) const {
  DecodeChain(&tokens);
  std::string out;
  for (const std::string& t : tokens) out.append(t);
  return out;
}

absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const nlohmann::json& spec) {
  if (spec.is_null()) return nullptr;
  const std::string type = json_util::TypeOf(spec);
  if (type == "Sequence") {
    auto it = spec.find("decoders");
    if (it == spec.end() || !it->is_array()) {
      return absl::InvalidArgumentError("decoder Sequence: missing 'decoders'");
    }
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const auto& sub : *it) {
      ASSIGN_OR_RETURN(auto part, ParseDecoder(sub));
      if (part != nullptr) parts.push_back(std::move(part));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Replace") {
    ASSIGN_OR_RETURN(auto pattern, json_util::GetPattern(spec, "decoder Replace"));
    ASSIGN_OR_RETURN(std::string content, json_util::GetString(spec, "content", "Replace"));
    return std::make_unique<ReplaceDecoder>(std::move(pattern), std::move(content));
  }
  if (type == "Strip") {
    ASSIGN_OR_RETURN(std::string content, json_util::GetString(spec, "content", "Strip", " "));
    const auto start = spec.value("start", 0);
    const auto stop = spec.value("stop", 0);
    if (content.empty() || start < 0 || stop < 0) {
      return absl::InvalidArgumentError("decoder Strip: bad content, start or stop");
    }
    return std::make_unique<StripDecoder>(std::move(content), start, stop);
  }
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(std::string replacement,
                     json_util::GetString(spec, "replacement", "Metaspace", "\xE2\x96\x81"));
    std::string scheme = json_util::GetBool(spec, "add_prefix_space", true) ? "always" : "never";
    ASSIGN_OR_RETURN(scheme, json_util::GetString(spec, "prepend_scheme", "Metaspace", scheme));
    if (replacement.empty()) {
      return absl::InvalidArgumentError("decoder Metaspace: empty replacement");
    }
    return std::make_unique<MetaspaceDecoder>(std::move(replacement), scheme != "never");
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unsupported decoder type '", type,
      "' (supported: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence)"));
}

}  // namespace llm
