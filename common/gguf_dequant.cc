#include "common/gguf_dequant.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/half.h"

namespace llm {
namespace {

constexpr int kQK = 256;  // QK_K: elements of a K-quant super-block

inline float F16At(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return HalfToFloat(h);
}

void DequantQ8_0(const uint8_t* b, float* y) {  // {f16 d; int8 qs[32]}
  const float d = F16At(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

void DequantQ4_0(const uint8_t* b, float* y) {  // {f16 d; u8 qs[16]}: low nibbles, then high
  const float d = F16At(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0F) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

void DequantQ4_1(const uint8_t* b, float* y) {  // {f16 d; f16 m; u8 qs[16]}
  const float d = F16At(b), m = F16At(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0F) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block.
inline void ScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}: 8 sub-blocks of 32; sub-blocks 2k and 2k+1
// are the low and high nibbles of qs[32k .. 32k+32).
void DequantQ4_K(const uint8_t* b, float* y) {
  const float d = F16At(b), dmin = F16At(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    ScaleMinK4(j, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l)
      y[32 * j + l] = d1 * static_cast<float>((q[l] >> shift) & 0x0F) - m1;
  }
}

// {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: as Q4_K, with bit j of qh[l] the
// fifth bit of sub-block j's element l.
void DequantQ5_K(const uint8_t* b, float* y) {
  const float d = F16At(b), dmin = F16At(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    ScaleMinK4(j, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0x0F) | (((qh[l] >> j) & 1) << 4);
      y[32 * j + l] = d1 * static_cast<float>(v) - m1;
    }
  }
}

// {u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d}: two halves of 128; in half h, group t
// (0..3) of 32 takes nibble t/2 of ql[64h + 32(t%2) + l] and bits 2t..2t+1 of qh[32h + l].
void DequantQ6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = F16At(b + 208);
  for (int h = 0; h < 2; ++h) {
    for (int t = 0; t < 4; ++t) {
      for (int l = 0; l < 32; ++l) {
        const int lo = (ql[64 * h + 32 * (t % 2) + l] >> (4 * (t / 2))) & 0x0F;
        const int hi = (qh[32 * h + l] >> (2 * t)) & 0x03;
        const int idx = 128 * h + 32 * t + l;
        const float ds = d * static_cast<float>(scales[idx / 16]);
        y[idx] = ds * static_cast<float>((lo | (hi << 4)) - 32);
      }
    }
  }
}

}  // namespace

bool GgmlTypeCanDequantize(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

absl::Status DequantizeToF32(GgmlType type, std::span<const std::byte> src, std::span<float> out) {
  if (!GgmlTypeCanDequantize(type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ggml type ", GgmlTypeName(type),
                     " cannot be dequantized (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, "
                     "Q4_K, Q5_K, Q6_K)"));
  }
  const auto [block, block_bytes] = GgmlBlockLayout(type);
  const int64_t n = static_cast<int64_t>(out.size());
  if (n % block != 0 || static_cast<int64_t>(src.size()) != n / block * block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("dequantize ", GgmlTypeName(type), ": ", n, " elements (blocks of ", block,
                     ") need ", n / block * block_bytes, " bytes, got ", src.size()));
  }
  const uint8_t* s = reinterpret_cast<const uint8_t*>(src.data());
  float* y = out.data();
  const int64_t blocks = n / block;
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(y, s, static_cast<size_t>(n) * 4);
      break;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) y[i] = F16At(s + 2 * i);
      break;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, s + 2 * i, 2);
        y[i] = Bf16ToFloat(v);
      }
      break;
    case GgmlType::kQ8_0:
      for (int64_t k = 0; k < blocks; ++k) DequantQ8_0(s + k * block_bytes, y + k * block);
      break;
    case GgmlType::kQ4_0:
      for (int64_t k = 0; k < blocks; ++k) DequantQ4_0(s + k * block_bytes, y + k * block);
      break;
    case GgmlType::kQ4_1:
      for (int64_t k = 0; k < blocks; ++k) DequantQ4_1(s + k * block_bytes, y + k * block);
      break;
    case GgmlType::kQ4_K:
      for (int64_t k = 0; k < blocks; ++k) DequantQ4_K(s + k * block_bytes, y + k * kQK);
      break;
    case GgmlType::kQ5_K:
      for (int64_t k = 0; k < blocks; ++k) DequantQ5_K(s + k * block_bytes, y + k * kQK);
      break;
    case GgmlType::kQ6_K:
      for (int64_t k = 0; k < blocks; ++k) DequantQ6_K(s + k * block_bytes, y + k * kQK);
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

}  // namespace llm
