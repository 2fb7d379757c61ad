// Gemma's GeGLU activation on the CPU: out[t][i] = gelu_tanh(x[t][i]) * x[t][I + i], with
// gelu_tanh(v) = 0.5 v (1 + tanh(u)), u = sqrt(2 / pi) (v + 0.044715 v^3), computed as
// v / (1 + exp(-2u)) (the same function: 0.5 (1 + tanh(u)) = sigmoid(2u)), which keeps its
// relative accuracy where 1 + tanh(u) cancels (v below about -3). Rows run as
// kernels/cpu/gated_rows.h says; on AVX2 + FMA CPUs every element (the last partial register too,
// masked) goes through Exp256, so that an element's result does not depend on where it falls in
// the row (tensor-parallel ranks split the row and must agree with one rank bit for bit).
#include <cmath>

#include "kernels/cpu/avx2_math.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gated_rows.h"

namespace llm::ops::cpu {
namespace {

// -2 sqrt(2 / pi) and the cubic term's coefficient.
constexpr float kMinus2SqrtTwoOverPi = -1.5957691216057308f;
constexpr float kCubic = 0.044715f;

void RowPortable(float* o, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = gate[i];
    const float arg = v * kMinus2SqrtTwoOverPi * (1.0f + kCubic * v * v);  // -2u
    o[i] = v / (1.0f + std::exp(arg)) * up[i];
  }
}

// GeGLU's exponent argument, -2u = -2 sqrt(2 / pi) v (1 + c v^2).
struct MinusTwoU {
  LLM_AVX2 __m256 operator()(__m256 v) const {
    const __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(kCubic), v), v,
                                         _mm256_set1_ps(1.0f));  // 1 + c v^2
    return _mm256_mul_ps(_mm256_mul_ps(v, _mm256_set1_ps(kMinus2SqrtTwoOverPi)), inner);
  }
};

LLM_AVX2 void RowAvx2(float* o, const float* gate, const float* up, int64_t n) {
  SigmoidGatedRow256(o, gate, up, n, MinusTwoU{});
}

}  // namespace

OpStatus GeluTanhAndMul(const TensorView& out, const TensorView& x) {
  if (HasAvx2Fma()) {
    ForEachGatedRow(out, x, RowAvx2);
  } else {
    ForEachGatedRow(out, x, RowPortable);
  }
  return OpStatus::Ok();
}

}  // namespace llm::ops::cpu
