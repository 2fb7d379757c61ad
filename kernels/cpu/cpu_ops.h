// The CPU backend: one function per op of kernels/ops.h, one file each (kernels/cpu/<op>.cc).
// kernels/ops.cc has already checked ranks, shapes, dtypes, layouts and devices; these
// check what only the data can tell (token ids, slots, block ids, lengths) and return an
// error naming the bad value instead of reading or writing out of bounds.
//
// fp32 compute. Internal to kernels/: callers use kernels/ops.h.
#ifndef LLM_KERNELS_CPU_CPU_OPS_H_
#define LLM_KERNELS_CPU_CPU_OPS_H_

#include <span>

#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace llm::ops::cpu {

OpStatus Embedding(const TensorView& out, const TensorView& token_ids, const TensorView& table);

OpStatus RmsNorm(const TensorView& out, const TensorView& x, const TensorView& weight, float eps);

OpStatus FusedAddRmsNorm(const TensorView& x, const TensorView& residual, const TensorView& weight,
                         float eps);

// x may be token-strided (kernels/op_check.h: TokenStride).
OpStatus HeadRmsNorm(const TensorView& x, const TensorView& weight, float eps);
OpStatus SumOfSquares(const TensorView& sums, const TensorView& x);
OpStatus RmsNormBySums(const TensorView& x, const TensorView& sums, const TensorView& weight,
                       int64_t count, float eps);

// inv_freq: rotary_dim / 2 frequencies from ComputeRopeInvFreq.
OpStatus RotaryEmbedding(const TensorView& positions, const TensorView& query,
                         const TensorView& key, std::span<const double> inv_freq, int rotary_dim);

// cos_sin_cache f32 [max_position, rotary_dim]; a position outside it is an error.
OpStatus RotaryEmbeddingCached(const TensorView& positions, const TensorView& query,
                               const TensorView& key, const TensorView& cos_sin_cache);

OpStatus SiluAndMul(const TensorView& out, const TensorView& x);

OpStatus GeluTanhAndMul(const TensorView& out, const TensorView& x);

// kernels/ops.h's MoeRoute and MoeCombine, the reference loops (cpu/moe.cc).
OpStatus MoeRoute(const TensorView& offsets, const TensorView& sorted_tokens,
                  const TensorView& experts, const TensorView& weights, const TensorView& positions,
                  const TensorView& logits, int k, bool normalize);
OpStatus MoeCombine(const TensorView& out, const TensorView& expert_out, const TensorView& weights,
                    const TensorView& positions, const TensorView& shared,
                    const TensorView& shared_gate);

OpStatus Scale(const TensorView& x, float factor);

OpStatus Softcap(const TensorView& x, float cap);

OpStatus Linear(const TensorView& out, const TensorView& x, const TensorView& weight,
                const TensorView& bias);

OpStatus ReshapeAndCache(const TensorView& key, const TensorView& value,
                         const TensorView& key_cache, const TensorView& value_cache,
                         const TensorView& slot_mapping);

// Blocked flash-style (tiles of query rows x keys, online softmax), GQA groups together, on
// the OpenMP pool over (sequence, kv head, query tile) work items. f32 caches: AVX-512 where the
// CPU has it and the head size is a multiple of 16; bf16 caches: bf16 x bf16 products summed in
// f32 (vdpbf16ps) where the CPU has AVX512_BF16 and the head size is a multiple of 32, with the
// scaled query and the softmax weights rounded to bf16 (see paged_attention.cc); else, where the
// CPU has AVX2 and FMA and the head size is a multiple of 8, the portable algorithm vectorized
// over the head dimension and the tile's keys (either cache dtype); else PagedAttentionPortable's
// loops. Each thread keeps its scratch between calls (no allocation
// once grown). A sliding window starts each work item's keys at its first row's window (the
// blocks before it are never read) and masks the keys before each later row's; a softcap caps
// each tile's scaled scores before its online-softmax step. The float overloads here take
// options {scale}.
OpStatus PagedAttention(const TensorView& out, const TensorView& query, const TensorView& key_cache,
                        const TensorView& value_cache, const AttentionMetadata& metadata,
                        const AttentionOptions& options);
OpStatus PagedAttention(const TensorView& out, const TensorView& query, const TensorView& key_cache,
                        const TensorView& value_cache, const AttentionMetadata& metadata,
                        float scale);

// The threads PagedAttention uses at most, process-wide: n > 0, or 0 for OpenMP's
// omp_get_max_threads() of the calling thread (the default).
void SetPagedAttentionThreads(int n);

// The same tiled algorithm in portable loops (std::exp), any head size: the fallback, exposed
// so that tests cover it on AVX-512 machines too.
OpStatus PagedAttentionPortable(const TensorView& out, const TensorView& query,
                                const TensorView& key_cache, const TensorView& value_cache,
                                const AttentionMetadata& metadata, const AttentionOptions& options);
OpStatus PagedAttentionPortable(const TensorView& out, const TensorView& query,
                                const TensorView& key_cache, const TensorView& value_cache,
                                const AttentionMetadata& metadata, float scale);

// The simple reference the others (and the CUDA kernels) are checked against: one query row
// and kv head at a time, one block of keys per online-softmax step (from the block of the
// row's window start), single-threaded.
OpStatus PagedAttentionReference(const TensorView& out, const TensorView& query,
                                 const TensorView& key_cache, const TensorView& value_cache,
                                 const AttentionMetadata& metadata,
                                 const AttentionOptions& options);
OpStatus PagedAttentionReference(const TensorView& out, const TensorView& query,
                                 const TensorView& key_cache, const TensorView& value_cache,
                                 const AttentionMetadata& metadata, float scale);

OpStatus CopyBlocks(std::span<const TensorView> key_caches,
                    std::span<const TensorView> value_caches, std::span<const BlockPair> pairs);

OpStatus SwapBlocks(std::span<const TensorView> src, std::span<const TensorView> dst,
                    std::span<const BlockPair> pairs);

}  // namespace llm::ops::cpu

#endif  // LLM_KERNELS_CPU_CPU_OPS_H_
