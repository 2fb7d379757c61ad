// The BPE `model` of a tokenizer.json: vocab, merges (both the "a b" and the ["a", "b"]
// forms), byte_fallback (<0xXX> tokens), unk_token with fuse_unk, ignore_merges.
// continuing_subword_prefix, end_of_word_suffix and dropout are not supported: a non-null
// value fails to load with an error naming the field.
//
// Tokenize merges the lowest-ranked adjacent pair first (ties: leftmost), with a heap over a
// linked list of symbols: O(n log n) in the word's length, so a 1 MB word is fine. Words up
// to kMaxCachedWordBytes are cached (word -> ids) in a bounded map that is cleared when
// full. Words that a Metaspace-style tokenizer hands over whole (Llama 2 has no
// pre-tokenizer, Mistral v0.3 a Metaspace one without split) are cut before each "▁" that
// follows another character, when no vocab token contains such a pair: then no merge can
// cross the cut and the result is the same, but long texts become short cacheable words.
// Thread-safe: the cache is guarded by a mutex; everything else is immutable.
#ifndef LLM_SCHEDULER_SERVICE_TOKENIZER_BPE_MODEL_H_
#define LLM_SCHEDULER_SERVICE_TOKENIZER_BPE_MODEL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/types.h"
#include "nlohmann/json_fwd.hpp"

namespace llm {

class BpeModel {
 public:
  static constexpr size_t kMaxCachedWordBytes = 256;
  static constexpr size_t kDefaultCacheCapacity = 1 << 16;

  // Fails with INVALID_ARGUMENT when the model is not BPE, a merge names a token missing
  // from the vocab, or an unsupported option is set.
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& spec);

  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the ids of `word` (one pre-tokenized piece) to *ids.
  void Tokenize(std::string_view word, std::vector<TokenId>* ids) const;

  std::optional<TokenId> TokenToId(std::string_view token) const;
  // The token string of `id`, or null when the vocab has no such id.
  const std::string* IdToToken(TokenId id) const;
  // One more than the largest id in the vocab.
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }

  // 0 disables the cache (for the benchmark's baseline).
  void set_cache_capacity(size_t capacity);

 private:
  struct Merge {
    int32_t rank;
    TokenId new_id;
  };
  BpeModel() = default;
  static uint64_t PairKey(TokenId a, TokenId b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const Merge* FindMerge(TokenId a, TokenId b) const;
  void TokenizeWord(std::string_view word, std::vector<TokenId>* ids) const;
  void MergeWord(std::string_view word, std::vector<TokenId>* ids) const;

  absl::flat_hash_map<std::string, TokenId> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::array<TokenId, 256> byte_ids_{};  // <0xXX> ids; -1 where absent
  bool byte_fallback_ = false;
  bool all_bytes_present_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::optional<TokenId> unk_id_;
  bool cut_before_metaspace_ = false;

  mutable absl::Mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<TokenId>> cache_ ABSL_GUARDED_BY(cache_mu_);
  size_t cache_capacity_ ABSL_GUARDED_BY(cache_mu_) = kDefaultCacheCapacity;
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_TOKENIZER_BPE_MODEL_H_
