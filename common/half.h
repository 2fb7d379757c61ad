// Host conversions between fp32 and the 16-bit float formats (IEEE half, bfloat16), as bits:
// round to nearest even, NaN stays NaN, overflow gives infinity. The device code uses CUDA's
// own intrinsics; these are for loading weights and for tests.
#ifndef LLM_COMMON_HALF_H_
#define LLM_COMMON_HALF_H_

#include <bit>
#include <cmath>
#include <cstdint>

namespace llm {

inline float Bf16ToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline uint16_t FloatToBf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24
    return sign ? -v : v;
  }
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));  // inf, NaN
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t FloatToHalf(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7E00u;   // NaN
  if (a >= 0x477FF000u) return sign | 0x7C00u;  // rounds to infinity (>= 65520)
  if (a < 0x38800000u) {                        // a subnormal half (< 2^-14): units of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(std::bit_cast<float>(a) * 16777216.0f));
  }
  return sign | static_cast<uint16_t>((a + 0x0FFFu + ((a >> 13) & 1u) - 0x38000000u) >> 13);
}

}  // namespace llm

#endif  // LLM_COMMON_HALF_H_
