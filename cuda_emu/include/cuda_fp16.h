// Emulated CUDA (LLM_CUDA_EMU): __half as on the device. Conversions from f32 round to nearest
// even, bit for bit as the toolkit's (NaN becomes the canonical 0x7FFF, overflow becomes inf).
#ifndef LLM_CUDA_EMU_INCLUDE_CUDA_FP16_H_
#define LLM_CUDA_EMU_INCLUDE_CUDA_FP16_H_

#include <cstdint>
#include <cstring>

struct __half {
  unsigned short __x;
  __half() = default;
};
using half = __half;

inline __half __float2half_rn(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint32_t u = x & 0x7fffffffu, sign = (x >> 16) & 0x8000u;
  uint32_t result, remainder;
  if (u >= 0x7f800000u) {  // inf, NaN
    remainder = 0;
    result = u == 0x7f800000u ? (sign | 0x7c00u) : 0x7fffu;
  } else if (u > 0x477fefffu) {  // overflows to inf after rounding
    remainder = 0x80000000u;
    result = sign | 0x7bffu;
  } else if (u >= 0x38800000u) {  // normal
    remainder = u << 19;
    result = sign | ((u - 0x38000000u) >> 13);
  } else if (u < 0x33000001u) {  // rounds to +-0
    remainder = u;
    result = sign;
  } else {  // subnormal
    const uint32_t shift = 0x7eu - (u >> 23);
    const uint32_t mantissa = (u & 0x7fffffu) | 0x800000u;
    remainder = mantissa << (32 - shift);
    result = (sign | (mantissa >> shift)) & 0xffffu;
  }
  if (remainder > 0x80000000u || (remainder == 0x80000000u && (result & 1u))) ++result;
  __half h;
  h.__x = static_cast<unsigned short>(result);
  return h;
}
inline __half __float2half(float f) { return __float2half_rn(f); }

inline float __half2float(__half h) {
  const uint32_t sign = static_cast<uint32_t>(h.__x & 0x8000u) << 16;
  uint32_t exponent = (h.__x >> 10) & 0x1fu, mantissa = (h.__x & 0x3ffu) << 13;
  uint32_t bits;
  if (exponent == 0x1f) {  // inf, NaN
    bits = sign | 0x7f800000u | mantissa;
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | mantissa;
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    exponent = 113;
    while ((mantissa & 0x800000u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | (mantissa & 0x7fffffu);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short x) {
  __half h;
  h.__x = x;
  return h;
}

#endif  // LLM_CUDA_EMU_INCLUDE_CUDA_FP16_H_
