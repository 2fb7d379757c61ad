// The model configuration of a Hugging Face model directory (config.json) or of a GGUF file's
// metadata, for the decoder families the workers run: LlamaForCausalLM, MistralForCausalLM
// (sliding window included), Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma2ForCausalLM,
// Gemma3ForCausalLM and Phi3ForCausalLM (Phi-3, Phi-3.5 and Phi-4-mini), and the mixtures of
// experts MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM and OlmoeForCausalLM. The
// families differ by the features below (each off by default, which is Llama); the model
// (worker_service/model/llama.h) implements each feature once.
//
// Parsing fails with INVALID_ARGUMENT naming the missing or malformed field, and with
// UNIMPLEMENTED naming an architecture, activation, rope scaling type or feature that is not
// supported, so that a model is never run half-understood. Both config.json spellings are read:
// transformers < 5 ("rope_theta", "rope_scaling", Gemma 3's "rope_local_base_freq" and
// "sliding_window_pattern") and transformers >= 5 ("rope_parameters", per layer type for
// Gemma 3, and "layer_types").
#ifndef LLM_COMMON_MODEL_CONFIG_H_
#define LLM_COMMON_MODEL_CONFIG_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace llm {

class GgufFile;

struct RopeScaling {
  // "" (none), "linear", "llama3" or "longrope" (config.json's rope_scaling); GGUF files of
  // Llama 3.1 and later carry the llama3 scaling as per-frequency factors instead
  // (rope_freq_factors).
  std::string type;
  double factor = 1.0;
  // llama3 only.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // llama3 and longrope.
  int original_max_position_embeddings = 8192;
  // longrope (Phi-3-*-128k, Phi-3.5, Phi-4-mini): rotary_dim / 2 divisors each of the inverse
  // frequencies, inv_freq[i] = theta^(-2i/r) / factor[i]: the short ones for positions below
  // original_max_position_embeddings, the long ones from there on (per position; see
  // LlamaModel's rope table for how this differs from transformers and vLLM), and
  // attention_factor multiplying every cos and sin: the config's, else (as transformers)
  // sqrt(1 + ln(s) / ln(original)) with s = factor if given, else max_position_embeddings /
  // original (1 when s <= 1). Resolved at parsing.
  std::vector<double> short_factor, long_factor;
  double attention_factor = 1.0;
};

struct ModelConfig {
  std::string architecture;  // as in "architectures"[0]
  std::string model_type;    // "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text",
                             // "phi3", "mixtral", "qwen2_moe", "qwen3_moe"
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
  // Dims rotated at the start of each head (partial_rotary_factor * head_dim: Phi-4-mini's
  // 0.75); 0 means the whole head (RotaryDim()).
  int rotary_dim = 0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections have biases (Qwen2 always)
  // Phi-3: the checkpoint holds q/k/v as one self_attn.qkv_proj.weight [(Hq + 2 Hkv) D, H]
  // (q rows, then k, then v) and gate/up as one mlp.gate_up_proj.weight [2 I, H] (gate rows,
  // then up); each rank reads its rows out of them.
  bool fused_qkv = false;
  bool fused_gate_up = false;
  // Per-frequency divisors of the rotary inverse frequencies (head_dim / 2 of them), from a
  // GGUF's rope_freqs tensor: inv_freq[i] = theta^(-2i/d) / rope_freq_factors[i]. Empty: none.
  std::vector<float> rope_freq_factors;

