// The decoder families of common/model_config.h (Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3,
// Phi-3, and the mixtures of experts Mixtral, Qwen2-MoE and Qwen3-MoE) over a paged KV cache,
// tensor-parallel from the start. One LlamaModel is one rank's shard.
// The Llama layer is the base; each family's differences are ModelConfig features, applied in
// one place each: q/k norm (HeadRmsNorm after the projection), GeGLU, scaled embeddings,
// (1 + w) norms (the offset added at load), sandwich norms, the attention scale, soft-capping
// (of scores inside PagedAttention, of logits after the head), sliding-window layers (the
// window passed to PagedAttention; their own rope table when the family gives them one) and
// per-frequency rope factors, partial rotary (a rope table narrower than the head), longrope
// (RopeCosSinTable) and fused q/k/v and gate/up checkpoints (Phi-3: each rank reads its rows
// out of qkv_proj and gate_up_proj).
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
//   experts (MoE layers)       each expert's gate/up column-parallel and down row-parallel,
//                              like the dense MLP (rank r holds its part of every expert's
//                              intermediate size), the shared expert likewise; the router and
//                              the shared expert's gate replicated; one all-reduce per layer
// Each rank reads only its own slices of the weights (SafetensorsModel slices).
//
// Mixture of experts: the router GEMM (f32 logits), each token's softmax and top-k and the
// tokens grouped by expert; each active expert runs one gate/up GEMM and one down GEMM over its
// tokens' rows (gathered), whose outputs are added, weighted, into their tokens' rows;
// Qwen2-MoE's shared expert runs over every token and is added times sigmoid(its gate). Each
// rank's sum is partial, all-reduced as the dense MLP's.
//   cpu: the routing on the host (moe_routing.h), the weighted adds into an f32 sum.
//   cuda: the routing on the device (ops::MoeRoute: softmax, top-k, the pairs sorted by
//   expert), the experts' token counts copied to the host (one wait for the stream per MoE
//   layer: the GEMMs' sizes come from them, so a MoE model never runs from CUDA graphs), the
//   rows gathered in sorted order (ops::Embedding over x), one ops::Linear pair per active
//   expert over its contiguous rows, and ops::MoeCombine summing each token's k rows in order
//   (deterministic) with the shared expert's gated rows, rounded once to the model's dtype.
//
// q/k/v_proj are one fused weight [(q_heads + 2 kv_heads) * D, H] (one GEMM; rotary, the cache
// write and attention read q, k and v as token-strided views of its output, no copy), gate/up_proj
// one [2 I_local, H] (one GEMM into SiluAndMul).
//
// Device and dtype (ModelOptions): on cuda weights and activations are bf16 (the default
// there), f16 or f32, with fp32 accumulation inside every op and fp32 logits. On cpu the
// activations, norms, rotary, softmax, the KV cache and attention are fp32 whatever the dtype;
// the GEMM weights (qkv, o, gate_up, down, the LM head) are packed at load for oneDNN
// (kernels/cpu/packed_linear.h) in the model's dtype: f32, or bf16 (on CPUs with AVX512_BF16 or
// AMX: the GEMM's input rounded to bf16, fp32 accumulation, f32 output). A tied embedding table
// is held once, as the packed head, and looked up there (PackedLinear::GatherRows: in bf16 the
// rows are the bf16 ones the head multiplies by, as vLLM's bf16 embedding); an untied one stays
// f32. From a GGUF file (ModelOptions::quantized_weights, the default), the GEMM weights and the
// embedding table stored in a type the quantized kernels take stay the file's blocks instead
// (kernels/cpu/quantized_linear.h; each rank copies its rows, or its whole-block columns), the
// lookup dequantizing the rows it reads and a tied head running on the table's blocks.
// CPU steps run on the one OpenMP pool (kernels/cpu/thread_pool.h). Weights are read in
// the model's dtype (a BF16 checkpoint is copied, not converted through fp32) and each rank uploads
// only its slices.
//
// Forward() runs one engine step: the tokens of every scheduled sequence in one batch (prefill
// chunks and decode tokens mixed), writing their K and V into the cache and returning the
// logits of the rows asked for (the last token of each sequence that samples). On cuda it only
// enqueues work on the context's stream (inputs go up in one copy from pinned memory); the
// caller waits once per step. Activation buffers are allocated for the largest step seen (or
// reserved, Reserve) and reused: a step allocates nothing once they are large enough.
//
// Thread-safety: Forward() mutates the KV cache; one thread at a time.
#ifndef LLM_WORKER_SERVICE_MODEL_LLAMA_H_
#define LLM_WORKER_SERVICE_MODEL_LLAMA_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "kernels/cpu/packed_linear.h"
#include "kernels/cpu/quantized_linear.h"
#include "kernels/device_tensor.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"
#include "worker_service/model/device_context.h"
#include "worker_service/model/moe_routing.h"

