#include "structured/tokenizer_info.h"

#include <algorithm>
#include <array>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/utf8.h"

namespace llm::structured {
namespace {

// GPT-2's bytes_to_unicode, inverted: codepoint -> byte, -1 where no byte maps to it. Printable
// bytes stand for themselves; the others (0-32, 127-160, 173) are U+0100 onwards in order.
const std::array<int16_t, 512>& ByteLevelDecodeTable() {
  static const std::array<int16_t, 512> table = [] {
    std::array<int16_t, 512> t;
    t.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      t[printable ? b : next++] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return table;
}

}  // namespace

absl::StatusOr<std::string> TokenToBytes(std::string_view token, VocabEncoding encoding) {
  switch (encoding) {
    case VocabEncoding::kRaw:
      return std::string(token);
    case VocabEncoding::kByteLevel: {
      std::string out;
      size_t pos = 0;
      while (pos < token.size()) {
        const int32_t cp = DecodeUtf8(token, &pos);
        const int16_t b = cp >= 0 && cp < 512 ? ByteLevelDecodeTable()[cp] : -1;
        if (b < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "token '", std::string(token), "' is not in GPT-2's byte-level alphabet"));
        }
        out.push_back(static_cast<char>(b));
      }
      return out;
    }
    case VocabEncoding::kSentencePiece: {
      auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        return -1;
      };
      if (token.size() == 6 && token.starts_with("<0x") && token[5] == '>' && hex(token[3]) >= 0 &&
          hex(token[4]) >= 0) {
        return std::string(1, static_cast<char>(hex(token[3]) * 16 + hex(token[4])));
      }
      std::string out;
      constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581
      for (size_t i = 0; i < token.size();) {
        if (token.substr(i, 3) == kMetaspace) {
          out.push_back(' ');
          i += 3;
        } else {
          out.push_back(token[i++]);
        }
      }
      return out;
    }
  }
  return absl::InvalidArgumentError("unknown vocabulary encoding");
}

std::vector<size_t> NextSmaller(const std::vector<int32_t>& lcp) {
  std::vector<size_t> next(lcp.size(), lcp.size());
  std::vector<size_t> open;  // indices whose next smaller lcp is not found yet
  for (size_t k = 0; k < lcp.size(); ++k) {
    while (!open.empty() && lcp[k] < lcp[open.back()]) {
      next[open.back()] = k;
      open.pop_back();
    }
    open.push_back(k);
  }
  return next;
}

absl::StatusOr<std::shared_ptr<const TokenizerInfo>> TokenizerInfo::FromVocab(
    const std::vector<VocabToken>& vocab, VocabEncoding encoding, int32_t vocab_size,
    std::vector<int32_t> stop_token_ids) {
  std::vector<std::string> bytes(vocab.size());
  std::vector<int32_t> special;
  for (size_t id = 0; id < vocab.size(); ++id) {
    const VocabToken& t = vocab[id];
    switch (t.type) {
      case VocabToken::Type::kSpecial:
        special.push_back(static_cast<int32_t>(id));
        break;
      case VocabToken::Type::kAddedText:
        bytes[id] = t.token;
        break;
      case VocabToken::Type::kNormal: {
        absl::StatusOr<std::string> b = TokenToBytes(t.token, encoding);
        if (!b.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat("token id ", id, ": ", b.status().message()));
        }
        bytes[id] = std::move(b).value();
        break;
      }
    }
  }
  return Create(std::move(bytes), vocab_size, std::move(stop_token_ids), std::move(special));
}

absl::StatusOr<std::shared_ptr<const TokenizerInfo>> TokenizerInfo::Create(
    std::vector<std::string> token_bytes, int32_t vocab_size, std::vector<int32_t> stop_token_ids,
    std::vector<int32_t> special_token_ids) {
  const int32_t num_tokens = static_cast<int32_t>(token_bytes.size());
  if (vocab_size < num_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size ", vocab_size, " is below the number of tokens ", num_tokens));
  }
  std::shared_ptr<TokenizerInfo> info(new TokenizerInfo());
  info->vocab_size_ = vocab_size;
  info->kind_.assign(vocab_size, kNever);
  for (int32_t id = 0; id < num_tokens; ++id) {
    if (!token_bytes[id].empty()) info->kind_[id] = kText;
  }
  for (int32_t id : special_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("special token id ", id, " out of range"));
    }
    info->kind_[id] = kSpecial;
  }
  for (int32_t id : stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("stop token id ", id, " out of range"));
    }
    info->kind_[id] = kStop;
  }
  std::sort(stop_token_ids.begin(), stop_token_ids.end());
  stop_token_ids.erase(std::unique(stop_token_ids.begin(), stop_token_ids.end()),
                       stop_token_ids.end());
  info->stop_token_ids_ = std::move(stop_token_ids);
  info->token_bytes_ = std::move(token_bytes);

  std::vector<int32_t>& ids = info->sorted_ids_;
  for (int32_t id = 0; id < num_tokens; ++id) {
    if (info->kind_[id] == kText) ids.push_back(id);
  }
  const auto& bytes = info->token_bytes_;
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return bytes[a] != bytes[b] ? bytes[a] < bytes[b] : a < b;
  });
  info->sorted_lcp_.resize(ids.size(), 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string& cur = bytes[ids[i]];
    info->max_token_length_ = std::max(info->max_token_length_, static_cast<int32_t>(cur.size()));
    if (i == 0) continue;
    const std::string& prev = bytes[ids[i - 1]];
    const size_t n = std::min(prev.size(), cur.size());
    size_t l = 0;
    while (l < n && prev[l] == cur[l]) ++l;
    info->sorted_lcp_[i] = static_cast<int32_t>(l);
  }
  info->sorted_offsets_.push_back(0);
  for (int32_t id : ids) {
    info->sorted_bytes_ += bytes[id];
    info->sorted_offsets_.push_back(static_cast<uint32_t>(info->sorted_bytes_.size()));
  }
  info->sorted_next_smaller_ = NextSmaller(info->sorted_lcp_);
  return std::shared_ptr<const TokenizerInfo>(std::move(info));
}

}  // namespace llm::structured
