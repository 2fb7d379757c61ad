// Emulated CUDA (LLM_CUDA_EMU): __nv_bfloat16 as on the device. Conversions from f32 round to
// nearest even, bit for bit as the toolkit's (NaN becomes the canonical 0x7FFF).
#ifndef LLM_CUDA_EMU_INCLUDE_CUDA_BF16_H_
#define LLM_CUDA_EMU_INCLUDE_CUDA_BF16_H_

#include <cstdint>
#include <cstring>

#include "cuda_fp16.h"

struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
};
using nv_bfloat16 = __nv_bfloat16;

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  __nv_bfloat16 b;
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    b.__x = 0x7fffu;
    return b;
  }
  const uint32_t remainder = x << 16;
  b.__x = static_cast<unsigned short>(x >> 16);
  if (remainder > 0x80000000u || (remainder == 0x80000000u && (b.__x & 1u))) ++b.__x;
  return b;
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }

inline float __bfloat162float(__nv_bfloat16 b) {
  const uint32_t bits = static_cast<uint32_t>(b.__x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short x) {
  __nv_bfloat16 b;
  b.__x = x;
  return b;
}

#endif  // LLM_CUDA_EMU_INCLUDE_CUDA_BF16_H_
