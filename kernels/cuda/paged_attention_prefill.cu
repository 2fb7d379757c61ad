// Placeholder until the tensor-core prefill kernel lands (issue 17).
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/paged_attention_prefill.h"

namespace llm::ops::cuda {

OpStatus PrefillAttentionMma(const OpContext&, const TensorView&, const TensorView&,
                             const TensorView&, const TensorView&, const AttentionMetadata&,
                             float) {
  return cuda_internal::Error("PagedAttention", "the tensor-core prefill kernel is not built yet");
}

}  // namespace llm::ops::cuda
