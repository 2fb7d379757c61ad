// The SIMT paged-attention kernels (paged_attention.cu: v1, v2 split-K with its reduction, and
// the tiled prefill kernel), for every query dtype and head size they take.
//
// Host-only header (no CUDA headers). Internal to kernels/cuda: the PagedAttention dispatcher
// (paged_attention.cu) calls it for what the tensor-core kernels do not take.
#ifndef LLM_KERNELS_CUDA_PAGED_ATTENTION_SIMT_H_
#define LLM_KERNELS_CUDA_PAGED_ATTENTION_SIMT_H_

#include "kernels/cuda/paged_attention_plan.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace llm::ops::cuda {

// What ops::cuda::PagedAttention (cuda_ops.h) does, versions and workspace included, on the
// SIMT kernels: scores, softmax and sums in fp32, the output rounded to its dtype once.
// query, out: f32, f16 or bf16 [T, Hq, D], the same dtype; key_cache, value_cache: f32, f16 or
// bf16 [num_blocks, block_size, Hkv, D] for an f32 query, the query's dtype for a 16-bit one
// (else an error); head sizes 16, 32, 64 and 128 (else an error). Enqueued on ctx.stream. The
// arguments' shapes have been checked by ops::PagedAttention.
OpStatus PagedAttentionSimt(const OpContext& ctx, const TensorView& out, const TensorView& query,
                            const TensorView& key_cache, const TensorView& value_cache,
                            const AttentionMetadata& metadata, const AttentionOptions& options,
                            PagedAttentionVersion version);

}  // namespace llm::ops::cuda

#endif  // LLM_KERNELS_CUDA_PAGED_ATTENTION_SIMT_H_
