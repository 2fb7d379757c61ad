// RMSNorm, the fused residual add + RMSNorm and the per-head RMSNorm of q and k on CUDA,
// f32 / bf16 / f16 in memory, fp32 math. RmsNorm and FusedAddRmsNorm: one thread block per token
// row, the sum of squares a block reduction in fp32 (the CPU reference sums in double).
// HeadRmsNorm: one warp per head vector, the sum of squares a warp reduction. SumOfSquares and
// RmsNormBySums (a norm split over ranks): one thread block per token.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/op_check.h"

namespace llm::ops::cuda {
namespace {

using cuda_internal::FromFloat;
using cuda_internal::ToFloat;

constexpr int kMaxThreads = 1024;

// out[t][h] = x[t][h] * rsqrt(mean_h(x[t][h]^2) + eps) * w[h]. out may be x: each thread
// writes only the elements it read, after the reduction.
template <typename T>
__global__ void RmsNormKernel(T* out, const T* x, const T* __restrict__ w, int64_t hidden,
                              float eps) {
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  const T* xr = x + t * hidden;
  float sum_sq = 0.0f;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    const float v = ToFloat(xr[h]);
    sum_sq += v * v;
  }
  sum_sq = cuda_internal::BlockSum(sum_sq, scratch);
  const float inv_rms = rsqrtf(sum_sq / static_cast<float>(hidden) + eps);
  T* o = out + t * hidden;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    o[h] = FromFloat<T>(ToFloat(xr[h]) * inv_rms * ToFloat(w[h]));
  }
}

// residual[t][h] += x[t][h] (rounded to T and stored); x[t][h] = rmsnorm(residual[t])[h] * w[h],
// the norm over the stored (rounded) residual, as vLLM's fused_add_rms_norm does.
template <typename T>
__global__ void FusedAddRmsNormKernel(T* x, T* residual, const T* __restrict__ w, int64_t hidden,
                                      float eps) {
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  T* xr = x + t * hidden;
  T* rr = residual + t * hidden;
  float sum_sq = 0.0f;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    const T r = FromFloat<T>(ToFloat(rr[h]) + ToFloat(xr[h]));
    rr[h] = r;
    const float rf = ToFloat(r);
    sum_sq += rf * rf;
  }
  sum_sq = cuda_internal::BlockSum(sum_sq, scratch);  // also orders the writes above
  const float inv_rms = rsqrtf(sum_sq / static_cast<float>(hidden) + eps);
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    xr[h] = FromFloat<T>(ToFloat(rr[h]) * inv_rms * ToFloat(w[h]));
  }
}

constexpr int kHeadWarps = 4;  // head vectors per thread block of HeadRmsNormKernel

// Head vector r = t * num_heads + h of x (token t's heads at x + t * token_stride), normalized in
// place by warp r % kHeadWarps of block r / kHeadWarps: RmsNormKernel's arithmetic over D. Each
// lane writes only the elements it read, after the reduction; nothing between token rows is
// touched.
template <typename T>
__global__ void HeadRmsNormKernel(T* x, const T* __restrict__ w, int64_t num_rows,
                                  int64_t num_heads, int64_t head_size, int64_t token_stride,
                                  float eps) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kHeadWarps + threadIdx.x / 32;
  if (r >= num_rows) return;  // the whole warp: no block-wide barrier follows
  const int lane = threadIdx.x % 32;
  T* v = x + (r / num_heads) * token_stride + (r % num_heads) * head_size;
  float sum_sq = 0.0f;
  for (int64_t d = lane; d < head_size; d += 32) {
    const float f = ToFloat(v[d]);
    sum_sq += f * f;
  }
  sum_sq = cuda_internal::WarpSum(sum_sq);
  const float inv_rms = rsqrtf(sum_sq / static_cast<float>(head_size) + eps);
  for (int64_t d = lane; d < head_size; d += 32) {
    v[d] = FromFloat<T>(ToFloat(v[d]) * inv_rms * ToFloat(w[d]));
  }
}

// sums[t] = the sum of squares of token t's row of `row` elements (its heads, contiguous, at
// x + t * token_stride): one thread block per token, a block reduction in fp32.
template <typename T>
__global__ void SumOfSquaresKernel(float* sums, const T* x, int64_t row, int64_t token_stride) {
  __shared__ float scratch[32];
  const T* v = x + static_cast<int64_t>(blockIdx.x) * token_stride;
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    const float f = ToFloat(v[i]);
    sum_sq += f * f;
  }
  sum_sq = cuda_internal::BlockSum(sum_sq, scratch);
  if (threadIdx.x == 0) sums[blockIdx.x] = sum_sq;
}

// x[t][i] = x[t][i] * rsqrt(sums[t] / count + eps) * w[i] over token t's row: one thread block
// per token.
template <typename T>
__global__ void RmsNormBySumsKernel(T* x, const float* sums, const T* __restrict__ w, int64_t row,
                                    int64_t token_stride, float count, float eps) {
  T* v = x + static_cast<int64_t>(blockIdx.x) * token_stride;
  const float inv_rms = rsqrtf(sums[blockIdx.x] / count + eps);
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    v[i] = FromFloat<T>(ToFloat(v[i]) * inv_rms * ToFloat(w[i]));
  }
}

}  // namespace

