// The tokenizer of a GGUF file (tokenizer.ggml.* metadata) as the tokenizer.json,
// tokenizer_config.json and generation_config.json a Hugging Face directory of the same model
// has, so that Tokenizer::FromGguf builds the same pieces Tokenizer::FromJson does.
//
//   tokenizer.ggml.model "gpt2": byte-level BPE (tokens, merges), the pre-tokenizer chosen by
//     tokenizer.ggml.pre: "llama-bpe" / "llama3" / "llama-v3" (Llama 3's split regex; whole
//     words in the vocab skip the merges), "qwen2" (Qwen2's regex, NFC), "smollm" (single
//     digits, then GPT-2's regex), "gpt-2" / "default" (GPT-2's regex). Others are refused.
//   tokenizer.ggml.model "llama": SentencePiece-style BPE with byte fallback: "▁" for spaces
//     (prepended unless tokenizer.ggml.add_space_prefix is false), merges generated from the
//     token scores as transformers' GGUF converter does (every split of a token into two
//     tokens, ordered by the token's score).
// Tokens of type CONTROL (3) and UNKNOWN (2) become special added tokens, USER_DEFINED (4)
// plain added tokens. bos / eos ids come from tokenizer.ggml.{bos,eos}_token_id,
// add_bos / add_eos from tokenizer.ggml.add_{bos,eos}_token (absent: true for "llama", false
// for "gpt2"). tokenizer.chat_template goes to tokenizer_config.json's chat_template.
#ifndef LLM_SCHEDULER_SERVICE_TOKENIZER_GGUF_TOKENIZER_H_
#define LLM_SCHEDULER_SERVICE_TOKENIZER_GGUF_TOKENIZER_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/gguf.h"

namespace llm {

struct GgufTokenizerFiles {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  std::string generation_config_json;
};

// What a chat template needs from a GGUF: tokenizer.chat_template ("" when absent) and the
// bos / eos token strings ("" when the ids are absent or out of range).
struct GgufChatInfo {
  std::string chat_template;
  std::string bos_token;
  std::string eos_token;
};
GgufChatInfo GgufChatInfoOf(const GgufFile& file);

// INVALID_ARGUMENT naming a missing or malformed key; UNIMPLEMENTED naming an unsupported
// tokenizer.ggml.model or tokenizer.ggml.pre.
absl::StatusOr<GgufTokenizerFiles> GgufTokenizerToJson(const GgufFile& file);

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_TOKENIZER_GGUF_TOKENIZER_H_
