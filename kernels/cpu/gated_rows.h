// The row loop the CPU's gated MLP activations share (SiluAndMul, GeluTanhAndMul): x [T, 2I]
// holds each token's gate half then its up half, out [T, I]; `row(o, gate, up, I)` computes one
// token's row. Rows run on the OpenMP pool when there are enough elements to pay for waking it.
#ifndef LLM_KERNELS_CPU_GATED_ROWS_H_
#define LLM_KERNELS_CPU_GATED_ROWS_H_

#include <cstdint>

#include "kernels/tensor.h"

namespace llm::ops::cpu {

// Below this many elements the call runs on the calling thread: waking the pool costs more.
inline constexpr int64_t kMinParallelGatedElements = int64_t{1} << 15;

template <typename RowFn>
void ForEachGatedRow(const TensorView& out, const TensorView& x, RowFn row) {
  const int64_t num_tokens = out.shape[0], inter = out.shape[1];
  const float* in = x.data_as<const float>();
  float* dst = out.data_as<float>();
#pragma omp parallel for schedule(static) if (num_tokens > 1 && \
                                              num_tokens * inter >= kMinParallelGatedElements)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* gate = in + t * 2 * inter;  // x[t][0:I]
    row(dst + t * inter, gate, gate + inter, inter);
  }
}

}  // namespace llm::ops::cpu

#endif  // LLM_KERNELS_CPU_GATED_ROWS_H_