OpStatus RmsNorm(void* stream, const TensorView& out, const TensorView& x, const TensorView& weight,
                 float eps) {
  constexpr const char* kOp = "RmsNorm";
  if (OpStatus st = cuda_internal::StartOp(kOp, x.device); !st.ok()) return st;
  const int64_t num_tokens = x.shape[0], hidden = x.shape[1];
  if (num_tokens == 0 || hidden == 0) return OpStatus::Ok();
  const int threads = cuda_internal::RowThreads(hidden > kMaxThreads ? kMaxThreads : hidden);
  const bool known = cuda_internal::DispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    ::llm::cuda::Launch(RmsNormKernel<T>, static_cast<unsigned>(num_tokens), threads, 0,
                        cuda_internal::AsStream(stream), out.data_as<T>(), x.data_as<const T>(),
                        weight.data_as<const T>(), hidden, eps);
  });
  if (!known) return cuda_internal::Error(kOp, "x: expected f32, bf16 or f16");
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
  const bool known = cuda_internal::DispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    ::llm::cuda::Launch(FusedAddRmsNormKernel<T>, static_cast<unsigned>(num_tokens), threads, 0,
                        cuda_internal::AsStream(stream), x.data_as<T>(), residual.data_as<T>(),
                        weight.data_as<const T>(), hidden, eps);
  });
  if (!known) return cuda_internal::Error(kOp, "x: expected f32, bf16 or f16");
  LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  return OpStatus::Ok();
}

OpStatus HeadRmsNorm(void* stream, const TensorView& x, const TensorView& weight, float eps) {
  constexpr const char* kOp = "HeadRmsNorm";
  if (OpStatus st = cuda_internal::StartOp(kOp, x.device); !st.ok()) return st;
  const int64_t num_heads = x.shape[1], head_size = x.shape[2];
  const int64_t num_rows = x.shape[0] * num_heads;
  if (num_rows == 0 || head_size == 0) return OpStatus::Ok();
  const int64_t blocks = (num_rows + kHeadWarps - 1) / kHeadWarps;
  if (blocks > cuda_internal::kMaxGridX) {
    return cuda_internal::Error(kOp, "x: too many head vectors for one grid: " + x.ToString());
  }
  const int64_t token_stride = internal::TokenStride(x);
  const bool known = cuda_internal::DispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    ::llm::cuda::Launch(HeadRmsNormKernel<T>, static_cast<unsigned>(blocks), kHeadWarps * 32, 0,
                        cuda_internal::AsStream(stream), x.data_as<T>(), weight.data_as<const T>(),
                        num_rows, num_heads, head_size, token_stride, eps);
  });
  if (!known) return cuda_internal::Error(kOp, "x: expected f32, bf16 or f16");
  LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  return OpStatus::Ok();
}

OpStatus SumOfSquares(void* stream, const TensorView& sums, const TensorView& x) {
  constexpr const char* kOp = "SumOfSquares";
  if (OpStatus st = cuda_internal::StartOp(kOp, x.device); !st.ok()) return st;
  const int64_t num_tokens = x.shape[0], row = x.shape[1] * x.shape[2];
  if (num_tokens == 0) return OpStatus::Ok();
  if (num_tokens > cuda_internal::kMaxGridX) {
    return cuda_internal::Error(kOp, "x: too many tokens for one grid: " + x.ToString());
  }
  const int threads = cuda_internal::RowThreads(row > kMaxThreads ? kMaxThreads : row);
  const int64_t token_stride = internal::TokenStride(x);
  const bool known = cuda_internal::DispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    ::llm::cuda::Launch(SumOfSquaresKernel<T>, static_cast<unsigned>(num_tokens), threads, 0,
                        cuda_internal::AsStream(stream), sums.data_as<float>(),
                        x.data_as<const T>(), row, token_stride);
  });
  if (!known) return cuda_internal::Error(kOp, "x: expected f32, bf16 or f16");
  LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  return OpStatus::Ok();
}

OpStatus RmsNormBySums(void* stream, const TensorView& x, const TensorView& sums,
                       const TensorView& weight, int64_t count, float eps) {
  constexpr const char* kOp = "RmsNormBySums";
  if (OpStatus st = cuda_internal::StartOp(kOp, x.device); !st.ok()) return st;
  const int64_t num_tokens = x.shape[0], row = x.shape[1] * x.shape[2];
  if (num_tokens == 0 || row == 0) return OpStatus::Ok();
  if (num_tokens > cuda_internal::kMaxGridX) {
    return cuda_internal::Error(kOp, "x: too many tokens for one grid: " + x.ToString());
  }
  const int threads = cuda_internal::RowThreads(row > kMaxThreads ? kMaxThreads : row);
  const int64_t token_stride = internal::TokenStride(x);
  const bool known = cuda_internal::DispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    ::llm::cuda::Launch(RmsNormBySumsKernel<T>, static_cast<unsigned>(num_tokens), threads, 0,
                        cuda_internal::AsStream(stream), x.data_as<T>(),
                        sums.data_as<const float>(), weight.data_as<const T>(), row, token_stride,
                        static_cast<float>(count), eps);
  });
  if (!known) return cuda_internal::Error(kOp, "x: expected f32, bf16 or f16");
  LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  return OpStatus::Ok();
}

}  // namespace llm::ops::cuda
