// RMSNorm and the fused residual add + RMSNorm on CUDA. One thread block per token row; the
// sum of squares is a block reduction in fp32 (the CPU reference sums in double).
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.cuh"

namespace llm::ops::cuda {
namespace {

constexpr int kMaxThreads = 1024;

// out[t][h] = x[t][h] * rsqrt(mean_h(x[t][h]^2) + eps) * w[h]. out may be x: each thread
// writes only the elements it read, after the reduction.
__global__ void RmsNormKernel(float* out, const float* x, const float* __restrict__ w,
                              int64_t hidden, float eps) {
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  const float* xr = x + t * hidden;
  float sum_sq = 0.0f;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) sum_sq += xr[h] * xr[h];
  sum_sq = cuda_internal::BlockSum(sum_sq, scratch);
  const float inv_rms = rsqrtf(sum_sq / static_cast<float>(hidden) + eps);
  float* o = out + t * hidden;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) o[h] = xr[h] * inv_rms * w[h];
}

// residual[t][h] += x[t][h]; x[t][h] = rmsnorm(residual[t])[h] * w[h].
__global__ void FusedAddRmsNormKernel(float* x, float* residual, const float* __restrict__ w,
                                      int64_t hidden, float eps) {
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  float* xr = x + t * hidden;
  float* rr = residual + t * hidden;
  float sum_sq = 0.0f;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    const float r = rr[h] + xr[h];
    rr[h] = r;
    sum_sq += r * r;
  }
  sum_sq = cuda_internal::BlockSum(sum_sq, scratch);  // also orders the writes above
  const float inv_rms = rsqrtf(sum_sq / static_cast<float>(hidden) + eps);
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) xr[h] = rr[h] * inv_rms * w[h];
}

}  // namespace

OpStatus RmsNorm(void* stream, const TensorView& out, const TensorView& x, const TensorView& weight,
                 float eps) {
  constexpr const char* kOp = "RmsNorm";
  if (OpStatus st = cuda_internal::StartOp(kOp, x.device); !st.ok()) return st;
  const int64_t num_tokens = x.shape[0], hidden = x.shape[1];
  if (num_tokens == 0 || hidden == 0) return OpStatus::Ok();
  const int threads = cuda_internal::RowThreads(hidden > kMaxThreads ? kMaxThreads : hidden);
  ::llm::cuda::Launch(RmsNormKernel, static_cast<unsigned>(num_tokens), threads, 0,
                      cuda_internal::AsStream(stream), out.data_as<float>(),
                      x.data_as<const float>(), weight.data_as<const float>(), hidden, eps);
  LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  return OpStatus::Ok();
}

OpStatus FusedAddRmsNorm(void* stream, const TensorView& x, const TensorView& residual,
                         const TensorView& weight, float eps) {
  constexpr const char* kOp = "FusedAddRmsNorm";
  if (OpStatus st = cuda_internal::StartOp(kOp, x.device); !st.ok()) return st;
  const int64_t num_tokens = x.shape[0], hidden = x.shape[1];
  if (num_tokens == 0 || hidden == 0) return OpStatus::Ok();
  const int threads = cuda_internal::RowThreads(hidden > kMaxThreads ? kMaxThreads : hidden);
  ::llm::cuda::Launch(FusedAddRmsNormKernel, static_cast<unsigned>(num_tokens), threads, 0,
                      cuda_internal::AsStream(stream), x.data_as<float>(),
                      residual.data_as<float>(), weight.data_as<const float>(), hidden, eps);
  LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  return OpStatus::Ok();
}

}  // namespace llm::ops::cuda
