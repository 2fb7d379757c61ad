// AVX-512 helpers the CPU ops share (compiled for avx512f by function attribute, so callers pick
// them at run time: HasAvx512()).
#ifndef LLM_KERNELS_CPU_AVX512_MATH_H_
#define LLM_KERNELS_CPU_AVX512_MATH_H_

#include <immintrin.h>

#define LLM_AVX512 __attribute__((target("avx512f")))
// vdpbf16ps and friends (AVX512_BF16): pairs of bf16 products summed into f32 lanes.
#define LLM_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

namespace llm::ops::cpu {

// Whether this CPU runs AVX-512 (avx512f).
inline bool HasAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

// Whether this CPU runs AVX512BW (byte and word lanes, 32- and 64-bit masks).
inline bool HasAvx512Bw() {
  static const bool has = __builtin_cpu_supports("avx512bw");
  return has;
}

// Whether this CPU runs AVX512_BF16 (Cooper Lake, Sapphire Rapids and later; Zen 4 and later).
inline bool HasAvx512Bf16() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
}

// exp(x) for 16 floats: Cephes' expf polynomial (about 1 ulp on [-87.3, 88.4]) scaled by 2^n
// with vscalefps; 0 below -87.3 (and for -inf), +inf above 88.37 clamps to exp(88.37), NaN for
// NaN.
LLM_AVX512 inline __m512 Exp512(__m512 x) {
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_GE_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.37f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  y = _mm512_maskz_mov_ps(live, _mm512_scalef_ps(y, n));
  return _mm512_mask_mov_ps(y, nan, x);
}

// tanh(x) for 16 floats: x (1 + x^2 (-1/3 + x^2 (2/15 - 17/315 x^2))) below |x| = 1/8 (the
// series' next term is under 2e-10 there), else sign(x) (1 - 2 / (exp(2 |x|) + 1)) (about
// 1e-7 absolute; +-1 once exp(2 |x|) saturates). NaN for NaN.
LLM_AVX512 inline __m512 Tanh512(__m512 x) {
  const __m512 ax = _mm512_abs_ps(x);
  const __m512 x2 = _mm512_mul_ps(x, x);
  __m512 poly = _mm512_fmadd_ps(x2, _mm512_set1_ps(-17.0f / 315.0f), _mm512_set1_ps(2.0f / 15.0f));
  poly = _mm512_fmadd_ps(x2, poly, _mm512_set1_ps(-1.0f / 3.0f));
  poly = _mm512_fmadd_ps(_mm512_mul_ps(x2, poly), x, x);
  const __m512 e = Exp512(_mm512_add_ps(ax, ax));
  const __m512 big =
      _mm512_sub_ps(_mm512_set1_ps(1.0f),
                    _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
  // sign(x) |tanh|: x's sign bit on the magnitude.
  const __m512 sign = _mm512_castsi512_ps(
      _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(static_cast<int>(0x80000000u))));
  const __m512 large =
      _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(big), _mm512_castps_si512(sign)));
  const __mmask16 small = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.125f), _CMP_LT_OQ);
  return _mm512_mask_mov_ps(large, small, poly);
}

}  // namespace llm::ops::cpu

#endif  // LLM_KERNELS_CPU_AVX512_MATH_H_
