// Rotary position embedding (NeoX: rotate halves) on CUDA, in place on query and key (f32, bf16
// or f16 in memory, fp32 math). RotaryEmbeddingCached reads cos and sin from a
// [max_position, rotary_dim] table instead of computing them. One
// thread block per token: cos and sin of the token's half angles go to shared memory (computed
// in double, as the CPU reference does, since positions reach 10^5 and more), then every
// (head, i) pair of the query and key heads is rotated:
//   x[hd][i], x[hd][i + half] <- x[i] cos - x[i + half] sin, x[i + half] cos + x[i] sin
// query and key may be token-strided (kernels/ops.h): token t's heads start at
// data + t * q_stride (k_stride), e.g. views into the fused qkv projection's output.
#include <cmath>
#include <cstring>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/op_check.h"

namespace llm::ops::cuda {
namespace {

using cuda_internal::IndexPtr;

// The inverse frequencies by value, as a kernel parameter (2 KiB): no device buffer to manage.
struct InvFreq {
  double v[kMaxRotaryHalf];
};

// The shape of query and key: heads, head size and the elements between tokens.
struct QkShape {
  int64_t num_heads, num_kv_heads, head_size;
  int64_t q_stride, k_stride;
};

// Rotates every (head, i) pair of token t's query and key heads by cos_s[i], sin_s[i].
template <typename T>
__device__ __forceinline__ void RotateToken(T* __restrict__ query, T* __restrict__ key, int64_t t,
                                            const float* cos_s, const float* sin_s, int half,
                                            const QkShape& sh) {
  const int64_t num_heads = sh.num_heads, head_size = sh.head_size;
  const int64_t num_pairs = (num_heads + sh.num_kv_heads) * half;
  for (int64_t w = threadIdx.x; w < num_pairs; w += blockDim.x) {
    const int64_t hd = w / half;
    const int i = static_cast<int>(w % half);
    // q[t][hd][:] for the first num_heads, then k[t][hd - num_heads][:]
    T* v = hd < num_heads ? query + t * sh.q_stride + hd * head_size
                          : key + t * sh.k_stride + (hd - num_heads) * head_size;
    const float x1 = cuda_internal::ToFloat(v[i]), x2 = cuda_internal::ToFloat(v[i + half]);
    v[i] = cuda_internal::FromFloat<T>(x1 * cos_s[i] - x2 * sin_s[i]);
    v[i + half] = cuda_internal::FromFloat<T>(x2 * cos_s[i] + x1 * sin_s[i]);
  }
}

template <typename T>
__global__ void RotaryKernel(IndexPtr positions, T* __restrict__ query, T* __restrict__ key,
                             InvFreq inv_freq, int half, QkShape sh) {
  __shared__ float cos_s[kMaxRotaryHalf];
  __shared__ float sin_s[kMaxRotaryHalf];
  const int64_t t = blockIdx.x;
  const double pos = static_cast<double>(positions[t]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const double angle = pos * inv_freq.v[i];
    cos_s[i] = static_cast<float>(cos(angle));
    sin_s[i] = static_cast<float>(sin(angle));
  }
  __syncthreads();
  RotateToken(query, key, t, cos_s, sin_s, half, sh);
}

// cos_sin_cache[p] = [cos_0 .. cos_{half-1}, sin_0 .. sin_{half-1}] (read straight from global
// memory: one row, reused by every head). A position outside [0, max_position) writes NaN over
// every element of the token's query and key heads.
template <typename T>
__global__ void RotaryCachedKernel(IndexPtr positions, T* __restrict__ query, T* __restrict__ key,
                                   const float* __restrict__ cos_sin_cache, int64_t max_position,
                                   int half, QkShape sh) {
  const int64_t t = blockIdx.x;
  const int64_t pos = positions[t];
  if (pos < 0 || pos >= max_position) {
    const T nan = cuda_internal::FromFloat<T>(NAN);
    T* q = query + t * sh.q_stride;
    for (int64_t j = threadIdx.x; j < sh.num_heads * sh.head_size; j += blockDim.x) q[j] = nan;
    T* k = key + t * sh.k_stride;
    for (int64_t j = threadIdx.x; j < sh.num_kv_heads * sh.head_size; j += blockDim.x) k[j] = nan;
    return;
  }
  const float* row = cos_sin_cache + pos * 2 * half;
  RotateToken(query, key, t, row, row + half, half, sh);
}

QkShape Shape(const TensorView& query, const TensorView& key) {
  return {query.shape[1], key.shape[1], query.shape[2], internal::TokenStride(query),
          internal::TokenStride(key)};
}

}  // namespace

OpStatus RotaryEmbedding(void* stream, const TensorView& positions, const TensorView& query,
                         const TensorView& key, std::span<const double> inv_freq, int rotary_dim) {
  constexpr const char* kOp = "RotaryEmbedding";
  if (OpStatus st = cuda_internal::StartOp(kOp, query.device); !st.ok()) return st;
  const int64_t num_tokens = positions.shape[0];
  const int64_t num_heads = query.shape[1], num_kv_heads = key.shape[1];
  const int half = rotary_dim / 2;
  if (half > kMaxRotaryHalf || static_cast<int64_t>(inv_freq.size()) != half) {
    return cuda_internal::Error(
        kOp, "the CUDA kernel takes rotary_dim <= " + std::to_string(2 * kMaxRotaryHalf) +
                 ", got " + std::to_string(rotary_dim));
  }
  if (num_tokens == 0 || num_heads + num_kv_heads == 0) return OpStatus::Ok();
  InvFreq freq{};
  std::memcpy(freq.v, inv_freq.data(), half * sizeof(double));
  const bool known = cuda_internal::DispatchFloat(query.dtype, [&](auto tag) {
    using T = decltype(tag);
    ::llm::cuda::Launch(RotaryKernel<T>, static_cast<unsigned>(num_tokens), 128, 0,
                        cuda_internal::AsStream(stream), cuda_internal::AsIndex(positions),
                        query.data_as<T>(), key.data_as<T>(), freq, half, Shape(query, key));
  });
  if (!known) return cuda_internal::Error(kOp, "query: expected f32, bf16 or f16");
  LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  return OpStatus::Ok();
}

OpStatus RotaryEmbeddingCached(void* stream, const TensorView& positions, const TensorView& query,
                               const TensorView& key, const TensorView& cos_sin_cache) {
  constexpr const char* kOp = "RotaryEmbeddingCached";
  if (OpStatus st = cuda_internal::StartOp(kOp, query.device); !st.ok()) return st;
  const int64_t num_tokens = positions.shape[0];
  const int64_t num_heads = query.shape[1], num_kv_heads = key.shape[1];
  const int64_t max_position = cos_sin_cache.shape[0];
  const int half = static_cast<int>(cos_sin_cache.shape[1] / 2);
  if (num_tokens == 0 || num_heads + num_kv_heads == 0) return OpStatus::Ok();
  const bool known = cuda_internal::DispatchFloat(query.dtype, [&](auto tag) {
    using T = decltype(tag);
    ::llm::cuda::Launch(RotaryCachedKernel<T>, static_cast<unsigned>(num_tokens), 128, 0,
                        cuda_internal::AsStream(stream), cuda_internal::AsIndex(positions),
                        query.data_as<T>(), key.data_as<T>(), cos_sin_cache.data_as<const float>(),
                        max_position, half, Shape(query, key));
  });
  if (!known) return cuda_internal::Error(kOp, "query: expected f32, bf16 or f16");
  LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  return OpStatus::Ok();
}

}  // namespace llm::ops::cuda
