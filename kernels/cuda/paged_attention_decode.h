// The 16-bit decode attention kernel (paged_attention_decode.cu): the rows of sequences with
// q_len == 1, GQA-shared and split over the context as PlanDecode (paged_attention_plan.h)
// says.
//
// Host-only header (no CUDA headers). Internal to kernels/cuda: the PagedAttention dispatcher
// (paged_attention.cu) calls it for 16-bit queries.
#ifndef LLM_KERNELS_CUDA_PAGED_ATTENTION_DECODE_H_
#define LLM_KERNELS_CUDA_PAGED_ATTENTION_DECODE_H_

#include "kernels/cuda/paged_attention_plan.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace llm::ops::cuda {

// Writes out[t] for the row t of every sequence with q_len == 1 and leaves the other rows
// untouched. query, out, key_cache, value_cache: all bf16 or all f16, 16-byte aligned (the
// query may be token-strided, its token stride a multiple of 16 bytes); head
// sizes 64 and 128; `plan` from PlanDecode for this batch, whose partials (num_splits > 1) go
// to ctx.workspace (an error when it is smaller than plan.workspace_bytes). Enqueued on
// ctx.stream; options as ops::PagedAttention takes them (the plan made with their window). The
// arguments have been checked by ops::PagedAttention.
OpStatus DecodeAttention(const OpContext& ctx, const TensorView& out, const TensorView& query,
                         const TensorView& key_cache, const TensorView& value_cache,
                         const AttentionMetadata& metadata, const AttentionOptions& options,
                         const DecodePlan& plan);

}  // namespace llm::ops::cuda

#endif  // LLM_KERNELS_CUDA_PAGED_ATTENTION_DECODE_H_
