// Tensor-core prefill attention (FlashAttention-2 style, mma.sync m16n8k16 with fp32
// accumulation) over the paged KV cache, for the rows of sequences with q_len > 1.
//
// Host-only header (no CUDA headers). Internal to kernels/cuda: the PagedAttention dispatcher
// (paged_attention.cu) calls it for 16-bit queries.
#ifndef LLM_KERNELS_CUDA_PAGED_ATTENTION_PREFILL_H_
#define LLM_KERNELS_CUDA_PAGED_ATTENTION_PREFILL_H_

#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace llm::ops::cuda {

// Writes out[t] for every row t of a sequence with q_len > 1 (prefill chunks, causal inside
// the chunk, everything cached before it) and leaves the rows of sequences with q_len == 1
// untouched; options as ops::PagedAttention takes them. query, out: bf16 or f16 [T, Hq, D]
// (query may be token-strided); key_cache,
// value_cache: the query's dtype, [num_blocks, block_size, Hkv, D]; head sizes 64 and 128. Enqueued
// on ctx.stream. The arguments have been checked by ops::PagedAttention.
OpStatus PrefillAttentionMma(const OpContext& ctx, const TensorView& out, const TensorView& query,
                             const TensorView& key_cache, const TensorView& value_cache,
                             const AttentionMetadata& metadata, const AttentionOptions& options);

}  // namespace llm::ops::cuda

#endif  // LLM_KERNELS_CUDA_PAGED_ATTENTION_PREFILL_H_
