// A Hugging Face tokenizer.json (BPE models: byte-level like GPT-2 / Llama 3 / Qwen2, or
// byte-fallback with Metaspace / Prepend+Replace like Llama 2 / Mistral), loaded from a
// model directory together with tokenizer_config.json (bos / eos tokens, add_bos_token,
// add_eos_token) and generation_config.json (bos_token_id, eos_token_id: one id or a list).
//
// Encode: added tokens are matched first (see AddedVocabulary), then each remaining piece
// is normalized, pre-tokenized and run through the model; with add_special_tokens the
// post_processor's template (TemplateProcessing, RobertaProcessing, BertProcessing) adds its
// tokens, or, when the file has no post_processor, add_bos_token / add_eos_token from
// tokenizer_config.json do. Input that is not valid UTF-8 is first repaired with one U+FFFD
// per invalid sequence, as Python callers of the Hugging Face library get it.
// Decode: as the Hugging Face library's decode; unknown ids are skipped.
//
// Loading fails (INVALID_ARGUMENT / NOT_FOUND) with an error naming the file and, for an
// unsupported normalizer, pre-tokenizer, model, decoder or post-processor, its type.
// Immutable after loading; Encode and Decode are thread-safe.
#ifndef LLM_SCHEDULER_SERVICE_TOKENIZER_TOKENIZER_H_
#define LLM_SCHEDULER_SERVICE_TOKENIZER_TOKENIZER_H_

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/types.h"
#include "scheduler_service/tokenizer/added_vocabulary.h"
#include "scheduler_service/tokenizer/bpe_model.h"
#include "scheduler_service/tokenizer/decoder.h"
#include "scheduler_service/tokenizer/normalizer.h"
#include "scheduler_service/tokenizer/pre_tokenizer.h"

namespace llm {

class GgufFile;

class Tokenizer {
 public:
  // How a vocabulary token's string (IdToToken) spells the bytes it adds to the text, as the
  // tokenizer's decoder reads it back.
  enum class TokenSpelling {
    kRaw,            // the string is the bytes
    kByteLevel,      // GPT-2's byte-to-unicode characters (a ByteLevel decoder)
    kSentencePiece,  // "▁" for a space and "<0xAB>" byte-fallback tokens (Metaspace, ByteFallback)
  };

  // Reads <dir>/tokenizer.json (required), tokenizer_config.json and
  // generation_config.json (both optional).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromDirectory(const std::string& dir);
  // (`dir` may also be a GGUF file, *.gguf: FromGguf.)
  // From a GGUF file's tokenizer.ggml.* metadata (see gguf_tokenizer.h).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);
  // The same from file contents; empty config strings mean absent files.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(
      std::string_view tokenizer_json, std::string_view tokenizer_config_json = {},
      std::string_view generation_config_json = {});

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  std::vector<TokenId> Encode(std::string_view text, bool add_special_tokens = true) const;
  std::string Decode(std::span<const TokenId> ids, bool skip_special_tokens = false) const;

  // The words the model sees for `text` (normalizer and pre-tokenizer, no added tokens).
  std::vector<std::string> PreTokenize(std::string_view text) const;

  std::optional<TokenId> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(TokenId id) const;
  bool IsSpecialToken(TokenId id) const;
  // An added token (tokenizer.json's added_tokens): its string is its text, not a spelling.
  bool IsAddedToken(TokenId id) const { return added_.FindById(id) != nullptr; }
  TokenSpelling token_spelling() const { return token_spelling_; }
  // One more than the largest id of the model or the added tokens.
  int32_t vocab_size() const { return vocab_size_; }

  std::optional<TokenId> bos_token_id() const { return bos_token_id_; }
  // generation_config.json's eos_token_id (one or a list), then tokenizer_config.json's
  // eos_token when it is not among them.
  const std::vector<TokenId>& eos_token_ids() const { return eos_token_ids_; }
  // Whether Encode(text, add_special_tokens=true) starts with the bos token.
  bool add_bos_token() const {
    return bos_token_id_.has_value() && !prefix_ids_.empty() && prefix_ids_[0] == *bos_token_id_;
  }
  // The ids Encode(..., add_special_tokens=true) puts before and after the text.
  const std::vector<TokenId>& special_prefix_ids() const { return prefix_ids_; }
  const std::vector<TokenId>& special_suffix_ids() const { return suffix_ids_; }

  // For benchmarks: 0 disables the model's word cache.
  void set_cache_capacity(size_t capacity) { model_->set_cache_capacity(capacity); }

 private:
  Tokenizer() = default;
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJsonOrThrow(
      std::string_view tokenizer_json, std::string_view tokenizer_config_json,
      std::string_view generation_config_json);
  void EncodePiece(std::string_view text, bool at_start, std::vector<TokenId>* ids) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Decoder> decoder_;
  AddedVocabulary added_;
  std::vector<TokenId> prefix_ids_;
  std::vector<TokenId> suffix_ids_;
  std::optional<TokenId> bos_token_id_;
  std::vector<TokenId> eos_token_ids_;
  int32_t vocab_size_ = 0;
  TokenSpelling token_spelling_ = TokenSpelling::kRaw;
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_TOKENIZER_TOKENIZER_H_