  // Qwen3, Gemma 3: an RMSNorm over each query and each key head (weights q_norm and k_norm,
  // [head_dim]) between the projection and rotary. OLMoE (qk_norm_whole): over each token's
  // whole query and key projections instead (weights [num_attention_heads * head_dim] and
  // [num_key_value_heads * head_dim]).
  bool qk_norm = false;
  bool qk_norm_whole = false;
  // The gated MLP's activation: "silu" (SwiGLU) or "gelu_pytorch_tanh" (Gemma's GeGLU).
  std::string hidden_act = "silu";
  // Gemma: the embeddings are multiplied by sqrt(hidden_size) (rounded to the activations'
  // dtype, as transformers does).
  bool scale_embeddings = false;
  // Added to every RMSNorm weight at load: 1 for Gemma's Hugging Face checkpoints, whose norms
  // multiply by (1 + w); 0 otherwise, and for GGUF files (llama.cpp's converter adds the 1).
  float norm_weight_offset = 0.0f;
  // Gemma 2 and 3: the attention's output and the MLP's output are normalized before their
  // residual adds (post_attention_layernorm, post_feedforward_layernorm), four norms per layer;
  // the MLP's input norm is then pre_feedforward_layernorm.
  bool sandwich_norms = false;
  // The attention scale is query_pre_attn_scalar^-0.5 (Gemma); 0: head_dim^-0.5.
  double query_pre_attn_scalar = 0.0;
  // Gemma 2: attention scores and final logits soft-capped, s -> cap * tanh(s / cap); 0: none.
  double attn_logit_softcapping = 0.0;
  double final_logit_softcapping = 0.0;
  // Sliding-window attention: a layer that has one sees the last `sliding_window` positions
  // (its own included). `sliding_layers` (num_hidden_layers entries) says which layers do;
  // empty with sliding_window > 0: every layer (Mistral). 0: none.
  int sliding_window = 0;
  std::vector<bool> sliding_layers;
  // Gemma 3: the sliding layers' rotary base, without the global layers' scaling; 0: the
  // sliding layers use rope_theta and rope_scaling like the others.
  double rope_local_theta = 0.0;
  // Mixture of experts: in the layers IsMoeLayer() names, the MLP is num_experts experts (each
  // a gated MLP of moe_intermediate_size) of which each token runs num_experts_per_tok, chosen
  // by a router (a [num_experts, H] linear, softmax, top-k) and weighted by their softmax
  // probabilities, renormalized over the k chosen when norm_topk_prob (Mixtral always).
  // Qwen2-MoE adds a shared expert every token runs (shared_expert_intermediate_size, 0: none),
  // scaled by sigmoid(shared_expert_gate . x). The other layers (Qwen2/3-MoE's mlp_only_layers
  // and those decoder_sparse_step skips) keep the dense MLP of intermediate_size. Mixtral's
  // experts are intermediate_size wide (moe_intermediate_size is set to it). 0 experts: dense.
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  int shared_expert_intermediate_size = 0;
  bool norm_topk_prob = false;
  std::vector<bool> moe_layers;  // num_hidden_layers entries when num_experts > 0
  std::string torch_dtype;       // "float32", "bfloat16", "float16" or "" when absent
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;

  int RotaryDim() const { return rotary_dim > 0 ? rotary_dim : head_dim; }

  // Whether layer `l` attends through a sliding window.
  bool IsSlidingLayer(int l) const {
    if (sliding_window <= 0) return false;
    return sliding_layers.empty() || (l >= 0 && l < static_cast<int>(sliding_layers.size()) &&
                                      sliding_layers[static_cast<size_t>(l)]);
  }

  // Whether layer `l`'s MLP is a mixture of experts.
  bool IsMoeLayer(int l) const {
    return num_experts > 0 && l >= 0 && l < static_cast<int>(moe_layers.size()) &&
           moe_layers[static_cast<size_t>(l)];
  }
  // The widest MLP of any layer (dense, expert or shared expert): the activations' width.
  int MaxIntermediateSize() const;

  static absl::StatusOr<ModelConfig> FromJson(std::string_view json_text);
  // Reads <dir>/config.json, or the metadata of `dir` when it is a GGUF file (*.gguf).
  static absl::StatusOr<ModelConfig> FromModelDir(const std::string& dir);
  // From a GGUF file's metadata (general.architecture llama, qwen2, qwen3, qwen2moe, qwen3moe,
  // olmoe, gemma2, gemma3 or phi3; <arch>.* keys; what llama.cpp hard-codes per architecture, such
  // as Gemma's layer pattern or which mixtures of experts renormalize their routing weights; token
  // ids from tokenizer.ggml.*; phi3's longrope factors from its rope_factors_short /
  // rope_factors_long tensors; the sparse layers from their routers' tensors). UNIMPLEMENTED
  // naming another architecture or an unsupported feature (rope scaling other than linear,
  // routing other than softmax top-k); INVALID_ARGUMENT naming a missing or malformed key.
  // Implemented in gguf_model.cc.
  static absl::StatusOr<ModelConfig> FromGguf(const GgufFile& file);
};

}  // namespace llm

#endif  // LLM_COMMON_MODEL_CONFIG_H_
