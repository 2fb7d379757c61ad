// Embedding gather on CUDA: out[t][h] = table[token_ids[t]][h] (f32, bf16 or f16: a copy, bit
// for bit). One thread block per token.
#include <cmath>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.cuh"

namespace llm::ops::cuda {
namespace {

using cuda_internal::IndexPtr;

// Block t copies row token_ids[t] of table into row t of out; an id outside [0, vocab) gives
// a NaN row (the host cannot see the ids without a synchronization).
template <typename T>
__global__ void EmbeddingKernel(T* __restrict__ out, IndexPtr token_ids,
                                const T* __restrict__ table, int64_t vocab, int64_t hidden) {
  const int64_t t = blockIdx.x;
  const int64_t id = token_ids[t];
  T* o = out + t * hidden;  // out[t][:]
  if (id < 0 || id >= vocab) {
    const T nan = cuda_internal::FromFloat<T>(NAN);
    for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) o[h] = nan;
    return;
  }
  const T* row = table + id * hidden;  // table[id][:]
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) o[h] = row[h];
}

}  // namespace

OpStatus Embedding(void* stream, const TensorView& out, const TensorView& token_ids,
                   const TensorView& table) {
  constexpr const char* kOp = "Embedding";
  if (OpStatus st = cuda_internal::StartOp(kOp, out.device); !st.ok()) return st;
  const int64_t num_tokens = token_ids.shape[0];
  const int64_t vocab = table.shape[0], hidden = table.shape[1];
  if (num_tokens == 0 || hidden == 0) return OpStatus::Ok();
  const int threads = cuda_internal::RowThreads(hidden > 256 ? 256 : hidden);
  const bool known = cuda_internal::DispatchFloat(table.dtype, [&](auto tag) {
    using T = decltype(tag);
    ::llm::cuda::Launch(EmbeddingKernel<T>, static_cast<unsigned>(num_tokens), threads, 0,
                        cuda_internal::AsStream(stream), out.data_as<T>(),
                        cuda_internal::AsIndex(token_ids), table.data_as<const T>(), vocab, hidden);
  });
  if (!known) return cuda_internal::Error(kOp, "table: expected f32, bf16 or f16");
  LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  return OpStatus::Ok();
}

}  // namespace llm::ops::cuda
