// The ops of the model, one backend-neutral signature each. Every op takes an OpContext
// (where a backend finds its stream and handles), its output(s) first, then its inputs, all as
// TensorViews; it checks ranks, shapes, dtypes, contiguity and devices, and dispatches on the
// tensors' device: kernels/cpu/<op>.cc for cpu tensors (the reference), kernels/cuda/<op>.cu for
// cuda tensors in a build with the CUDA backend (else a cuda tensor gets an error). Nothing is
// thrown and bad arguments never crash: a failure returns an OpStatus whose message names the op,
// the argument, what was expected and what was given, e.g.
//   "RmsNorm: weight: expected f32 [4096], got f32 [4095] on cpu".
//
// Dtypes. Activations (hidden states, query, key, value, MLP activations, logits) are f32 on
// every backend, and on cuda may also be bf16 or f16: every CUDA kernel loads 16-bit values,
// does its math in fp32 and rounds its results to nearest even when storing. The CPU backend
// (the fp32 reference) takes f32 only: a 16-bit tensor on cpu is an error naming the argument.
// Per op, the tensors that must share one dtype are listed with the op. KV caches may be f32,
// f16 or bf16 on cuda (both caches the same dtype; PagedAttention reads them into fp32); f32 on
// cpu. Index tensors named below as "i32" must be i32; "index" tensors may be i32 or i64. An
// op's output must not overlap its inputs unless the op says it may.
//
// Layouts, by index (T tokens of this step, S sequences, H hidden size, D head size):
//   hidden states        x[t][h]                                   [T, H]
//   query                q[t][head][d]                             [T, Hq, D]
//   key, value (new)     k[t][kv_head][d]                          [T, Hkv, D]
//   KV cache (one layer) key_cache[block_id][slot_in_block][kv_head][d]
//                                                                  [num_blocks, block_size, Hkv, D]
//                        (value_cache the same). Token p of a sequence lives in block
//                        block_tables[s][p / block_size], slot p % block_size; a "slot"
//                        (slot_mapping) is block_id * block_size + slot_in_block.
//
// Token-strided q, k and v. Every tensor is contiguous, except that the query, key and value
// of RotaryEmbedding, RotaryEmbeddingCached, ReshapeAndCache and PagedAttention (its query, not
// its out), and HeadRmsNorm's x, may be token-strided views: [T, heads, D] with strides
// [token_stride, D, 1], token_stride >= heads * D, i.e. each token's heads contiguous but tokens
// further apart. The model passes views into the fused qkv projection's output, whose row t is
// [q | k | v]:
//   q[t][h][d] = qkv[t][h * D + d],  k[t][h][d] = qkv[t][(Hq + h) * D + d],
//   v[t][h][d] = qkv[t][(Hq + Hkv + h) * D + d],  token_stride = (Hq + 2 Hkv) * D,
// so that no copy splits them. Any other layout is an error naming the argument and its strides.
//
// Thread-safety: ops keep no state; concurrent calls on disjoint outputs are safe.
#ifndef LLM_KERNELS_OPS_H_
#define LLM_KERNELS_OPS_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/types.h"
#include "kernels/tensor.h"

namespace llm::ops {

// The result of an op: empty message = success.
struct [[nodiscard]] OpStatus {
  std::string message;

