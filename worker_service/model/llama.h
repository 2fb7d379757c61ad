// The Llama family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM) over a paged KV
// cache, tensor-parallel from the start. One LlamaModel is one rank's shard.
//
// Sharding (W ranks, rank r; Megatron style, as vLLM does it):
//   q/k/v_proj, gate/up_proj   column-parallel: rank r holds its rows (its heads / its part
//                              of the intermediate size); biases likewise
//   o_proj, down_proj          row-parallel: rank r holds its columns; outputs all-reduced
//   embed_tokens               vocab-parallel: rank r holds rows [r*Vp, (r+1)*Vp), Vp =
//                              ceil(V / W), plus one zero row that other ranks' tokens map to;
//                              the looked-up rows are all-reduced
//   lm_head (or tied embed)    vocab-parallel; each rank's logits are all-gathered
//   KV heads                   split across ranks; replicated when W > num_key_value_heads
//                              (rank r then holds kv head r / (W / Hkv), the one its q heads
//                              read)
// Each rank reads only its own slices of the weights (SafetensorsModel slices).
//
// Forward() runs one engine step: the tokens of every scheduled sequence in one batch (prefill
// chunks and decode tokens mixed), writing their K and V into the cache and returning the
// logits of the rows asked for (the last token of each sequence that samples).
//
// Thread-safety: Forward() mutates the KV cache; one thread at a time.
#ifndef LLM_WORKER_SERVICE_MODEL_LLAMA_H_
#define LLM_WORKER_SERVICE_MODEL_LLAMA_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace llm {

class Communicator;
class SafetensorsModel;

// The per-step inputs, all on the host, laid out as kernels/ops.h describes.
struct ForwardInput {
  std::span<const int32_t> token_ids;     // [T]
  std::span<const int32_t> positions;     // [T]
  std::span<const int64_t> slot_mapping;  // [T]
  std::span<const int32_t> block_tables;  // [S * max_blocks], row-major
  int max_blocks = 0;
  std::span<const int32_t> seq_lens;         // [S], context incl. this step's tokens
  std::span<const int32_t> query_start_loc;  // [S + 1]
  std::span<const int32_t> logits_indices;   // rows of [T] whose logits are returned
};

// One layer's K and V caches: [num_blocks, block_size, num_local_kv_heads, head_dim] each.
struct LayerKvCache {
  TensorView key;
  TensorView value;
};

class LlamaModel {
 public:
  // Reads rank `comm->rank()` of `comm->world_size()`'s shard (rank 0 of 1 when comm is
  // null). INVALID_ARGUMENT when the heads or the intermediate size do not split over the
  // ranks; the loader's errors when a tensor is missing or malformed.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const std::string& model_dir,
                                                          const ModelConfig& config,
                                                          Communicator* comm);
  // The same from an already open weights directory.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const SafetensorsModel& weights,
                                                          const ModelConfig& config,
                                                          Communicator* comm);

  // A shard with random weights (uniform, small), for benchmarks of a model's shape without
  // its files. Same sharding and checks as Load.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> CreateRandom(const ModelConfig& config,
                                                                  uint64_t seed,
                                                                  Communicator* comm);

  const ModelConfig& config() const { return config_; }
  int num_layers() const { return config_.num_hidden_layers; }
  int num_local_q_heads() const { return local_q_heads_; }
  int num_local_kv_heads() const { return local_kv_heads_; }
  int head_dim() const { return config_.head_dim; }
  int vocab_size() const { return config_.vocab_size; }

  // Runs the step; `logits` becomes [logits_indices.size(), vocab_size] (full vocabulary on
  // every rank). `caches` has num_layers() entries.
  absl::Status Forward(const ForwardInput& input, std::span<const LayerKvCache> caches,
                       HostTensor* logits);

 private:
  struct Layer {
    HostTensor input_norm;  // [H]
    HostTensor q_proj;      // [q_heads * D, H]
    HostTensor k_proj;      // [kv_heads * D, H]
    HostTensor v_proj;
    HostTensor q_bias, k_bias, v_bias;  // empty unless attention_bias
    HostTensor o_proj;                  // [H, q_heads * D]
    HostTensor post_norm;               // [H]
    HostTensor gate_up_proj;            // [2 * I_local, H]: this rank's gate rows, then its up rows
    HostTensor down_proj;               // [H, I_local]
  };

  LlamaModel(const ModelConfig& config, Communicator* comm);
  // From `weights`, or random (seeded) when it is null.
  absl::Status LoadWeights(const SafetensorsModel* weights, uint64_t seed);
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Make(const ModelConfig& config,
                                                          Communicator* comm);
  absl::Status AllReduce(const TensorView& t);

  ModelConfig config_;
  Communicator* comm_;
  int rank_ = 0;
  int world_ = 1;
  int local_q_heads_ = 0;
  int local_kv_heads_ = 0;
  int first_kv_head_ = 0;
  int local_intermediate_ = 0;
  int vocab_per_rank_ = 0;  // Vp
  ops::RopeConfig rope_;
  HostTensor embed_;    // [Vp + 1, H]; rows past this rank's vocabulary are zero
  HostTensor lm_head_;  // [Vp, H]; empty when tied to embed_
  HostTensor final_norm_;
  std::vector<Layer> layers_;
};

}  // namespace llm

#endif  // LLM_WORKER_SERVICE_MODEL_LLAMA_H_
