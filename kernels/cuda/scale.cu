// Scale on CUDA: x[...] *= factor in place, f32 / bf16 / f16 in memory, fp32 math. A grid-stride
// loop over every element (at most kMaxBlocks blocks of kThreads).
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.cuh"

namespace llm::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

template <typename T>
__global__ void ScaleKernel(T* x, int64_t n, float factor) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    x[i] = cuda_internal::FromFloat<T>(cuda_internal::ToFloat(x[i]) * factor);
  }
}

}  // namespace

OpStatus Scale(void* stream, const TensorView& x, float factor) {
  constexpr const char* kOp = "Scale";
  if (OpStatus st = cuda_internal::StartOp(kOp, x.device); !st.ok()) return st;
  const int64_t n = x.numel();
  if (n == 0) return OpStatus::Ok();
  const int64_t want = (n + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(want < kMaxBlocks ? want : kMaxBlocks);
  const bool known = cuda_internal::DispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    ::llm::cuda::Launch(ScaleKernel<T>, blocks, kThreads, 0, cuda_internal::AsStream(stream),
                        x.data_as<T>(), n, factor);
  });
  if (!known) return cuda_internal::Error(kOp, "x: expected f32, bf16 or f16");
  LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  return OpStatus::Ok();
}

}  // namespace llm::ops::cuda
