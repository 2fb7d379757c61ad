// TokenizerInfo: what the grammar engine needs to know of a tokenizer: the bytes each token id
// adds to the text, which ids stop generation (eos and other stop tokens) and which are special
// (control tokens: never allowed by a grammar).
//
// The bytes of a token are what it contributes to the output text, not its vocabulary string.
// A caller holding a Hugging Face vocabulary converts each token string with TokenToBytes:
//   - byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM2; decoder "ByteLevel"): kByteLevel, each
//     character maps back to one byte through GPT-2's byte-to-unicode table ("Ġ" -> ' ');
//   - SentencePiece-style BPE with byte fallback (Llama 2, Mistral; decoders Replace "▁" and
//     ByteFallback): kSentencePiece, "▁" -> ' ' and "<0xAB>" -> the byte 0xAB;
//   - added tokens that are not special (their content is plain text): kRaw.
// A SentencePiece tokenizer's leading-space strip (the decoder's Strip) is ignored: a grammar
// sees the space a "▁word" token adds, as the model wrote it.
//
// Immutable after construction; safe to share between threads (CompiledGrammar holds it).
#ifndef LLM_STRUCTURED_TOKENIZER_INFO_H_
#define LLM_STRUCTURED_TOKENIZER_INFO_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace llm::structured {

enum class VocabEncoding {
  kRaw,            // the token string is its bytes
  kByteLevel,      // GPT-2's byte-to-unicode characters
  kSentencePiece,  // "▁" for spaces, "<0xAB>" byte-fallback tokens
};

// The bytes of a vocabulary token string. INVALID_ARGUMENT when a kByteLevel string holds a
// character outside the byte-to-unicode table.
absl::StatusOr<std::string> TokenToBytes(std::string_view token, VocabEncoding encoding);

// For a list of tokens sorted by bytes with lcp[i] the length of the prefix token i shares with
// token i - 1: next_smaller[j] is the first k > j with lcp[k] < lcp[j] (or the list's end).
std::vector<size_t> NextSmaller(const std::vector<int32_t>& lcp);
// The first index after i whose token does not start with the first `len` (>= 1) bytes of
// token i: a walk jumps there when that prefix is dead, past the prefix's whole subtree.
inline size_t SkipSharedPrefix(const std::vector<int32_t>& lcp,
                               const std::vector<size_t>& next_smaller, size_t i, int32_t len) {
  size_t j = i + 1;
  while (j < lcp.size() && lcp[j] >= len) j = next_smaller[j];
  return j;
}

// One id of a tokenizer's vocabulary, as the tokenizer describes it.
struct VocabToken {
  enum class Type {
    kNormal,     // a token of the model's vocabulary: its string is decoded per VocabEncoding
    kSpecial,    // a control token (bos, eos, <|im_start|>): never allowed by a grammar
    kAddedText,  // an added token that is not special: its string is plain text
  };
  std::string token;  // empty: an id without a token (never allowed)
  Type type = Type::kNormal;
};

class TokenizerInfo {
 public:
  // token_bytes[id] for ids 0..token_bytes.size()-1; vocab_size (at least token_bytes.size():
  // a model's padded vocabulary) is the number of bits in a token bitmask, the ids past the
  // tokens are never allowed. A token with empty bytes is never allowed either. INVALID_ARGUMENT
  // for an id out of range.
  static absl::StatusOr<std::shared_ptr<const TokenizerInfo>> Create(
      std::vector<std::string> token_bytes, int32_t vocab_size, std::vector<int32_t> stop_token_ids,
      std::vector<int32_t> special_token_ids);

  // The same from a tokenizer's vocabulary (vocab[id] for each id): the caller's whole job is
  // IdToToken and IsSpecialToken per id and the encoding of the tokenizer's decoder.
  // INVALID_ARGUMENT naming the id of a kNormal token TokenToBytes refuses.
  static absl::StatusOr<std::shared_ptr<const TokenizerInfo>> FromVocab(
      const std::vector<VocabToken>& vocab, VocabEncoding encoding, int32_t vocab_size,
      std::vector<int32_t> stop_token_ids);

  int32_t vocab_size() const { return vocab_size_; }
  // uint32_t words of a token bitmask: bit (id % 32) of word (id / 32) allows id.
  int32_t bitmask_words() const { return (vocab_size_ + 31) / 32; }
  int32_t num_tokens() const { return static_cast<int32_t>(token_bytes_.size()); }
  std::string_view token_bytes(int32_t id) const { return token_bytes_[id]; }
  bool is_stop(int32_t id) const { return kind_[id] == kStop; }
  bool is_special(int32_t id) const { return kind_[id] == kSpecial; }
  const std::vector<int32_t>& stop_token_ids() const { return stop_token_ids_; }

  // The ids a grammar may allow by their bytes (not special, not stop, not empty), sorted by
  // their bytes, so that a walk in this order visits a prefix tree of the vocabulary; and
  // sorted_lcp()[i], the length of the prefix sorted_ids()[i] shares with sorted_ids()[i - 1].
  const std::vector<int32_t>& sorted_ids() const { return sorted_ids_; }
  const std::vector<int32_t>& sorted_lcp() const { return sorted_lcp_; }
  // The bytes of sorted_ids()[i], stored in sorted order (a walk reads them sequentially).
  std::string_view sorted_bytes(size_t i) const {
    return std::string_view(sorted_bytes_)
        .substr(sorted_offsets_[i], sorted_offsets_[i + 1] - sorted_offsets_[i]);
  }
  // The first index after i whose token does not start with the first `len` bytes of token i
  // (len >= 1): where a walk goes on when that prefix is dead, past its whole subtree.
  size_t SkipPrefix(size_t i, int32_t len) const {
    return SkipSharedPrefix(sorted_lcp_, sorted_next_smaller_, i, len);
  }
  int32_t max_token_length() const { return max_token_length_; }

 private:
  enum Kind : uint8_t { kText, kStop, kSpecial, kNever };
  TokenizerInfo() = default;

  std::vector<std::string> token_bytes_;
  std::vector<Kind> kind_;  // per id below vocab_size_
  std::vector<int32_t> stop_token_ids_;
  std::vector<int32_t> sorted_ids_;
  std::vector<int32_t> sorted_lcp_;
  std::string sorted_bytes_;
  std::vector<uint32_t> sorted_offsets_;
  // sorted_next_smaller_[j]: the first k > j with sorted_lcp_[k] < sorted_lcp_[j] (or the end).
  std::vector<size_t> sorted_next_smaller_;
  int32_t vocab_size_ = 0;
  int32_t max_token_length_ = 0;
};

}  // namespace llm::structured

#endif  // LLM_STRUCTURED_TOKENIZER_INFO_H_