namespace llm {

class Communicator;
class WeightSource;

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

// Where the model computes. `context` (not owned, outlives the model) is the rank's device
// and stream; null = cpu.
struct ModelOptions {
  DeviceContext* context = nullptr;
  // cuda: weights and activations, f32, bf16 or f16. cpu: the GEMM weights, f32 or bf16 (the
  // latter only where CpuHasNativeBf16()); activations stay f32.
  DType dtype = DType::kF32;
  // cpu, GGUF files: the linear weights (and the embedding table) stored as Q4_0, Q4_1, Q5_0,
  // Q8_0, Q4_K, Q5_K or Q6_K blocks stay those blocks and run on the quantized kernels
  // (kernels/cpu/quantized_linear.h); other tensors are dequantized to `dtype`. false
  // dequantizes every tensor (llm-worker --quantized-weights=false).
  bool quantized_weights = true;
};

// "float32" / "bfloat16" / "float16" (also "auto": bf16 on cuda; on cpu bf16 where the CPU has
// native bf16 dot products (AVX512_BF16 or AMX, as vLLM's CPU backend), else f32) for `device`:
// the model's dtype, or INVALID_ARGUMENT naming what the device takes.
absl::StatusOr<DType> ParseModelDType(const std::string& name, const TensorDevice& device);

// The cos/sin table of the model's rotary for positions [0, max_position):
// ops::ComputeRopeCosSinCache's (f32, row p = rope.rotary_dim / 2 cosines then as many sines),
// with a longrope `scaling` (type "longrope") applied: rows p < original_max_position_embeddings
// from inv_freq / short_factor, the rest from inv_freq / long_factor (one set per position,
// where transformers switches the whole sequence to the long factors once it is longer than
// the original length: the same below that length), all times attention_factor. Other
// scaling types are rope's (ops::RopeConfig::scaling), and `scaling` is ignored.
absl::StatusOr<std::vector<float>> RopeCosSinTable(const ops::RopeConfig& rope,
                                                   const RopeScaling& scaling,
                                                   int64_t max_position);

class LlamaModel {
 public:
  ~LlamaModel();
  // Reads rank `comm->rank()` of `comm->world_size()`'s shard (rank 0 of 1 when comm is
  // null). INVALID_ARGUMENT when the heads or the intermediate size do not split over the
  // ranks, or the dtype does not suit the device; the loader's errors when a tensor is missing
  // or malformed; RESOURCE_EXHAUSTED when the weights do not fit the device.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const std::string& model_dir,
                                                          const ModelConfig& config,
                                                          Communicator* comm,
                                                          const ModelOptions& options = {});
  // (`model_dir` may also be a GGUF file, *.gguf: its weights dequantized to the dtype, or on
  // cpu kept as the file's blocks, see ModelOptions::quantized_weights.)
  // The same from already open weights (a SafetensorsModel or a GgufWeights).
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const WeightSource& weights,
                                                          const ModelConfig& config,
                                                          Communicator* comm,
                                                          const ModelOptions& options = {});

  // A shard with random weights (uniform, small), for benchmarks of a model's shape without
  // its files. Same sharding and checks as Load.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> CreateRandom(const ModelConfig& config,
                                                                  uint64_t seed, Communicator* comm,
                                                                  const ModelOptions& options = {});

  const TensorDevice& device() const { return device_; }
  DeviceContext* context() const { return context_; }
  int world_size() const { return world_; }
  // Waits for everything this rank enqueued (cuda: the stream, through the communicator's
  // deadline when there is a group, so that a dead peer fails the wait instead of hanging it).
  absl::Status Synchronize();
  DType dtype() const { return dtype_; }
  // Bytes of this rank's weights on the device, and of those the 12-bit coded copies (cpu).
  size_t weight_bytes() const { return weight_bytes_; }
  size_t coded_weight_bytes() const { return coded_weight_bytes_; }
  // Of weight_bytes(), those held as GGUF blocks (cpu, ModelOptions::quantized_weights).
  size_t quantized_weight_bytes() const { return quantized_weight_bytes_; }
  // Bytes of the activation and step-input buffers held now (Reserve, or the largest step);
  // on cpu, where they are reserved address space, the bytes of theirs that are resident (the
  // rows the largest steps so far wrote), with the quantized GEMMs' scratch.
  size_t activation_bytes() const;

  // CUDA graphs for decode steps (cuda; off until called): a step whose every sequence
  // computes one token and samples it runs from a graph captured at its first use for the
  // batch padded to the next power of two (at most max_batch), over static input buffers
  // (Reserve first: a graph needs max_batch <= the reserved sequences). 0 turns them off, as
  // vLLM's --enforce-eager. Graphs are captured over the KV caches they first see and
  // recaptured when the caches change. A batch size whose capture fails (a collective that
  // cannot be captured) runs eagerly from then on. A mixture of experts never uses graphs (its
  // layers wait for the device mid-step, see MoeMlpCuda): the call leaves them off.
  void EnableCudaGraphs(int max_batch);
  bool cuda_graphs_enabled() const { return max_graph_batch_ > 0; }
  int max_graph_batch() const { return max_graph_batch_; }
  // The padded batch sizes a graph is captured for: 1, 2, 4, ... up to max_graph_batch().
  std::vector<int> GraphBatchSizes() const;
  int num_graphs() const { return static_cast<int>(graphs_.size()); }
  int64_t graph_replays() const { return graph_replays_; }

  // Allocates the activation buffers for steps of up to max_tokens tokens, max_seqs sequences
  // and contexts of max_model_len (the attention workspace), so that no step allocates and
  // memory profiling sees them. Forward grows them when a step is larger. On cpu the buffers
  // are address space, resident where steps write them, and the GEMMs' scratch is reserved
  // too: call it on the thread that runs the steps (its OpenMP team's scratch is reserved).
  absl::Status Reserve(int64_t max_tokens, int64_t max_seqs, int64_t max_model_len);

  const ModelConfig& config() const { return config_; }
  int num_layers() const { return config_.num_hidden_layers; }
  int num_local_q_heads() const { return local_q_heads_; }
  int num_local_kv_heads() const { return local_kv_heads_; }
  int head_dim() const { return config_.head_dim; }
  int vocab_size() const { return config_.vocab_size; }

  // Runs the step; `logits` becomes an f32 view [logits_indices.size(), vocab_size] on the
  // model's device (full vocabulary on every rank), valid until the next Forward. On cuda the
  // work is only enqueued on the context's stream. `caches` has num_layers() entries.
  absl::Status Forward(const ForwardInput& input, std::span<const LayerKvCache> caches,
                       TensorView* logits);
  // The same, then the logits copied into a host tensor (waits for the device): for tests.
  absl::Status Forward(const ForwardInput& input, std::span<const LayerKvCache> caches,
                       HostTensor* logits);

 private:
  struct Layer {
    bool sliding = false;   // attends through config.sliding_window
    Tensor input_norm;      // [H]
    Tensor q_norm, k_norm;  // [D] each; unallocated unless config.qk_norm
    // [H] each; unallocated unless config.sandwich_norms: the attention's and the MLP's output
    // norms (post_norm is then the MLP's input norm, pre_feedforward_layernorm).
    Tensor qkv_proj;  // [(q_heads + 2 kv_heads) * D, H]: this rank's q rows, k rows, v rows
    Tensor qkv_bias;  // [(q_heads + 2 kv_heads) * D]; unallocated unless attention_bias
    Tensor o_proj;    // [H, q_heads * D]
    Tensor attn_out_norm, mlp_out_norm;
    Tensor post_norm;     // [H]
    Tensor gate_up_proj;  // [2 * I_local, H]: this rank's gate rows, then its up rows
    Tensor down_proj;     // [H, I_local]
    // cpu: the four GEMMs' weights (and qkv's bias) packed for oneDNN; the Tensors above are
    // then released. Or, kept as a GGUF file's blocks, the *_quant ones instead (the Tensors
    // and the packed ones then stay empty).
    std::unique_ptr<cpu::PackedLinear> qkv_packed, o_packed, gate_up_packed, down_packed;
    std::unique_ptr<cpu::QuantizedLinear> qkv_quant, o_quant, gate_up_quant, down_quant;
    // A mixture-of-experts layer (config.IsMoeLayer): the router [E, H] packed in f32, each
    // expert's gate/up [2 Ie_local, H] and down [H, Ie_local] packed or, kept as a GGUF file's
    // blocks, in the *_quant ones (one of the two per expert and projection), and Qwen2-MoE's
    // shared expert in gate_up_* / down_* above with its gate [1, H] (unallocated: none).
    // On cuda the same weights stay Tensors in the model's dtype: router [E, H], each expert's
    // gate/up [2 Ie_local, H] and down [H, Ie_local], the shared expert in gate_up_proj /
    // down_proj.
    bool moe = false;
    std::unique_ptr<cpu::PackedLinear> router_packed;
    std::vector<std::unique_ptr<cpu::PackedLinear>> expert_gate_up, expert_down;
    std::vector<std::unique_ptr<cpu::QuantizedLinear>> expert_gate_up_quant, expert_down_quant;
    Tensor router;
    std::vector<Tensor> expert_gate_up_w, expert_down_w;
    Tensor shared_gate;
  };
  // Activation and input buffers, sized for the largest step so far.
  struct Buffers {
    int64_t tokens = 0, rows = 0, seqs = 0, table = 0;  // capacities
    Tensor x, residual, qkv, attn, gate_up, act;        // [tokens, ...], model dtype
    // Mixture of experts (cpu, f32): the router's logits [tokens, E], an expert's gathered
    // input rows and output rows [tokens, H], and the layer's weighted sum [tokens, H].
    // On cuda (model dtype but the f32 logits): moe_in and moe_out hold every expert's rows
    // [tokens * k, H] in MoeRoute's sorted order, moe_sum the shared expert's output [tokens, H];
    // MoeRoute's outputs (device) and the offsets' pinned host copy; the shared expert's gate
    // logits f32 [tokens, 1].
    Tensor router_logits, moe_in, moe_out, moe_sum;
    Tensor moe_offsets, moe_sorted, moe_experts, moe_weights, moe_positions;
    Tensor moe_offsets_host, shared_gate_logits;
    // OLMoE at tensor-parallel sizes > 1: each token's q and k sums of squares, f32 [2, tokens],
    // all-reduced between SumOfSquares and RmsNormBySums.
    Tensor norm_sums;
    Tensor selected;                        // [rows, H]
    Tensor local_logits, gathered, logits;  // f32 [rows, Vp], [W, rows, Vp], [rows, V]
    // The step's integer inputs: on cpu they are read where the caller has them; on cuda they
    // are packed into `staging` (pinned) and go up in one copy into `inputs`.
    Tensor staging, inputs;
    Tensor attention_workspace;  // PagedAttention's split-K partials (cuda)
    int64_t max_model_len = 0;
  };

  // A step's inputs as the ops see them (on the model's device).
  struct StepViews {
    TensorView ids, positions, slots, rows;
    ops::AttentionMetadata meta;
    int64_t t = 0, s = 0, n = 0;
  };
  struct Graph {
    void* exec = nullptr;  // cudaGraphExec_t
    TensorView logits;     // [B, V] f32, where the graph writes them
  };

  LlamaModel(const ModelConfig& config, Communicator* comm, const ModelOptions& options);
  // Packs the step's integer inputs (cuda: into pinned memory, one copy up).
  absl::Status Upload(const ForwardInput& in, StepViews* out);
  // Enqueues the whole forward pass over `views` (nothing is allocated or waited for).
  absl::Status Compute(const StepViews& views, std::span<const LayerKvCache> caches,
                       TensorView* logits);
  // x [t, H] (the MLP's normalized input) becomes this rank's part of the layer's mixture of
  // experts, before the all-reduce: MoeMlp on cpu, MoeMlpCuda on cuda (which waits once for the
  // device: the experts' token counts come to the host to size their GEMMs).
  absl::Status MoeMlp(const Layer& L, const TensorView& x, int64_t t);
  absl::Status MoeMlpCuda(const Layer& L, const TensorView& x, int64_t t);
  bool UseGraph(const ForwardInput& in, std::span<const LayerKvCache> caches) const;
  int64_t GraphSize(int64_t num_seqs) const;
  // A graph's block-table row: the blocks of max_model_len tokens in the caches' block size.
  int64_t GraphTableWidth(std::span<const LayerKvCache> caches) const;
  absl::Status GraphForward(const ForwardInput& in, std::span<const LayerKvCache> caches,
                            TensorView* logits);
  void ReleaseGraphs();
  // From `weights`, or random (seeded) when it is null.
  absl::Status LoadWeights(const WeightSource* weights, uint64_t seed);
  // Rows [begin, end) of a weight (dim 0), or its columns [begin, end) (dim 1).
  struct WeightSlice {
    std::string name;
    int dim;
    int64_t begin, end;
  };
  // cpu, a GGUF file, quantized_weights_: the linear whose rows are the slices', stacked (then
  // zero rows up to n_rows), with K = k inputs and `bias` (absent: unallocated), kept as the
  // file's blocks in *out. false when it is not to be (another device, no GGUF, the option
  // off) or cannot be (a slice's type has no kernel, or a column slice is not whole blocks:
  // logged); the caller then reads it dequantized.
  absl::StatusOr<bool> LoadQuantized(const WeightSource* weights,
                                     const std::vector<WeightSlice>& slices, int64_t k,
                                     int64_t n_rows, const Tensor& bias,
                                     std::unique_ptr<cpu::QuantizedLinear>* out);
  // cpu: packs a GEMM weight (and bias) in dtype_ (or `dtype`) and releases its f32 copy; a layer's
  // four GEMMs; the LM head (tied: from the embedding table, which is then released).
  absl::Status PackCpuWeight(Tensor* weight, Tensor* bias, std::unique_ptr<cpu::PackedLinear>* out,
                             std::optional<DType> dtype = std::nullopt);
  absl::Status PackCpuLayer(Layer* layer);
  absl::Status PackCpuHead();
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Make(const ModelConfig& config,
                                                          Communicator* comm,
                                                          const ModelOptions& options);
  absl::Status AllReduce(const TensorView& t);
  absl::Status Grow(int64_t tokens, int64_t rows, int64_t seqs, int64_t table);
  absl::Status AllocateOnDevice(DType dtype, std::initializer_list<int64_t> shape, Tensor* t);
  // An activation buffer: AllocateOnDevice, but on cpu in HostMemory::kReserved memory.
  absl::Status AllocateActivation(DType dtype, std::initializer_list<int64_t> shape, Tensor* t);
  ops::OpContext OpContextFor() const;

  ModelConfig config_;
  Communicator* comm_;
  DeviceContext* context_;
  TensorDevice device_;
  DType dtype_;
  DType act_dtype_;  // activations and the tensors kept unpacked: dtype_ on cuda, f32 on cpu
  int rank_ = 0;
  int world_ = 1;
  int local_q_heads_ = 0;
  int local_kv_heads_ = 0;
  int first_kv_head_ = 0;
  int local_intermediate_ = 0;
  int local_expert_intermediate_ = 0;  // each expert's part of moe_intermediate_size
  int local_shared_intermediate_ = 0;  // the shared expert's part
  int local_max_intermediate_ = 0;     // the widest of the three: the MLP buffers' width
  int vocab_per_rank_ = 0;             // Vp
  size_t weight_bytes_ = 0;
  size_t coded_weight_bytes_ = 0;
  size_t quantized_weight_bytes_ = 0;
  bool quantized_weights_ = true;
  ops::RopeConfig rope_, rope_local_;
  Tensor cos_sin_cache_;  // f32 [max_position_embeddings, rotary_dim]: cosines, then sines
  Tensor cos_sin_local_;  // the sliding layers' own table (Gemma 3); unallocated otherwise
  Tensor embed_;          // [Vp + 1, H]; rows past this rank's vocabulary are zero
  Tensor lm_head_;        // [Vp, H]; unallocated when tied to embed_ (or packed, on cpu)
  std::unique_ptr<cpu::PackedLinear> lm_head_packed_;  // cpu: the LM head (tied or not), packed
  // cpu, kept as GGUF blocks: the embedding table ([Vp, H], the lookup's rows; the head too when
  // tied) and the untied head ([Vp, H]); rows past this rank's vocabulary are zero blocks.
  std::unique_ptr<cpu::QuantizedLinear> embed_quant_, lm_head_quant_;
  Tensor final_norm_;
  std::vector<Layer> layers_;
  Buffers buf_;
  std::vector<int32_t> local_ids_;  // cpu: this step's ids in the local vocabulary
  MoeRouting routing_;              // cpu: the step's routing of the current MoE layer
  int max_graph_batch_ = 0;
  std::map<int64_t, Graph> graphs_;               // by padded batch size
  std::map<int64_t, std::string> failed_graphs_;  // sizes that run eagerly, and why
  const void* graph_caches_ = nullptr;            // the caches the graphs were captured over
  int64_t graph_replays_ = 0;
  std::vector<int32_t> g_ids_, g_positions_, g_tables_, g_lens_, g_qsl_, g_rows_;  // padded
  std::vector<int64_t> g_slots_;
};

}  // namespace llm

#endif  // LLM_WORKER_SERVICE_MODEL_LLAMA_H_
