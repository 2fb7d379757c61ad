// The CUDA backend: one launcher per op of kernels/ops.h, one file each
// (kernels/cuda/<op>.cu: the kernels first, then the launcher). kernels/ops.cc has already
// checked ranks, shapes, dtypes, layouts and devices; the launchers check what the kernels
// need beyond that (supported head sizes, sizes that fit a grid) and every CUDA call, and
// return an error naming the op, the file and the line.
//
// Host-only header (no CUDA headers): `stream` is a cudaStream_t (null = the default
// stream). Every launcher only enqueues work on `stream`; the caller synchronizes.
//
// Data-dependent values (token ids, slots, block ids, lengths) live on the device, where the
// host cannot check them without a synchronization. The kernels never read or write outside
// the tensors for any such value: an out-of-range token id gives a NaN row of Embedding, an
// out-of-range slot is skipped by ReshapeAndCache (as -1 padding is), and a block id or length
// outside the cache or the block table gives NaN rows of PagedAttention, and a position outside
// the cos_sin_cache gives NaN rows (all heads of that token) of RotaryEmbeddingCached. The CPU
// backend reports the same inputs as errors.
//
// Dtypes: activations f32, bf16 or f16 (kernels/ops.h says which tensors share one). Every
// kernel is templated on the element type (one instantiation per dtype), loads with
// cuda_internal::ToFloat, computes in fp32 and stores with cuda_internal::FromFloat (round to
// nearest even). PagedAttention has a 16-bit path of its own (paged_attention_plan.h).
// Internal to kernels/: callers use kernels/ops.h.
#ifndef LLM_KERNELS_CUDA_CUDA_OPS_H_
#define LLM_KERNELS_CUDA_CUDA_OPS_H_

#include <span>

#include "kernels/cuda/paged_attention_plan.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace llm::ops::cuda {

OpStatus Embedding(void* stream, const TensorView& out, const TensorView& token_ids,
                   const TensorView& table);

OpStatus RmsNorm(void* stream, const TensorView& out, const TensorView& x, const TensorView& weight,
                 float eps);

OpStatus FusedAddRmsNorm(void* stream, const TensorView& x, const TensorView& residual,
                         const TensorView& weight, float eps);

// One warp per head vector (x may be token-strided), 4 warps a block.
OpStatus HeadRmsNorm(void* stream, const TensorView& x, const TensorView& weight, float eps);
OpStatus SumOfSquares(void* stream, const TensorView& sums, const TensorView& x);
OpStatus RmsNormBySums(void* stream, const TensorView& x, const TensorView& sums,
                       const TensorView& weight, int64_t count, float eps);

// inv_freq: rotary_dim / 2 (at most kMaxRotaryHalf) frequencies from ComputeRopeInvFreq.
inline constexpr int kMaxRotaryHalf = 256;
OpStatus RotaryEmbedding(void* stream, const TensorView& positions, const TensorView& query,
                         const TensorView& key, std::span<const double> inv_freq, int rotary_dim);

// One thread block per token; cos and sin read from cos_sin_cache (f32 [max_position,
// rotary_dim], any rotary_dim the op allows).
OpStatus RotaryEmbeddingCached(void* stream, const TensorView& positions, const TensorView& query,
                               const TensorView& key, const TensorView& cos_sin_cache);

OpStatus SiluAndMul(void* stream, const TensorView& out, const TensorView& x);

OpStatus GeluTanhAndMul(void* stream, const TensorView& out, const TensorView& x);

// MoeRoute: one thread per token for the softmax and top-k (E and k in that thread's loops:
// the arithmetic of moe_routing.cc), then one thread block that counts, scans and places the
// T * k pairs (a thread per expert for the counts, the placement in token order).
OpStatus MoeRoute(void* stream, const TensorView& offsets, const TensorView& sorted_tokens,
                  const TensorView& experts, const TensorView& weights, const TensorView& positions,
                  const TensorView& logits, int k, bool normalize);

// MoeCombine: one thread block per token, threads over H; each element sums its k rows in order.
OpStatus MoeCombine(void* stream, const TensorView& out, const TensorView& expert_out,
                    const TensorView& weights, const TensorView& positions,
                    const TensorView& shared, const TensorView& shared_gate);

// Scale and Softcap: grid-stride loops over every element, in place.
OpStatus Scale(void* stream, const TensorView& x, float factor);

OpStatus Softcap(void* stream, const TensorView& x, float cap);

