// The model configuration of a Hugging Face model directory (config.json), for the Llama
// family the workers run: LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM.
//
// Parsing fails with INVALID_ARGUMENT naming the missing or malformed field, and with
// UNIMPLEMENTED naming an architecture, activation, rope scaling type or feature (sliding
// window attention) that is not supported, so that a model is never run half-understood.
#ifndef LLM_COMMON_MODEL_CONFIG_H_
#define LLM_COMMON_MODEL_CONFIG_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace llm {

class GgufFile;

struct RopeScaling {
  // "" (none), "linear" or "llama3".
  std::string type;
  double factor = 1.0;
  // llama3 only.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string architecture;  // as in "architectures"[0]
  std::string model_type;    // "llama", "mistral", "qwen2"
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;  // defaults to num_attention_heads (MHA)
  int head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections have biases (Qwen2 always)
  std::string torch_dtype;      // "float32", "bfloat16", "float16" or "" when absent
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;

  static absl::StatusOr<ModelConfig> FromJson(std::string_view json_text);
  // Reads <dir>/config.json, or the metadata of `dir` when it is a GGUF file (*.gguf).
  static absl::StatusOr<ModelConfig> FromModelDir(const std::string& dir);
  // From a GGUF file's metadata (general.architecture "llama"; llama.* keys; token ids from
  // tokenizer.ggml.*). UNIMPLEMENTED naming another architecture or an unsupported feature
  // (rope scaling other than linear, partial rotary); INVALID_ARGUMENT naming a missing or
  // malformed key. Implemented in gguf_model.cc.
  static absl::StatusOr<ModelConfig> FromGguf(const GgufFile& file);
};

}  // namespace llm

#endif  // LLM_COMMON_MODEL_CONFIG_H_
