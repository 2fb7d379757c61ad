// Rotary position embedding (NeoX: rotate halves) on CUDA, in place on query and key. One
// thread block per token: cos and sin of the token's half angles go to shared memory (computed
// in double, as the CPU reference does, since positions reach 10^5 and more), then every
// (head, i) pair of the query and key heads is rotated:
//   x[hd][i], x[hd][i + half] <- x[i] cos - x[i + half] sin, x[i + half] cos + x[i] sin
#include <cstring>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.cuh"

namespace llm::ops::cuda {
namespace {

using cuda_internal::IndexPtr;

// The inverse frequencies by value, as a kernel parameter (2 KiB): no device buffer to manage.
struct InvFreq {
  double v[kMaxRotaryHalf];
};

__global__ void RotaryKernel(IndexPtr positions, float* __restrict__ query, float* __restrict__ key,
                             InvFreq inv_freq, int half, int64_t num_heads, int64_t num_kv_heads,
                             int64_t head_size) {
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
  const int64_t num_pairs = (num_heads + num_kv_heads) * half;
  for (int64_t w = threadIdx.x; w < num_pairs; w += blockDim.x) {
    const int64_t hd = w / half;
    const int i = static_cast<int>(w % half);
    // q[t][hd][:] for the first num_heads, then k[t][hd - num_heads][:]
    float* v = hd < num_heads ? query + (t * num_heads + hd) * head_size
                              : key + (t * num_kv_heads + (hd - num_heads)) * head_size;
    const float x1 = v[i], x2 = v[i + half];
    v[i] = x1 * cos_s[i] - x2 * sin_s[i];
    v[i + half] = x2 * cos_s[i] + x1 * sin_s[i];
  }
}

}  // namespace

OpStatus RotaryEmbedding(void* stream, const TensorView& positions, const TensorView& query,
                         const TensorView& key, std::span<const double> inv_freq, int rotary_dim) {
  constexpr const char* kOp = "RotaryEmbedding";
  if (OpStatus st = cuda_internal::StartOp(kOp, query.device); !st.ok()) return st;
  const int64_t num_tokens = positions.shape[0];
  const int64_t num_heads = query.shape[1], num_kv_heads = key.shape[1];
  const int64_t head_size = query.shape[2];
  const int half = rotary_dim / 2;
  if (half > kMaxRotaryHalf || static_cast<int64_t>(inv_freq.size()) != half) {
    return cuda_internal::Error(
        kOp, "the CUDA kernel takes rotary_dim <= " + std::to_string(2 * kMaxRotaryHalf) +
                 ", got " + std::to_string(rotary_dim));
  }
  if (num_tokens == 0 || num_heads + num_kv_heads == 0) return OpStatus::Ok();
  InvFreq freq{};
  std::memcpy(freq.v, inv_freq.data(), half * sizeof(double));
  ::llm::cuda::Launch(RotaryKernel, static_cast<unsigned>(num_tokens), 128, 0,
                      cuda_internal::AsStream(stream), cuda_internal::AsIndex(positions),
                      query.data_as<float>(), key.data_as<float>(), freq, half, num_heads,
                      num_kv_heads, head_size);
  LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  return OpStatus::Ok();
}

}  // namespace llm::ops::cuda
