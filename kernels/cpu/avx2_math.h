// AVX2 + FMA helpers the CPU ops share (compiled for avx2,fma by function attribute, so callers
// pick them at run time: HasAvx2Fma()). 8 floats a register; a row's last partial register goes
// through the same math, loaded and stored under a mask (LoadFirst, StoreFirst), so that an
// element's result does not depend on where it falls in the row.
#ifndef LLM_KERNELS_CPU_AVX2_MATH_H_
#define LLM_KERNELS_CPU_AVX2_MATH_H_

#include <immintrin.h>

#include <cstdint>

#define LLM_AVX2 __attribute__((target("avx2,fma")))

namespace llm::ops::cpu {

// Whether this CPU runs AVX2 and FMA.
inline bool HasAvx2Fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

// The sum of v's eight lanes: the halves added, then pairs, then the last two.
LLM_AVX2 inline float HorizontalSum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The mask of _mm256_maskload_ps / _mm256_maskstore_ps for the first n (0..8) lanes.
LLM_AVX2 inline __m256i MaskFirst(int64_t n) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n < 8 ? n : 8)), lanes);
}

// The first n floats of p (all 8 when n >= 8, then a plain load), the other lanes 0. Masked
// loads and stores cost several times a plain one on AMD's Zen, so only a row's last partial
// register takes them.
LLM_AVX2 inline __m256 LoadFirst(const float* p, int64_t n) {
  return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, MaskFirst(n));
}

// Stores the first n lanes of v to p (all 8 when n >= 8).
LLM_AVX2 inline void StoreFirst(float* p, int64_t n, __m256 v) {
  if (n >= 8) {
    _mm256_storeu_ps(p, v);
  } else {
    _mm256_maskstore_ps(p, MaskFirst(n), v);
  }
}

// exp(x) for 8 floats: Exp512's Cephes expf polynomial (about 1 ulp) scaled by 2^n as two
// factors 2^(n/2) and 2^(n - n/2) built in the exponent bits (each a normal float), so that the
// result overflows to +inf where exp does (above ln(FLT_MAX) = 88.72, +inf included); 0 below
// -87.3 (and for -inf: Exp512's cut, no subnormals), NaN for NaN. Unlike Exp512, which clamps
// at exp(88.37): callers divide by it (v / (1 + exp(-2u))) and need the overflow.
LLM_AVX2 inline __m256 Exp256(__m256 x) {
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_GE_OQ);
  const __m256 c = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(89.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), c);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // n in [-126, 128]: n1 = n >> 1 and n2 = n - n1 in [-63, 64].
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  y = _mm256_and_ps(_mm256_mul_ps(_mm256_mul_ps(y, p1), p2), live);
  return _mm256_blendv_ps(y, x, nan);
}

// The gated activations of the form o = g / (1 + exp(arg(g))) * u (SiLU: arg(g) = -g; GeGLU:
// -2u(g)) over n floats of a row, 8 at a time; `arg` maps 8 gates to their exponent
// arguments (a functor whose operator() is compiled for avx2,fma too).
template <class Arg>
LLM_AVX2 inline void SigmoidGatedRow256(float* o, const float* gate, const float* up, int64_t n,
                                        Arg arg) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 g = LoadFirst(gate + i, n - i);
    const __m256 u = LoadFirst(up + i, n - i);
    const __m256 e = Exp256(arg(g));
    StoreFirst(o + i, n - i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u));
  }
}

// tanh(x) for 8 floats, Cephes' tanhf (relative error about 2.5e-7): |x| < 0.625 an odd
// polynomial, x + x^3 P(x^2); else 1 - 2 / (exp(2|x|) + 1) with x's sign (no cancellation: the
// result is >= 0.55 there; exp overflowing to +inf for |x| > 44.3 gives exactly 1). +-1 for
// +-inf, NaN for NaN.
LLM_AVX2 inline __m256 Tanh256(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 ax = _mm256_andnot_ps(sign, x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(-5.70498872745e-3f);
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954e-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531e-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036e-1f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422e-1f));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), ax, ax);  // tanh(|x|), |x| < 0.625
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = Exp256(_mm256_add_ps(ax, ax));
  const __m256 big = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
  const __m256 mag =
      _mm256_blendv_ps(big, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_LT_OQ));
  return _mm256_or_ps(mag, _mm256_and_ps(x, sign));  // x's sign: tanh(-0) = -0
}

}  // namespace llm::ops::cpu

#endif  // LLM_KERNELS_CPU_AVX2_MATH_H_
