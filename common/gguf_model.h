// A GGUF file as a model: its config (<arch>.* metadata) and its weights under their Hugging
// Face names and layout, dequantized at load.
//
// Names: token_embd -> model.embed_tokens, output -> lm_head (absent: tied embeddings),
// output_norm -> model.norm, blk.N.{attn_norm, attn_q/k/v/output, attn_q/k_norm,
// ffn_gate/up/down} -> model.layers.N.{input_layernorm, self_attn.q/k/v/o_proj,
// self_attn.q/k_norm, mlp.gate/up/down_proj}; blk.N.ffn_norm is post_attention_layernorm for
// Llama-style models and pre_feedforward_layernorm for Gemma, whose blk.N.post_attention_norm
// and post_ffw_norm are post_attention_layernorm and post_feedforward_layernorm. phi3's fused
// blk.N.attn_qkv and blk.N.ffn_up (gate and up rows, gate first) are self_attn.qkv_proj and
// mlp.gate_up_proj, read as they are. For the llama
// architecture llama.cpp's converter interleaves the rows of each head of attn_q and attn_k
// (for ggml's RoPE, which rotates adjacent pairs); reading undoes it, so the rows are the
// Hugging Face ones (halves rotated together).
//
// Mixtures of experts (Mixtral as llama with <arch>.expert_count, qwen2moe, qwen3moe): the
// converter merges each layer's experts into one tensor per projection, [experts, rows, cols]:
// blk.N.ffn_{gate,up,down}_exps hold expert E's mlp.experts.E.{gate,up,down}_proj (Mixtral's
// block_sparse_moe.experts.E.w1, w3, w2), or blk.N.ffn_gate_up_exps the gate rows then the up
// rows of each (--fuse-gate-up-exps); blk.N.ffn_gate_inp is the router (mlp.gate,
// block_sparse_moe.gate), and Qwen2-MoE's blk.N.ffn_{gate,up,down}_shexp and ffn_gate_inp_shexp
// ([H] or [1, H]) its mlp.shared_expert.* and mlp.shared_expert_gate [1, H].
#ifndef LLM_COMMON_GGUF_MODEL_H_
#define LLM_COMMON_GGUF_MODEL_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/gguf.h"
#include "common/model_config.h"
#include "common/safetensors.h"

namespace llm {

// Whether `path` names a GGUF file (ends with ".gguf").
bool IsGgufPath(std::string_view path);

// Where a Hugging Face tensor is in a GGUF file of architecture `arch` (general.architecture):
// "model.layers.3.mlp.up_proj.weight" -> {"blk.3.ffn_up.weight"},
// "model.layers.3.mlp.experts.5.up_proj.weight" -> {"blk.3.ffn_up_exps.weight", 5}; an empty
// name when it has none.
struct GgufTensorRef {
  std::string name;
  int expert = -1;  // >= 0: this expert's [rows, cols] of the merged [experts, rows, cols]
  bool operator==(const GgufTensorRef&) const = default;
};
GgufTensorRef GgufTensorFor(std::string_view hf_name, std::string_view arch = "llama");

class GgufWeights : public WeightSource {
 public:
  static absl::StatusOr<std::unique_ptr<GgufWeights>> Open(const std::string& path);
  // Over an open file (kept alive by the caller); heads from its llama.* metadata.
  static absl::StatusOr<std::unique_ptr<GgufWeights>> FromFile(const GgufFile* file);

  absl::StatusOr<std::vector<int64_t>> Shape(std::string_view name) const override;
  // Rows [begin, end) of dimension 0 or 1, dequantized and converted to out_dtype (F32,
  // F16 or BF16; narrowing rounds to nearest even). INVALID_ARGUMENT naming the tensor when
  // its type cannot be dequantized or the slice is out of range.
  absl::Status ReadSlice(std::string_view name, int dim, int64_t begin, int64_t end,
                         StDType out_dtype, std::span<std::byte> out) const override;

  // The stored type of tensor `name` (NOT_FOUND naming it when absent).
  absl::StatusOr<GgmlType> TensorType(std::string_view name) const;
  // The stored bytes of a slice of 2-D tensor `name`, as the file holds them (quantized blocks
  // stay blocks), row after row: rows [begin, end) (dim 0; q/k rows in Hugging Face order, as
  // ReadSlice), or columns [begin, end) of every row (dim 1; begin and end must fall on the
  // type's block boundaries). INVALID_ARGUMENT naming the tensor otherwise.
  absl::Status ReadBlocks(std::string_view name, int dim, int64_t begin, int64_t end,
                          std::vector<uint8_t>* out) const;

  const GgufFile& file() const { return *file_; }

 private:
  // A Hugging Face tensor as stored: its GGUF tensor, the shape it has under the Hugging Face
  // name (an expert's [rows, cols]; [1, H] for a shared-expert gate stored as [H]), the bytes of
  // its rows (an expert's part of the merged tensor), the first of those rows that is row 0
  // (the up rows of a fused gate_up), and the head size whose q/k rows are un-permuted (0: none).
  struct Stored {
    const GgufTensorInfo* info = nullptr;
    std::string what;  // "gguf <path>: tensor <name>[ expert E]", for messages
    std::vector<int64_t> shape;
    std::span<const std::byte> data;
    int64_t first_row = 0;
    int64_t permute_head_dim = 0;
  };
  absl::StatusOr<Stored> Find(std::string_view hf_name) const;

  std::unique_ptr<GgufFile> owned_;
  const GgufFile* file_ = nullptr;
  int n_head_ = 0;
  int n_head_kv_ = 0;
  std::string arch_;  // general.architecture
};

}  // namespace llm

#endif  // LLM_COMMON_GGUF_MODEL_H_
