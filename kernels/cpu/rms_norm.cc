// RMSNorm and the fused residual add + RMSNorm of a decoder layer, on the CPU. Rows run on the
// OpenMP pool when there are enough of them (each row's arithmetic is the same either way).
#include <cmath>

#include "kernels/cpu/cpu_ops.h"

namespace llm::ops::cpu {
namespace {

// Below this many elements the call runs on the calling thread: waking the pool costs more.
constexpr int64_t kMinParallelElements = int64_t{1} << 15;

// o[h] = x[h] / sqrt(mean(x^2) + eps) * w[h]; o may be x. Accumulates in double.
void NormalizeRow(float* o, const float* x, const float* w, int64_t hidden, float eps) {
  double sum_sq = 0.0;
  for (int64_t h = 0; h < hidden; ++h) sum_sq += static_cast<double>(x[h]) * x[h];
  const float inv_rms = static_cast<float>(1.0 / std::sqrt(sum_sq / hidden + eps));
  for (int64_t h = 0; h < hidden; ++h) o[h] = x[h] * inv_rms * w[h];
}

}  // namespace

OpStatus RmsNorm(const TensorView& out, const TensorView& x, const TensorView& weight, float eps) {
  const int64_t num_tokens = x.shape[0], hidden = x.shape[1];
  const float* w = weight.data_as<const float>();
#pragma omp parallel for schedule(static) if (num_tokens > 1 && \
                                              num_tokens * hidden >= kMinParallelElements)
  for (int64_t t = 0; t < num_tokens; ++t) {
    NormalizeRow(out.data_as<float>() + t * hidden, x.data_as<const float>() + t * hidden, w,
                 hidden, eps);
  }
  return OpStatus::Ok();
}

OpStatus FusedAddRmsNorm(const TensorView& x, const TensorView& residual, const TensorView& weight,
                         float eps) {
  const int64_t num_tokens = x.shape[0], hidden = x.shape[1];
  const float* w = weight.data_as<const float>();
#pragma omp parallel for schedule(static) if (num_tokens > 1 && \
                                              num_tokens * hidden >= kMinParallelElements)
  for (int64_t t = 0; t < num_tokens; ++t) {
    float* xr = x.data_as<float>() + t * hidden;
    float* rr = residual.data_as<float>() + t * hidden;
    for (int64_t h = 0; h < hidden; ++h) rr[h] += xr[h];  // residual[t][h] += x[t][h]
    NormalizeRow(xr, rr, w, hidden, eps);
  }
  return OpStatus::Ok();
}

}  // namespace llm::ops::cpu
