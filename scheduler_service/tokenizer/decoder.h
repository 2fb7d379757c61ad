// The `decoder` of a tokenizer.json: turns token strings back into text. Supported types:
// ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip and Sequence, each with the
// Hugging Face library's decode_chain semantics (ByteLevel repairs invalid UTF-8 with one
// U+FFFD per invalid sequence, ByteFallback with one U+FFFD per byte). Others (WordPiece,
// BPEDecoder, CTC) fail to load with an error naming them.
// Immutable after parsing; thread-safe.
#ifndef LLM_SCHEDULER_SERVICE_TOKENIZER_DECODER_H_
#define LLM_SCHEDULER_SERVICE_TOKENIZER_DECODER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace llm {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // One step of the chain: token strings in, token strings out.
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
  // The whole decode: the chain, then the pieces concatenated.
  std::string Decode(std::vector<std::string> tokens) const;
};

// A null JSON value gives a null decoder. Unsupported types fail with INVALID_ARGUMENT
// naming the type.
absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const nlohmann::json& spec);

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_TOKENIZER_DECODER_H_
