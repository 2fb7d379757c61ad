// RMSNorm, the fused residual add + RMSNorm of a decoder layer and the per-head RMSNorm of q and
// k, on the CPU. Rows run on the OpenMP pool when there are enough of them (each row's
// arithmetic is the same either way).
#include <cmath>

#include "kernels/cpu/avx512_math.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/op_check.h"

namespace llm::ops::cpu {
namespace {

// Below this many elements the call runs on the calling thread: waking the pool costs more.
constexpr int64_t kMinParallelElements = int64_t{1} << 15;

// sum of x[h]^2 in double: in 8 independent lanes (a single running sum is a chain of dependent
// adds the compiler may not reorder, each waiting for the last, and does not vectorize), summed at
// the end.
double SumSquaresPortable(const float* x, int64_t n) {
  double lanes[8] = {};
  int64_t h = 0;
  for (; h + 8 <= n; h += 8) {
    for (int j = 0; j < 8; ++j) lanes[j] += static_cast<double>(x[h + j]) * x[h + j];
  }
  for (; h < n; ++h) lanes[0] += static_cast<double>(x[h]) * x[h];
  double sum = 0.0;
  for (int j = 0; j < 8; ++j) sum += lanes[j];
  return sum;
}

// The same lanes on AVX-512: lane j of the register is lanes[j] above (a float's square is
// exact in double, so the sums are the same whether or not the compiler fuses the multiply-add).
LLM_AVX512 double SumSquaresAvx512(const float* x, int64_t n) {
  __m512d acc = _mm512_setzero_pd();
  int64_t h = 0;
  for (; h + 8 <= n; h += 8) {
    const __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(x + h));
    acc = _mm512_add_pd(acc, _mm512_mul_pd(v, v));
  }
  alignas(64) double lanes[8];
  _mm512_store_pd(lanes, acc);
  for (; h < n; ++h) lanes[0] += static_cast<double>(x[h]) * x[h];
  double sum = 0.0;
  for (int j = 0; j < 8; ++j) sum += lanes[j];
  return sum;
}

// o[h] = x[h] / sqrt(mean(x^2) + eps) * w[h]; o may be x. Accumulates in double.
void NormalizeRow(float* o, const float* x, const float* w, int64_t hidden, float eps) {
  const double sum_sq = HasAvx512() ? SumSquaresAvx512(x, hidden) : SumSquaresPortable(x, hidden);
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

// Every head vector x[t][h][:] normalized in place by NormalizeRow: RmsNorm's arithmetic over D.
// Token t's heads start at x + t * TokenStride(x); the elements between token rows are never
// touched.
OpStatus HeadRmsNorm(const TensorView& x, const TensorView& weight, float eps) {
  const int64_t num_tokens = x.shape[0], num_heads = x.shape[1], head_size = x.shape[2];
  const int64_t token_stride = internal::TokenStride(x);
  const float* w = weight.data_as<const float>();
  float* base = x.data_as<float>();
#pragma omp parallel for schedule( \
    static) if (num_tokens > 1 && num_tokens * num_heads * head_size >= kMinParallelElements)
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t h = 0; h < num_heads; ++h) {
      float* v = base + t * token_stride + h * head_size;
      NormalizeRow(v, v, w, head_size, eps);
    }
  }
  return OpStatus::Ok();
}

OpStatus SumOfSquares(const TensorView& sums, const TensorView& x) {
  const int64_t num_tokens = x.shape[0], row = x.shape[1] * x.shape[2];
  const int64_t token_stride = internal::TokenStride(x);
  const float* base = x.data_as<const float>();
  float* out = sums.data_as<float>();
  // A token's heads are contiguous (token-strided x): one row of heads * D.
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* v = base + t * token_stride;
    out[t] =
        static_cast<float>(HasAvx512() ? SumSquaresAvx512(v, row) : SumSquaresPortable(v, row));
  }
  return OpStatus::Ok();
}

OpStatus RmsNormBySums(const TensorView& x, const TensorView& sums, const TensorView& weight,
                       int64_t count, float eps) {
  const int64_t num_tokens = x.shape[0], row = x.shape[1] * x.shape[2];
  const int64_t token_stride = internal::TokenStride(x);
  const float* w = weight.data_as<const float>();
  const float* s = sums.data_as<const float>();
  float* base = x.data_as<float>();
  for (int64_t t = 0; t < num_tokens; ++t) {
    float* v = base + t * token_stride;
    const float inv_rms =
        static_cast<float>(1.0 / std::sqrt(static_cast<double>(s[t]) / count + eps));
    for (int64_t i = 0; i < row; ++i) v[i] = v[i] * inv_rms * w[i];
  }
  return OpStatus::Ok();
}

}  // namespace llm::ops::cpu