  bool ok() const { return message.empty(); }
  static OpStatus Ok() { return {}; }
  static OpStatus Error(std::string msg) { return {std::move(msg)}; }
};

// Per-call backend state. CPU ops ignore it. CUDA ops enqueue their work on `stream`
// (a cudaStream_t; null = the default stream) and return without waiting for it. Linear runs
// through cuBLASLt on `blaslt_handle` (a cublasLtHandle_t; required for cuda tensors) with
// `blas_workspace` (device memory on the tensors' device, `blas_workspace_bytes` long, 256-byte
// aligned; null / 0 = none, cuBLASLt then picks algorithms that need none) as its workspace.
// `blas_handle` (a cublasHandle_t) is kept for callers' own cuBLAS calls; no op uses it.
// `workspace` is device scratch on the tensors' device for ops that need it (PagedAttention's
// split-K partials), `workspace_bytes` long: allocated once by the caller (size it with
// PagedAttentionWorkspaceBytes), so that ops never allocate and memory profiling counts it;
// ops use it in stream order on `stream` (and Linear uses blas_workspace likewise). The caller
// owns all of them. Kept as void* so that this header needs no CUDA headers.
struct OpContext {
  void* stream = nullptr;
  void* blas_handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  void* blaslt_handle = nullptr;
  void* blas_workspace = nullptr;
  size_t blas_workspace_bytes = 0;
};

// out[t][h] = table[token_ids[t]][h]. token_ids: index [T], each in [0, V); table [V, H];
// out [T, H]; table and out the same dtype. A token id out of range is an error naming it (on
// cpu; a NaN row on cuda, see kernels/cuda/cuda_ops.h).
OpStatus Embedding(const OpContext& ctx, const TensorView& out, const TensorView& token_ids,
                   const TensorView& table);

// out[t][h] = x[t][h] / sqrt(mean_h(x[t][h]^2) + eps) * weight[h]. x, out [T, H]; weight [H].
// x, out and weight the same dtype. out may be x (in place).
OpStatus RmsNorm(const OpContext& ctx, const TensorView& out, const TensorView& x,
                 const TensorView& weight, float eps);

// The pre-norm residual step of a decoder layer, both in place:
//   residual[t][h] += x[t][h];  x[t][h] = rmsnorm(residual[t])[h] * weight[h].
// x, residual [T, H]; weight [H]; all three the same dtype (residual is kept in the activation
// dtype, as vLLM does: with 16-bit activations each layer's sum is rounded to it).
OpStatus FusedAddRmsNorm(const OpContext& ctx, const TensorView& x, const TensorView& residual,
                         const TensorView& weight, float eps);

// Per-head RMSNorm (Qwen3's and Gemma 3's q_norm / k_norm), in place on every head vector:
//   x[t][h][d] = x[t][h][d] / sqrt(mean_d(x[t][h][:]^2) + eps) * weight[d].
// x [T, heads, D] (may be token-strided, see the top: q or k inside the fused qkv output; the
// elements between its rows are untouched); weight [D], x's dtype. The arithmetic is RmsNorm's
// (over D instead of H): sum of squares accumulated in double on cpu, in fp32 on cuda, then
// x * inv_rms * weight in fp32 and ONE rounding to x's dtype. transformers' Qwen3RMSNorm rounds
// x * inv_rms to the input dtype before multiplying by the weight (Gemma3RMSNorm does not): the
// same for f32, one extra rounding apart for 16-bit. Gemma's (1 + weight) is the caller's to
// fold into weight.
OpStatus HeadRmsNorm(const OpContext& ctx, const TensorView& x, const TensorView& weight,
                     float eps);

// An RMSNorm whose rows are split over tensor-parallel ranks (OLMoE's q/k norm over each token's
// whole projection, of which a rank holds some heads), in two steps around an all-reduce:
//   SumOfSquares:  sums[t] = sum over the rank's heads h and d of x[t][h][d]^2;
//   (the caller all-reduces sums over the ranks)
//   RmsNormBySums: x[t][h][d] = x[t][h][d] / sqrt(sums[t] / count + eps) * weight[h * D + d],
//                  in place; count is the whole row's length (all ranks' heads x D).
// x [T, heads, D] (may be token-strided, see the top), f32 / bf16 / f16; sums f32 [T]
// (contiguous); weight [heads * D], x's dtype: this rank's part of the norm's weight. The
// arithmetic is HeadRmsNorm's (sums accumulated in double on cpu, fp32 on cuda; x * inv_rms *
// weight in fp32, one rounding to x's dtype), so on one rank the two steps equal HeadRmsNorm
// over [T, 1, heads * D] up to the order of the summation.
OpStatus SumOfSquares(const OpContext& ctx, const TensorView& sums, const TensorView& x);
OpStatus RmsNormBySums(const OpContext& ctx, const TensorView& x, const TensorView& sums,
                       const TensorView& weight, int64_t count, float eps);

// HF config.json's rope_scaling. kLinear divides positions by `factor`; kLlama3 rescales
// each frequency as transformers' _compute_llama3_parameters does (factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings).
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct RopeConfig {
  double theta = 10000.0;  // rope_theta
  int rotary_dim = 0;      // dims rotated at the start of each head; 0 = the whole head
  RopeScaling scaling;
  // Empty, or rotary_dim / 2 divisors of the inverse frequencies applied after the scaling
  // (a GGUF's rope_freqs tensor: llama.cpp's form of Llama 3.1's scaling).
  std::vector<double> freq_factors;
};

// The rotary_dim / 2 inverse frequencies after scaling:
//   inv_freq[i] = theta^(-2i / rotary_dim), then scaled as config.scaling says, then divided
//   by config.freq_factors[i] when there are any (their count must be rotary_dim / 2, each > 0).
// The angle of pair i at position p is p * inv_freq[i]. Backends share it.
OpStatus ComputeRopeInvFreq(const RopeConfig& config, std::span<double> inv_freq);

// Rotary position embedding, NeoX style (rotate halves), in place on query and key:
// with r = rotary_dim, half = r / 2, a = positions[t] * inv_freq[i], for i < half:
//   x'[i]        = x[i] * cos(a) - x[i + half] * sin(a)
//   x'[i + half] = x[i + half] * cos(a) + x[i] * sin(a)
// and dims >= r unchanged. positions: index [T]; query [T, Hq, D]; key [T, Hkv, D] (both may be
// token-strided, see the top; the elements between their rows are untouched);
// rotary_dim even and <= D; query and key the same dtype. Angles are computed in double per
// call (see RotaryEmbeddingCached for the table lookup the model runner uses).
OpStatus RotaryEmbedding(const OpContext& ctx, const TensorView& positions, const TensorView& query,
                         const TensorView& key, const RopeConfig& config);

// The cos / sin table of RotaryEmbeddingCached, vLLM's layout: row p (position p) holds the
// rotary_dim / 2 values cos(p * inv_freq[i]) then the rotary_dim / 2 values sin(p * inv_freq[i]),
// angles in double from ComputeRopeInvFreq, rounded once to f32. out: max_position * rotary_dim
// floats (rotary_dim = config.rotary_dim, which must be set: > 0 and even); a size mismatch is
// an error.
OpStatus ComputeRopeCosSinCache(const RopeConfig& config, int64_t max_position,
                                std::span<float> out);

// RotaryEmbedding with the angles looked up in cos_sin_cache (f32 [max_position, rotary_dim],
// from ComputeRopeCosSinCache, on the tensors' device) instead of computed: the rotation
// above with cos(a) = cache[positions[t]][i], sin(a) = cache[positions[t]][half + i].
// rotary_dim is the cache's second dim (even, <= D). positions: index [T]; query [T, Hq, D];
// key [T, Hkv, D], the same dtype, either may be token-strided (as in RotaryEmbedding). A position
// outside [0, max_position) is an error on cpu and a NaN row (every head of query and key of that
// token) on cuda.
OpStatus RotaryEmbeddingCached(const OpContext& ctx, const TensorView& positions,
                               const TensorView& query, const TensorView& key,
                               const TensorView& cos_sin_cache);

// The gated MLP activation: x [T, 2I], out [T, I] (the same dtype),
//   out[t][i] = silu(x[t][i]) * x[t][I + i],  silu(v) = v / (1 + exp(-v)).
OpStatus SiluAndMul(const OpContext& ctx, const TensorView& out, const TensorView& x);

// Gemma's GeGLU activation: x [T, 2I], out [T, I] (the same dtype),
//   out[t][i] = gelu_tanh(x[t][i]) * x[t][I + i],
//   gelu_tanh(v) = 0.5 v (1 + tanh(sqrt(2 / pi) (v + 0.044715 v^3)))
// (PyTorch's gelu(approximate='tanh')), computed as v / (1 + exp(-2 sqrt(2 / pi) (v + 0.044715
// v^3))), the same function without 1 + tanh's cancellation for negative v.
OpStatus GeluTanhAndMul(const OpContext& ctx, const TensorView& out, const TensorView& x);

// In place: x[...] *= factor (fp32 multiply, rounded to x's dtype). x contiguous, any shape;
// factor finite. Gemma scales its embeddings by sqrt(hidden_size) (transformers rounds that
// factor to the activation dtype first: the caller passes the factor it means).
OpStatus Scale(const OpContext& ctx, const TensorView& x, float factor);

// In place soft-capping: x[...] = cap * tanh(x[...] / cap) (fp32 math, rounded to x's dtype),
// Gemma 2's final_logit_softcapping (and attn_logit_softcapping's formula). x contiguous, any
// shape; cap finite and > 0.
OpStatus Softcap(const OpContext& ctx, const TensorView& x, float cap);

// A linear layer with HF's weight layout: out[t][n] = sum_k x[t][k] * weight[n][k] + bias[n].
// x [T, K]; weight [N, K]; bias [N] or absent (data == nullptr); out [T, N]. x and weight the
// same dtype (f32, bf16 or f16); out x's dtype or f32 (e.g. f32 logits from a bf16 LM head);
// bias in out's dtype. Products summed in fp32, then bias added, then rounded to out's dtype.
// On cuda: cuBLASLt (cublasLtMatmul, CUBLAS_COMPUTE_32F; CUBLAS_COMPUTE_32F_PEDANTIC for f32,
// so never TF32) on ctx.blaslt_handle (null is an error) and ctx.stream, bias fused with
// CUBLASLT_EPILOGUE_BIAS, ctx.blas_workspace as its workspace; the descriptors and algorithm
// are planned once per shape and cached (kernels/cuda/cuda_ops.h: GetLinearPlanStats).
OpStatus Linear(const OpContext& ctx, const TensorView& out, const TensorView& x,
                const TensorView& weight, const TensorView& bias);

// Writes this step's keys and values into the cache:
//   key_cache[slot / block_size][slot % block_size][h][d] = key[t][h][d], slot = slot_mapping[t]
// (the same for value). A slot of -1 is padding and is skipped; any other slot outside
// [0, num_blocks * block_size) is an error. key, value [T, Hkv, D] (either may be
// token-strided, see the top); key_cache, value_cache
// [num_blocks, block_size, Hkv, D]; slot_mapping: index [T]. key and value the same dtype
// (f32, bf16 or f16), the caches the same dtype as each other (f32, bf16 or f16), converted
// with round to nearest even (on cpu: all f32).
OpStatus ReshapeAndCache(const OpContext& ctx, const TensorView& key, const TensorView& value,
                         const TensorView& key_cache, const TensorView& value_cache,
                         const TensorView& slot_mapping);

// Where each sequence's tokens and KV blocks are, for PagedAttention. Sequence s owns query
// rows query_start_loc[s] .. query_start_loc[s + 1] - 1 (q_len of them) and has seq_lens[s]
// tokens of context in the cache, this step's included (so seq_lens[s] >= q_len). A batch
// mixes prefill chunks (q_len > 1, maybe after cached context) and decode tokens (q_len 1).
struct AttentionMetadata {
  TensorView block_tables;     // i32 [S, max_blocks]; row s lists s's blocks in order
  TensorView seq_lens;         // i32 [S]
  TensorView query_start_loc;  // i32 [S + 1]; 0 first, T last, non-decreasing
  int max_seq_len = 0;         // an upper bound of seq_lens for launch sizing; 0 = unknown
  // Optional: query_start_loc's contents in host memory (the host built them), [S + 1], or
  // empty. With them the CUDA backend launches only the kernels the batch needs (no prefill
  // kernel for a decode-only batch, none for decode rows in a prefill-only batch) and sizes the
  // prefill grid exactly; they must equal the device tensor's contents.
  std::span<const int32_t> query_start_loc_host = {};
  // Optional: seq_lens' contents in host memory, [S], or empty. With them the CUDA 16-bit
  // decode kernel plans its split of long contexts from the true lengths, else from
  // max_seq_len. They must equal the device tensor's contents (a length above them gives a
  // NaN row on cuda, never a read outside the cache).
  std::span<const int32_t> seq_lens_host = {};
};

// How PagedAttention scores its keys (the defaults: plain causal attention with scale 1).
//   scale           the logit is s = scale * q . k (finite).
//   sliding_window  W > 0: the query at position p sees only the last W positions, the keys
//                   at p - W < k <= p (transformers' and vLLM's sliding_window: a key is
//                   visible when p - k < W; Mistral, Gemma 2 / 3 local layers); the kernels
//                   skip the blocks before the window rather than reading them. 0 = none
//                   (every key at k <= p). Negative is an error.
//   softcap         c > 0: each logit becomes c * tanh(s / c) before the softmax (Gemma 2's
//                   attn_logit_softcapping, vLLM's logits_soft_cap; the scale applied first).
//                   0 = none. Negative, infinite or NaN is an error.
struct AttentionOptions {
  float scale = 1.0f;
  int sliding_window = 0;
  float softcap = 0.0f;
};

// Attention of this step's queries over the paged KV cache. The j-th query row of sequence s
// sits at position p = seq_lens[s] - q_len + j and attends to the keys at positions 0..p
// (causal inside the chunk, everything cached before it), or with options.sliding_window = W
// to those at max(0, p - W + 1)..p. Query head h reads kv head h / (Hq / Hkv) (GQA; MQA when
// Hkv = 1; Hq % Hkv == 0):
//   out[t][h] = sum_{k in window(p)} softmax_k(cap(scale * q[t][h] . K[k][kvh])) V[k][kvh]
// with cap(s) = s, or softcap * tanh(s / softcap) when options.softcap > 0.
// query, out [T, Hq, D] (query may be token-strided, see the top; out is contiguous);
// key_cache, value_cache [num_blocks, block_size, Hkv, D].
// Dtypes: f32 query and out with f32 caches (and on cuda f16 or bf16 caches, read into fp32);
// on cuda also the 16-bit path: query, out and both caches all bf16 or all f16 (fp32
// accumulation, the output rounded to nearest), head sizes 64 and 128.
OpStatus PagedAttention(const OpContext& ctx, const TensorView& out, const TensorView& query,
                        const TensorView& key_cache, const TensorView& value_cache,
                        const AttentionMetadata& metadata, const AttentionOptions& options);

// PagedAttention with options {scale} (no window, no softcap).
OpStatus PagedAttention(const OpContext& ctx, const TensorView& out, const TensorView& query,
                        const TensorView& key_cache, const TensorView& value_cache,
                        const AttentionMetadata& metadata, float scale);

// Bytes of OpContext::workspace that PagedAttention on cuda uses at most, for batches of at
// most max_num_tokens tokens (and sequences) over contexts of at most max_model_len, with
// num_heads query heads of head_size (this rank's): the f32 path's split-K partials or the
// 16-bit decode kernel's split-KV partials, whichever is larger. 0 when it never needs any; the
// CPU backend needs none. With less workspace it still runs, splitting long contexts less or
// not at all (slower for small batches).
size_t PagedAttentionWorkspaceBytes(int64_t max_num_tokens, int64_t num_heads, int64_t head_size,
                                    int64_t max_model_len);

// Copies whole blocks inside one device's caches, for copy-on-write: for every layer l and
// pair, key_caches[l][pair.dst] = key_caches[l][pair.src] (and the values), pairs in order. All
// caches have the same shape, dtype and device. One layer: pass spans of one. On cuda: one
// kernel launch per 256 pairs over every layer's K and V cache when the caches are views of one
// arena at a uniform stride (else a launch per cache per 256 pairs).
OpStatus CopyBlocks(const OpContext& ctx, std::span<const TensorView> key_caches,
                    std::span<const TensorView> value_caches, std::span<const BlockPair> pairs);

// Copies blocks between caches of the same block shape, usually on different devices (swap out:
// device -> host; swap in: host -> device): for every i and pair, dst[i][pair.dst] =
// src[i][pair.src]. src and dst hold the same number of caches (every layer's K and V, in any
// order but the same one); all src caches one shape and device, all dst caches one shape and
// device, with the same block shape and dtype ([num_blocks, ...]; num_blocks may differ between
// src and dst). On cuda: one cudaMemcpyAsync per run of consecutive (src, dst) block ids per
// cache (pairs sorted by src first when src and dst are on different devices); asynchronous
// only when the host caches are pinned.
OpStatus SwapBlocks(const OpContext& ctx, std::span<const TensorView> src,
                    std::span<const TensorView> dst, std::span<const BlockPair> pairs);

// One cache: SwapBlocks over spans of one (kept for existing callers).
OpStatus SwapBlocks(const OpContext& ctx, const TensorView& src, const TensorView& dst,
                    std::span<const BlockPair> pairs);

// Mixture-of-experts routing on the device (the steps of worker_service/model/moe_routing.h,
// which the CPU model runs on the host), for T tokens and E experts:
//   p[t][e] = softmax_e(logits[t][e])            fp32, max-subtracted, summed in expert order
//   token t's choices j = 0 .. k-1: the top k of p[t], largest first, the lower expert on ties;
//   weights[t][j] = p of choice j, or that / sum_j when `normalize` (Mixtral; norm_topk_prob)
// and the T * k (token, choice) pairs sorted by expert, tokens ascending within an expert:
//   offsets[e] .. offsets[e + 1] - 1   the sorted positions of expert e's pairs (offsets[0] = 0,
//                                      offsets[E] = T * k)
//   sorted_tokens[i]                   the token of sorted position i
//   experts[t][j]                      the expert of token t's choice j
//   positions[t][j]                    the sorted position of token t's choice j
// logits f32 [T, E]; offsets i32 [E + 1]; sorted_tokens i32 [T * k]; experts, positions i32
// [T, k]; weights f32 [T, k]; 1 <= k <= E. Deterministic: the same logits give the same outputs.
OpStatus MoeRoute(const OpContext& ctx, const TensorView& offsets, const TensorView& sorted_tokens,
                  const TensorView& experts, const TensorView& weights, const TensorView& positions,
                  const TensorView& logits, int k, bool normalize);

// The mixture's output per token: its k experts' rows, weighted, summed in choice order (no
// atomics: the same inputs give the same bits), plus an optional shared expert gated by a
// sigmoid (Qwen2-MoE):
//   out[t][h] = sum_{j = 0 .. k-1} weights[t][j] * expert_out[positions[t][j]][h]
//               + sigmoid(shared_gate[t]) * shared[t][h]      (when shared is present)
// in fp32, rounded once to out's dtype. expert_out [T * k, H] (the experts' outputs in the
// sorted order of MoeRoute); weights f32 [T, k]; positions i32 [T, k] (each in [0, T * k));
// out [T, H]; shared [T, H] and shared_gate f32 [T, 1] both present or both absent.
// out, expert_out and shared one dtype (f32; on cuda also bf16 or f16). out must not overlap
// the inputs.
OpStatus MoeCombine(const OpContext& ctx, const TensorView& out, const TensorView& expert_out,
                    const TensorView& weights, const TensorView& positions,
                    const TensorView& shared, const TensorView& shared_gate);

}  // namespace llm::ops

#endif  // LLM_KERNELS_OPS_H_
