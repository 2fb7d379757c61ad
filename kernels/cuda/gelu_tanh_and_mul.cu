// GeluTanhAndMul on CUDA: out[t][i] = gelu_tanh(x[t][i]) * x[t][I + i], f32 / bf16 / f16 in
// memory, fp32 math. gelu_tanh(v) = 0.5 v (1 + tanh(u)), u = sqrt(2 / pi) (v + 0.044715 v^3), as
// the CPU op computes it: v / (1 + expf(-2u)). One thread block per token.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.cuh"

namespace llm::ops::cuda {
namespace {

template <typename T>
__global__ void GeluTanhAndMulKernel(T* __restrict__ out, const T* __restrict__ x, int64_t inter) {
  const int64_t t = blockIdx.x;
  const T* gate = x + t * 2 * inter;  // x[t][0 .. I-1]
  const T* up = gate + inter;         // x[t][I .. 2I-1]
  T* o = out + t * inter;
  for (int64_t i = threadIdx.x; i < inter; i += blockDim.x) {
    const float v = cuda_internal::ToFloat(gate[i]);
    const float arg = v * -1.5957691216057308f * (1.0f + 0.044715f * v * v);  // -2u
    o[i] = cuda_internal::FromFloat<T>(v / (1.0f + expf(arg)) * cuda_internal::ToFloat(up[i]));
  }
}

}  // namespace

OpStatus GeluTanhAndMul(void* stream, const TensorView& out, const TensorView& x) {
  constexpr const char* kOp = "GeluTanhAndMul";
  if (OpStatus st = cuda_internal::StartOp(kOp, out.device); !st.ok()) return st;
  const int64_t num_tokens = x.shape[0], inter = x.shape[1] / 2;
  if (num_tokens == 0 || inter == 0) return OpStatus::Ok();
  if (num_tokens > cuda_internal::kMaxGridX) {
    return cuda_internal::Error(kOp, "x: too many tokens for one grid: " + x.ToString());
  }
  const int threads = cuda_internal::RowThreads(inter > 512 ? 512 : inter);
  const bool known = cuda_internal::DispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    ::llm::cuda::Launch(GeluTanhAndMulKernel<T>, static_cast<unsigned>(num_tokens), threads, 0,
                        cuda_internal::AsStream(stream), out.data_as<T>(), x.data_as<const T>(),
                        inter);
  });
  if (!known) return cuda_internal::Error(kOp, "x: expected f32, bf16 or f16");
  LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  return OpStatus::Ok();
}

}  // namespace llm::ops::cuda