// cublasLtMatmul on ctx.blaslt_handle (a cublasLtHandle_t created with the tensors' device
// current, owned by the caller; null is an error naming the op) and ctx.stream, with fp32
// accumulation: CUBLAS_COMPUTE_32F_PEDANTIC for f32 (never TF32), CUBLAS_COMPUTE_32F for bf16 /
// f16; bias fused as CUBLASLT_EPILOGUE_BIAS; the heuristic's best algorithm within
// ctx.blas_workspace_bytes of ctx.blas_workspace. K = 0: out = bias (or 0) by a small kernel.
// The descriptors and the heuristic's algorithm are planned once per (handle, m, n, k, dtypes,
// compute type, bias and its dtype, the pointers' alignments, workspace bytes) and cached,
// process-wide and thread-safe, up to 1024 plans (then the least recently used is dropped); the
// bias pointer is set on the cached descriptor per call.
OpStatus Linear(const OpContext& ctx, const TensorView& out, const TensorView& x,
                const TensorView& weight, const TensorView& bias);

// Linear's plan cache, process-wide: plans cached now, and the calls (K > 0, m, n > 0) that
// found their plan (hits) or had to build it (misses) since the process started.
struct LinearPlanStats {
  int64_t plans = 0;
  int64_t hits = 0;
  int64_t misses = 0;
};
LinearPlanStats GetLinearPlanStats();

// Drops the cached plans of a cuBLASLt handle (every plan for null). Call it before
// cublasLtDestroy (cuda::BlasLtDestroy does): a later handle may get the same address, and its
// calls must not find the old handle's plans.
void ClearLinearPlans(void* blaslt_handle);

OpStatus ReshapeAndCache(void* stream, const TensorView& key, const TensorView& value,
                         const TensorView& key_cache, const TensorView& value_cache,
                         const TensorView& slot_mapping);

// Two paths, by the query's dtype (paged_attention.cu):
// - 16-bit (query, out and both caches all bf16 or all f16; kAuto only): the rows of sequences
//   with q_len == 1 go to the GQA-shared split-KV decode kernel (paged_attention_decode.cu; its
//   split planned by PlanDecode from the SM count and metadata.seq_lens_host or max_seq_len,
//   its partials in ctx.workspace: less workspace splits less), the rows of sequences with
//   q_len > 1 to PrefillAttentionMma (launched only when the batch has such rows; without
//   metadata.query_start_loc_host, whenever T > S).
// - fp32 (f32 query and out; f32, f16 or bf16 caches): kV1 and kV2 run every query row, prefill
//   and decode alike, through the row kernels: row t of sequence s (found by a binary search of
//   query_start_loc) attends to positions 0 .. seq_lens[s] - q_len + j on its own. kAuto runs
//   the rows of prefill chunks (q_len > 1) through a tiled, flash-attention-style kernel instead
//   (16 query rows per thread block share each K and V load, causal inside the chunk) and the
//   decode rows through v1 or v2; with metadata.query_start_loc_host it launches only the
//   kernels the batch has rows for. Versions and the launch plan: paged_attention_plan.h. v2
//   uses ctx.workspace (never allocates); kV2 without enough of it is an error, kAuto then runs
//   v1.
// options' sliding window and softcap in every kernel: each starts its keys at its first row's
// window (the blocks before are not read; v2 and the decode split partition only the window)
// and caps the scaled scores before its online softmax.
// Head sizes 64 and 128; any block size. Runs on ctx.stream.
OpStatus PagedAttention(const OpContext& ctx, const TensorView& out, const TensorView& query,
                        const TensorView& key_cache, const TensorView& value_cache,
                        const AttentionMetadata& metadata, const AttentionOptions& options,
                        PagedAttentionVersion version = PagedAttentionVersion::kAuto);
// The same with options {scale}.
OpStatus PagedAttention(const OpContext& ctx, const TensorView& out, const TensorView& query,
                        const TensorView& key_cache, const TensorView& value_cache,
                        const AttentionMetadata& metadata, float scale,
                        PagedAttentionVersion version = PagedAttentionVersion::kAuto);

// One CopyBlocksKernel launch per chunk of up to 256 pairs (block ids by value in the kernel
// parameters) over all 2L caches when they are equal-shaped views at a uniform address stride
// (one arena), else one per cache per chunk; 16-byte loads and stores when blocks and bases are
// 16-byte aligned. Pairs that depend on each other (a block written twice, or written and read)
// fall back to a cudaMemcpyAsync per (pair, cache), in order.
OpStatus CopyBlocks(void* stream, std::span<const TensorView> key_caches,
                    std::span<const TensorView> value_caches, std::span<const BlockPair> pairs);

// Between a cuda side and a host (pinned for an asynchronous copy) or cuda side, every cache:
// the pairs (sorted by src when src and dst are on different devices, so that the order cannot
// matter) are coalesced into runs of consecutive src and dst block ids, and each run is one
// cudaMemcpyAsync per cache (cudaMemcpyDefault: direction from the pointers).
OpStatus SwapBlocks(void* stream, std::span<const TensorView> src, std::span<const TensorView> dst,
                    std::span<const BlockPair> pairs);

}  // namespace llm::ops::cuda

#endif  // LLM_KERNELS_CUDA_CUDA_OPS_H_
