// Mixture-of-experts routing and combination on CUDA (kernels/ops.h: MoeRoute, MoeCombine).
//
// MoeRoute, two launches:
//   MoeTopKKernel    one thread per token: softmax over the E logits (max, then the sum of
//                    exp(l - max) in expert order, as moe_routing.cc), then k selections of the
//                    largest remaining p (the lower expert on ties, strict >), each p recomputed
//                    as exp(l - max) / sum (the same float operations as the CPU's stored p),
//                    no list of the chosen kept (no local array: any k);
//                    writes experts[t][j] and weights[t][j].
//   MoeSortKernel    one thread block: thread x counts expert x's pairs, thread 0 scans the
//                    counts into offsets, then thread x places expert x's pairs in pair order
//                    (so tokens ascend within an expert): sorted_tokens[at] = t, positions[i] =
//                    at. O(T * k) per thread: simple and deterministic, not a parallel sort.
// MoeCombine: one thread block per token, threads over H; each element sums its k rows in
// choice order in fp32 (no atomics), adds sigmoid(gate) * shared, rounds once.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.cuh"

namespace llm::ops::cuda {
namespace {

__global__ void MoeTopKKernel(int32_t* __restrict__ experts, float* __restrict__ weights,
                              const float* __restrict__ logits, int64_t num_tokens, int num_experts,
                              int k, bool normalize) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= num_tokens) return;
  const float* row = logits + t * num_experts;
  float max = row[0];
  for (int e = 1; e < num_experts; ++e) max = fmaxf(max, row[e]);
  float sum = 0.0f;
  for (int e = 0; e < num_experts; ++e) sum += expf(row[e] - max);
  // Choice j is the next expert in the order (p descending, expert ascending): the largest p
  // among the experts after choice j - 1 in that order, which is the CPU's "largest p not yet
  // chosen, the lower expert on ties" without a list of the chosen.
  int prev = -1;
  float prev_p = 0.0f, picked = 0.0f;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    float best_p = 0.0f;
    for (int e = 0; e < num_experts; ++e) {
      const float p = expf(row[e] - max) / sum;
      if (prev >= 0 && !(p < prev_p || (p == prev_p && e > prev))) continue;
      if (best < 0 || p > best_p) {
        best = e;
        best_p = p;
      }
    }
    experts[t * k + j] = best;
    weights[t * k + j] = best_p;
    picked += best_p;
    prev = best;
    prev_p = best_p;
  }
  if (normalize) {
    for (int j = 0; j < k; ++j) weights[t * k + j] /= picked;
  }
}

__global__ void MoeSortKernel(int32_t* __restrict__ offsets, int32_t* __restrict__ sorted_tokens,
                              int32_t* __restrict__ positions, const int32_t* __restrict__ experts,
                              int64_t num_pairs, int num_experts, int k) {
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
    int32_t count = 0;
    for (int64_t i = 0; i < num_pairs; ++i) count += experts[i] == e ? 1 : 0;
    offsets[e + 1] = count;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    offsets[0] = 0;
    for (int e = 0; e < num_experts; ++e) offsets[e + 1] += offsets[e];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
    int32_t at = offsets[e];
    for (int64_t i = 0; i < num_pairs; ++i) {
      if (experts[i] != e) continue;
      sorted_tokens[at] = static_cast<int32_t>(i / k);
      positions[i] = at;
      ++at;
    }
  }
}

template <typename T>
__global__ void MoeCombineKernel(T* __restrict__ out, const T* __restrict__ expert_out,
                                 const float* __restrict__ weights,
                                 const int32_t* __restrict__ positions,
                                 const T* __restrict__ shared,
                                 const float* __restrict__ shared_gate, int64_t hidden, int k,
                                 int64_t num_pairs) {
  const int64_t t = blockIdx.x;
  float gate = 0.0f;
  if (shared != nullptr) gate = 1.0f / (1.0f + expf(-shared_gate[t]));
  for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int64_t p = positions[t * k + j];
      // A position outside the pairs (never from MoeRoute) gives a NaN row, not a stray read.
      const float y =
          p >= 0 && p < num_pairs ? cuda_internal::ToFloat(expert_out[p * hidden + c]) : NAN;
      acc += weights[t * k + j] * y;
    }
    if (shared != nullptr) acc += gate * cuda_internal::ToFloat(shared[t * hidden + c]);
    out[t * hidden + c] = cuda_internal::FromFloat<T>(acc);
  }
}

}  // namespace

OpStatus MoeRoute(void* stream, const TensorView& offsets, const TensorView& sorted_tokens,
                  const TensorView& experts, const TensorView& weights, const TensorView& positions,
                  const TensorView& logits, int k, bool normalize) {
  constexpr const char* kOp = "MoeRoute";
  if (OpStatus st = cuda_internal::StartOp(kOp, logits.device); !st.ok()) return st;
  const int64_t num_tokens = logits.shape[0];
  const int num_experts = static_cast<int>(logits.shape[1]);
  cudaStream_t s = cuda_internal::AsStream(stream);
  if (num_tokens > 0) {
    constexpr int kThreads = 128;
    const int64_t blocks = (num_tokens + kThreads - 1) / kThreads;
    ::llm::cuda::Launch(MoeTopKKernel, static_cast<unsigned>(blocks), kThreads, 0, s,
                        experts.data_as<int32_t>(), weights.data_as<float>(),
                        logits.data_as<const float>(), num_tokens, num_experts, k, normalize);
    LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  }
  const int threads = cuda_internal::RowThreads(num_experts);
  ::llm::cuda::Launch(MoeSortKernel, 1u, threads, 0, s, offsets.data_as<int32_t>(),
                      sorted_tokens.data_as<int32_t>(), positions.data_as<int32_t>(),
                      experts.data_as<const int32_t>(), num_tokens * k, num_experts, k);
  LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  return OpStatus::Ok();
}

OpStatus MoeCombine(void* stream, const TensorView& out, const TensorView& expert_out,
                    const TensorView& weights, const TensorView& positions,
                    const TensorView& shared, const TensorView& shared_gate) {
  constexpr const char* kOp = "MoeCombine";
  if (OpStatus st = cuda_internal::StartOp(kOp, out.device); !st.ok()) return st;
  const int64_t num_tokens = out.shape[0], hidden = out.shape[1];
  const int k = static_cast<int>(weights.shape[1]);
  if (num_tokens == 0 || hidden == 0) return OpStatus::Ok();
  if (num_tokens > cuda_internal::kMaxGridX) {
    return cuda_internal::Error(kOp, "too many tokens for one grid");
  }
  const int threads = cuda_internal::RowThreads(hidden > 512 ? 512 : hidden);
  const bool known = cuda_internal::DispatchFloat(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    ::llm::cuda::Launch(MoeCombineKernel<T>, static_cast<unsigned>(num_tokens), threads, 0,
                        cuda_internal::AsStream(stream), out.data_as<T>(),
                        expert_out.data_as<const T>(), weights.data_as<const float>(),
                        positions.data_as<const int32_t>(),
                        shared.present() ? shared.data_as<const T>() : nullptr,
                        shared_gate.present() ? shared_gate.data_as<const float>() : nullptr,
                        hidden, k, num_tokens * k);
  });
  if (!known) return cuda_internal::Error(kOp, "out: expected f32, bf16 or f16");
  LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  return OpStatus::Ok();
}

}  // namespace llm::ops::cuda
