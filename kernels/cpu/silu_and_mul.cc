// The gated MLP activation on the CPU: out[t][i] = silu(x[t][i]) * x[t][I + i], with
// silu(g) = g / (1 + exp(-g)). Rows run as kernels/cpu/gated_rows.h says; on AVX-512 CPUs every
// element (the last partial register too, masked) goes through Exp512, on AVX2 + FMA ones
// through Exp256, so an element's result does not depend on where it falls in the row
// (tensor-parallel ranks split the row and must agree with one rank bit for bit).
#include <cmath>

#include "kernels/cpu/avx2_math.h"
#include "kernels/cpu/avx512_math.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gated_rows.h"

namespace llm::ops::cpu {
namespace {

void RowPortable(float* o, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

LLM_AVX512 void RowAvx512(float* o, const float* gate, const float* up, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 u = _mm512_maskz_loadu_ps(m, up + i);
    const __m512 e = Exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), u));
  }
}

// SiLU's exponent argument, -g.
struct MinusGate {
  LLM_AVX2 __m256 operator()(__m256 g) const { return _mm256_sub_ps(_mm256_setzero_ps(), g); }
};

LLM_AVX2 void RowAvx2(float* o, const float* gate, const float* up, int64_t n) {
  SigmoidGatedRow256(o, gate, up, n, MinusGate{});
}

}  // namespace

OpStatus SiluAndMul(const TensorView& out, const TensorView& x) {
  if (HasAvx512()) {
    ForEachGatedRow(out, x, RowAvx512);
  } else if (HasAvx2Fma()) {
    ForEachGatedRow(out, x, RowAvx2);
  } else {
    ForEachGatedRow(out, x, RowPortable);
  }
  return OpStatus::Ok();
}

}  // namespace llm::ops::cpu
