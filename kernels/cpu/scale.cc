// Scale on the CPU: x[...] *= factor, in place, one fp32 multiply per element (vectorized by the
// compiler; the result is the same either way). Chunks run on the OpenMP pool when there are
// enough elements.
#include <algorithm>

#include "kernels/cpu/cpu_ops.h"

namespace llm::ops::cpu {
namespace {

constexpr int64_t kMinParallelElements = int64_t{1} << 15;
constexpr int64_t kChunk = int64_t{1} << 13;

}  // namespace

OpStatus Scale(const TensorView& x, float factor) {
  const int64_t n = x.numel();
  float* p = x.data_as<float>();
  const int64_t num_chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t c = 0; c < num_chunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < end; ++i) p[i] *= factor;
  }
  return OpStatus::Ok();
}

}  // namespace llm::ops::cpu
