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

// A little-endian u32 (Q5_0's and Q5_1's qh: bit j is the fifth bit of element j).
inline uint32_t U32At(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// {f16 d; u8 qh[4]; u8 qs[16]}: as Q4_0, with a fifth bit from qh and an offset of 16.
void DequantQ5_0(const uint8_t* b, float* y) {
  const float d = F16At(b);
  const uint32_t qh = U32At(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}

// {f16 d; f16 m; u8 qh[4]; u8 qs[16]}: as Q4_1, with a fifth bit from qh.
void DequantQ5_1(const uint8_t* b, float* y) {
  const float d = F16At(b), m = F16At(b + 2);
  const uint32_t qh = U32At(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(lo) + m;
    y[j + 16] = d * static_cast<float>(hi) + m;
  }
}

// IQ4_NL's and IQ4_XS's non-linear 4-bit values.
constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};

// {f16 d; u8 qs[16]}: as Q4_0, with each nibble an index into kIq4Values.
void DequantIQ4_NL(const uint8_t* b, float* y) {
  const float d = F16At(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(kIq4Values[qs[j] & 0x0F]);
    y[j + 16] = d * static_cast<float>(kIq4Values[qs[j] >> 4]);
  }
}

// {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}: 16 sub-blocks of 16, scale and min the low and
// high nibbles of scales[i]; in half h, group t (0..3) of 32 takes bits 2t..2t+1 of
// qs[32h + l].
void DequantQ2_K(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = F16At(b + 80), dmin = F16At(b + 82);
  for (int h = 0; h < 2; ++h) {
    for (int t = 0; t < 4; ++t) {
      for (int l = 0; l < 32; ++l) {
        const int idx = 128 * h + 32 * t + l;
        const uint8_t sc = scales[idx / 16];
        const float dl = d * static_cast<float>(sc & 0x0F);
        const float ml = dmin * static_cast<float>(sc >> 4);
        y[idx] = dl * static_cast<float>((qs[32 * h + l] >> (2 * t)) & 0x03) - ml;
      }
    }
  }
}

// {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}: 16 sub-blocks of 16 with signed 6-bit
// scales (low 4 bits: nibble i/8 of scales[i%8]; high 2 bits: bits 2(i/4).. of scales[8 + i%4];
// minus 32). In half h, group t of 32 takes bits 2t..2t+1 of qs[32h + l]; element idx
// subtracts 4 unless bit idx/32 of hmask[l] is set.
void DequantQ3_K(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* scales = b + 96;
  const float d = F16At(b + 108);
  for (int h = 0; h < 2; ++h) {
    for (int t = 0; t < 4; ++t) {
      for (int l = 0; l < 32; ++l) {
        const int idx = 128 * h + 32 * t + l;
        const int i = idx / 16;
        const int lo = (scales[i % 8] >> (4 * (i / 8))) & 0x0F;
        const int hi = (scales[8 + i % 4] >> (2 * (i / 4))) & 0x03;
        const float dl = d * static_cast<float>((lo | (hi << 4)) - 32);
        const int q =
            ((qs[32 * h + l] >> (2 * t)) & 0x03) - (((hmask[l] >> (idx / 32)) & 1) ? 0 : 4);
        y[idx] = dl * static_cast<float>(q);
      }
    }
  }
}

// {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}: 8 sub-blocks of 32 with signed 6-bit
// scales (low 4 bits: nibble j%2 of scales_l[j/2]; high 2 bits: bits 2j..2j+1 of scales_h;
// minus 32); sub-block j is the low then the high nibbles of qs[16j .. 16j+16), indices into
// kIq4Values.
void DequantIQ4_XS(const uint8_t* b, float* y) {
  const float d = F16At(b);
  uint16_t scales_h;
  std::memcpy(&scales_h, b + 2, 2);
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 8; ++j) {
    const int lo = (scales_l[j / 2] >> (4 * (j % 2))) & 0x0F;
    const int hi = (scales_h >> (2 * j)) & 0x03;
    const float dl = d * static_cast<float>((lo | (hi << 4)) - 32);
    const uint8_t* q = qs + 16 * j;
    for (int l = 0; l < 16; ++l) {
      y[32 * j + l] = dl * static_cast<float>(kIq4Values[q[l] & 0x0F]);
      y[32 * j + l + 16] = dl * static_cast<float>(kIq4Values[q[l] >> 4]);
    }
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
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kIQ4_NL:
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kIQ4_XS:
      return true;
    default:
      return false;
  }
}

absl::Status DequantizeToF32(GgmlType type, std::span<const std::byte> src, std::span<float> out) {
  if (!GgmlTypeCanDequantize(type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ggml type ", GgmlTypeName(type),
                     " cannot be dequantized (supported: ", kGgmlDequantizableTypes, ")"));
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
    case GgmlType::kQ5_0:
      for (int64_t k = 0; k < blocks; ++k) DequantQ5_0(s + k * block_bytes, y + k * block);
      break;
    case GgmlType::kQ5_1:
      for (int64_t k = 0; k < blocks; ++k) DequantQ5_1(s + k * block_bytes, y + k * block);
      break;
    case GgmlType::kIQ4_NL:
      for (int64_t k = 0; k < blocks; ++k) DequantIQ4_NL(s + k * block_bytes, y + k * block);
      break;
    case GgmlType::kQ2_K:
      for (int64_t k = 0; k < blocks; ++k) DequantQ2_K(s + k * block_bytes, y + k * kQK);
      break;
    case GgmlType::kQ3_K:
      for (int64_t k = 0; k < blocks; ++k) DequantQ3_K(s + k * block_bytes, y + k * kQK);
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
    case GgmlType::kIQ4_XS:
      for (int64_t k = 0; k < blocks; ++k) DequantIQ4_XS(s + k * block_bytes, y + k * kQK);
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

}  // namespace llm
