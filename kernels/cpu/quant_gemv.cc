#include "kernels/cpu/quant_gemv.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/half.h"
#include "kernels/cpu/avx2_math.h"

#define LLM_QUANT_AVX2 __attribute__((target("avx2,fma,f16c")))
#define LLM_QUANT_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline

namespace llm::cpu {
namespace {

// Weight rows per tile of QuantGemm: a tile is read from memory once and then stays in cache
// while every group of activation rows passes over it.
constexpr int64_t kTileRows = 16;
// Activation rows that share one read of a weight block.
constexpr int kMaxRowsPerPass = 4;
// How far ahead of the block being multiplied RowsAvx2 asks for the weights. With the hardware
// prefetcher alone a one-row pass read memory well below what a core can, its loads and its
// arithmetic taking turns (docs/performance/results.md, "GEMMs on GGUF blocks").
constexpr int64_t kPrefetchBytes = 1024;

float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return HalfToFloat(h);
}

// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K.
void ScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Chunk c (32 weights) of a block, as ggml's dequantize_row_* computes it: weight i of the chunk
// is a[i / 16] * q[i] - b[i / 16].
void DecodeChunk(QuantType type, const uint8_t* blk, int c, int16_t q[32], float a[2], float b[2]) {
  switch (type) {
    case QuantType::kQ4_0: {
      const float d = Half(blk);
      for (int i = 0; i < 16; ++i) {
        q[i] = static_cast<int16_t>((blk[2 + i] & 0xF) - 8);
        q[i + 16] = static_cast<int16_t>((blk[2 + i] >> 4) - 8);
      }
      a[0] = a[1] = d;
      b[0] = b[1] = 0.0f;
      return;
    }
    case QuantType::kQ4_1: {
      const float d = Half(blk), m = Half(blk + 2);
      for (int i = 0; i < 16; ++i) {
        q[i] = blk[4 + i] & 0xF;
        q[i + 16] = blk[4 + i] >> 4;
      }
      a[0] = a[1] = d;
      b[0] = b[1] = -m;  // d * q - (-m) is ggml's d * q + m, bit for bit
      return;
    }
    case QuantType::kQ5_0: {
      const float d = Half(blk);
      uint32_t qh;
      std::memcpy(&qh, blk + 2, 4);
      for (int i = 0; i < 16; ++i) {
        const int h0 = ((qh >> i) << 4) & 0x10, h1 = (qh >> (i + 12)) & 0x10;
        q[i] = static_cast<int16_t>(((blk[6 + i] & 0xF) | h0) - 16);
        q[i + 16] = static_cast<int16_t>(((blk[6 + i] >> 4) | h1) - 16);
      }
      a[0] = a[1] = d;
      b[0] = b[1] = 0.0f;
      return;
    }
    case QuantType::kQ8_0: {
      const float d = Half(blk);
      for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>(blk[2 + i]);
      a[0] = a[1] = d;
      b[0] = b[1] = 0.0f;
      return;
    }
    case QuantType::kQ4_K:
    case QuantType::kQ5_K: {
      const bool five = type == QuantType::kQ5_K;
      const float d = Half(blk), dmin = Half(blk + 2);
      const uint8_t* scales = blk + 4;
      const uint8_t* qh = blk + 16;
      const uint8_t* qs = blk + (five ? 48 : 16) + 32 * (c / 2);
      uint8_t sc, m;
      ScaleMinK4(c, scales, &sc, &m);
      const int shift = (c % 2) * 4;
      for (int i = 0; i < 32; ++i) {
        int v = (qs[i] >> shift) & 0xF;
        if (five && (qh[i] & (1u << c))) v += 16;
        q[i] = static_cast<int16_t>(v);
      }
      a[0] = a[1] = d * sc;
      b[0] = b[1] = dmin * m;
      return;
    }
    case QuantType::kQ6_K: {
      // Chunk c: half n = c / 4 of 128 weights, quarter k = c % 4 of it.
      const int n = c / 4, k = c % 4;
      const uint8_t* ql = blk + 64 * n + (k % 2) * 32;
      const uint8_t* qh = blk + 128 + 32 * n;
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192) + 8 * n + 2 * k;
      const float d = Half(blk + 208);
      for (int i = 0; i < 32; ++i) {
        const int lo = k < 2 ? (ql[i] & 0xF) : (ql[i] >> 4);
        const int hi = (qh[i] >> (2 * k)) & 3;
        q[i] = static_cast<int16_t>((lo | (hi << 4)) - 32);
      }
      a[0] = d * sc[0];
      a[1] = d * sc[1];
      b[0] = b[1] = 0.0f;
      return;
    }
  }
}

int ChunksPerBlock(QuantType type) { return static_cast<int>(QuantBlockElems(type) / 32); }

// One weight row against m (<= kMaxRowsPerPass) activation rows, portable.
void RowPortable(QuantType type, const uint8_t* row, int64_t k, const Q8Block* x, int64_t x_stride,
                 int m, float* out, int64_t out_stride) {
  const int chunks = ChunksPerBlock(type);
  const int64_t nb = k / QuantBlockElems(type), bytes = QuantBlockBytes(type);
  float sum[kMaxRowsPerPass] = {};
  int16_t q[32];
  float a[2], b[2];
  for (int64_t blk = 0; blk < nb; ++blk) {
    for (int c = 0; c < chunks; ++c) {
      DecodeChunk(type, row + blk * bytes, c, q, a, b);
      const int64_t xb = blk * chunks + c;
      for (int r = 0; r < m; ++r) {
        const Q8Block& xq = x[r * x_stride + xb];
        for (int h = 0; h < 2; ++h) {
          int32_t dot = 0, qsum = 0;
          for (int i = 16 * h; i < 16 * h + 16; ++i) {
            dot += q[i] * xq.qs[i];
            qsum += xq.qs[i];
          }
          sum[r] += a[h] * xq.d * static_cast<float>(dot) - b[h] * xq.d * static_cast<float>(qsum);
        }
      }
    }
  }
  for (int r = 0; r < m; ++r) out[r * out_stride] = sum[r];
}

// ---- AVX2 ----

template <int R>
struct Acc {
  __m256 v[R];
  float b[R];
};

LLM_QUANT_AVX2_INLINE float HalfAvx2(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 16 bytes of nibbles as 32 bytes: the low nibbles, then the high ones.
LLM_QUANT_AVX2_INLINE __m256i Nibbles32(const uint8_t* p) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

// 32 bits as 32 bytes, 0xFF where the bit is set (byte i from bit i).
LLM_QUANT_AVX2_INLINE __m256i BitsToBytes32(const uint8_t* p) {
  uint32_t x32;
  std::memcpy(&x32, p, 4);
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101,
                                         0x0000000000000000);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x32)), shuf);
  bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

// Adds chunk weights q (32 bytes; unsigned 0..127, or signed when kSigned) times the activation
// blocks xs[r] of every row: acc.v[r] += a * d_r * (q . qs_r) (the 16-bit pair sums weighted by
// `scale16`, ones but for Q6_K's two scales per chunk) and acc.b[r] += b * s_r.
template <int R, bool kSigned, bool kHasB>
LLM_QUANT_AVX2_INLINE void Accumulate(__m256i q, __m256i scale16, float a, float b,
                                      const Q8Block* const* xs, int64_t xb, Acc<R>* acc) {
  const __m256i wq = kSigned ? _mm256_sign_epi8(q, q) : q;
  for (int r = 0; r < R; ++r) {
    const Q8Block& x = xs[r][xb];
    __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs));
    if (kSigned) xq = _mm256_sign_epi8(xq, q);
    const __m256i p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, xq), scale16);
    acc->v[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), _mm256_set1_ps(a * x.d), acc->v[r]);
    if (kHasB) acc->b[r] += b * x.s;
  }
}

// What the block unpackers below hand each 32-weight chunk c of a block to: weights a * scale *
// q - b, q the chunk's 32 bytes (signed when kSigned), scale the 16-bit lanes of scale16 (ones,
// or Q6_K's scale of each 16 weights).
//   GemmSink: the chunk's dot products with the activation rows (Accumulate);
//   DequantSink: the chunk's weights as f32 (the prefill tiles).
template <int R>
struct GemmSink {
  const Q8Block* const* xs;
  int64_t xb;  // the block's first activation block
  Acc<R>* acc;
  template <bool kSigned, bool kHasB>
  LLM_QUANT_AVX2_INLINE void Chunk(__m256i q, __m256i scale16, float a, float b, int c) {
    Accumulate<R, kSigned, kHasB>(q, scale16, a, b, xs, xb + c, acc);
  }
};

struct DequantSink {
  float* out;  // the block's first weight
  template <bool kSigned, bool kHasB>
  LLM_QUANT_AVX2_INLINE void Chunk(__m256i q, __m256i scale16, float a, float b, int c) {
    const __m256 lo = _mm256_set1_ps(a * static_cast<int16_t>(_mm256_extract_epi16(scale16, 0)));
    const __m256 hi = _mm256_set1_ps(a * static_cast<int16_t>(_mm256_extract_epi16(scale16, 8)));
    const __m256 off = _mm256_set1_ps(b);
    const __m128i q0 = _mm256_castsi256_si128(q), q1 = _mm256_extracti128_si256(q, 1);
    float* o = out + 32 * c;
    const __m128i parts[4] = {q0, _mm_srli_si128(q0, 8), q1, _mm_srli_si128(q1, 8)};
    for (int i = 0; i < 4; ++i) {
      const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[i]));
      _mm256_storeu_ps(o + 8 * i, _mm256_fmsub_ps(v, i < 2 ? lo : hi, off));
    }
  }
};

struct Q4_0Avx2 {
  template <class Sink>
  LLM_QUANT_AVX2_INLINE static void Block(const uint8_t* blk, Sink* sink) {
    const float d = HalfAvx2(blk);
    sink->template Chunk<false, true>(Nibbles32(blk + 2), _mm256_set1_epi16(1), d, 8.0f * d, 0);
  }
};

struct Q4_1Avx2 {
  template <class Sink>
  LLM_QUANT_AVX2_INLINE static void Block(const uint8_t* blk, Sink* sink) {
    sink->template Chunk<false, true>(Nibbles32(blk + 4), _mm256_set1_epi16(1), HalfAvx2(blk),
                                      -HalfAvx2(blk + 2), 0);
  }
};

struct Q5_0Avx2 {
  template <class Sink>
  LLM_QUANT_AVX2_INLINE static void Block(const uint8_t* blk, Sink* sink) {
    const float d = HalfAvx2(blk);
    const __m256i hi = _mm256_and_si256(BitsToBytes32(blk + 2), _mm256_set1_epi8(0x10));
    sink->template Chunk<false, true>(_mm256_or_si256(Nibbles32(blk + 6), hi), _mm256_set1_epi16(1),
                                      d, 16.0f * d, 0);
  }
};

struct Q8_0Avx2 {
  template <class Sink>
  LLM_QUANT_AVX2_INLINE static void Block(const uint8_t* blk, Sink* sink) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    sink->template Chunk<true, false>(q, _mm256_set1_epi16(1), HalfAvx2(blk), 0.0f, 0);
  }
};

// Q4_K (kFive false) and Q5_K: four 64-weight runs, each 32 bytes of nibbles (low: sub-block
// 2j, high: 2j + 1); Q5_K's fifth bits are bit s of qh[i] for weight i of sub-block s.
template <bool kFive>
struct QK45Avx2 {
  template <class Sink>
  LLM_QUANT_AVX2_INLINE static void Block(const uint8_t* blk, Sink* sink) {
    const float d = HalfAvx2(blk), dmin = HalfAvx2(blk + 2);
    const uint8_t* scales = blk + 4;
    const uint8_t* qs = blk + (kFive ? 48 : 16);
    const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    __m256i qh;
    if (kFive) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
    for (int j = 0; j < 4; ++j) {
      const __m256i q4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * j));
      for (int h = 0; h < 2; ++h) {
        const int s = 2 * j + h;
        __m256i q = _mm256_and_si256(h == 0 ? q4 : _mm256_srli_epi16(q4, 4), low4);
        if (kFive) {
          const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(qh, s), one);
          q = _mm256_or_si256(q, _mm256_slli_epi16(bit, 4));
        }
        uint8_t sc, m;
        ScaleMinK4(s, scales, &sc, &m);
        sink->template Chunk<false, true>(q, _mm256_set1_epi16(1), d * sc, dmin * m, s);
      }
    }
  }
};

// Q6_K: two 128-weight halves; weight 32 k + i of a half (k < 4) is the low or high nibble of
// ql[(k % 2) 32 + i] with bits 2k, 2k + 1 of qh[i], minus 32; scales per 16 weights.
struct Q6_KAvx2 {
  template <class Sink>
  LLM_QUANT_AVX2_INLINE static void Block(const uint8_t* blk, Sink* sink) {
    const float d = HalfAvx2(blk + 208);
    const int8_t* scales = reinterpret_cast<const int8_t*>(blk + 192);
    const __m256i low4 = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
    const __m256i m32 = _mm256_set1_epi8(32);
    for (int n = 0; n < 2; ++n) {
      const uint8_t* ql = blk + 64 * n;
      const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i qb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * n));
      for (int k = 0; k < 4; ++k) {
        const __m256i src = (k % 2) == 0 ? qa : qb;
        const __m256i lo = _mm256_and_si256(k < 2 ? src : _mm256_srli_epi16(src, 4), low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), three);
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), m32);
        const int8_t* sc = scales + 8 * n + 2 * k;
        const __m256i scale16 = _mm256_set_m128i(_mm_set1_epi16(sc[1]), _mm_set1_epi16(sc[0]));
        sink->template Chunk<true, false>(q, scale16, d, 0.0f, 4 * n + k);
      }
    }
  }
};

// Weight rows of a tile against R activation rows, row after row: a tile's bytes are one
// sequential stream, prefetched kPrefetchBytes ahead (never past `last`, the last byte of the
// weights this QuantGemm reads). With one activation row the blocks alternate between two
// accumulators, so that a block does not wait for the previous block's FMA.
template <class T, int R>
LLM_QUANT_AVX2 void RowsAvx2(int64_t block_bytes, int64_t chunks, const uint8_t* w,
                             int64_t row_bytes, int64_t n_rows, int64_t nb, const Q8Block* x,
                             int64_t x_stride, uintptr_t last, float* out, int64_t out_stride) {
  constexpr int kChains = R == 1 ? 2 : 1;
  const Q8Block* xs[R];
  for (int r = 0; r < R; ++r) xs[r] = x + r * x_stride;
  for (int64_t j = 0; j < n_rows; ++j) {
    const uint8_t* row = w + j * row_bytes;
    Acc<R> acc[kChains];
    for (int c = 0; c < kChains; ++c) {
      for (int r = 0; r < R; ++r) {
        acc[c].v[r] = _mm256_setzero_ps();
        acc[c].b[r] = 0.0f;
      }
    }
    int64_t blk = 0;
    for (; blk + kChains <= nb; blk += kChains) {
      const uintptr_t ahead = reinterpret_cast<uintptr_t>(row + blk * block_bytes) + kPrefetchBytes;
      for (int64_t off = 0; off < kChains * block_bytes; off += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(std::min<uintptr_t>(ahead + off, last)),
                     _MM_HINT_T0);
      }
      for (int c = 0; c < kChains; ++c) {
        GemmSink<R> sink{xs, (blk + c) * chunks, &acc[c]};
        T::Block(row + (blk + c) * block_bytes, &sink);
      }
    }
    for (; blk < nb; ++blk) {
      GemmSink<R> sink{xs, blk * chunks, &acc[0]};
      T::Block(row + blk * block_bytes, &sink);
    }
    for (int r = 0; r < R; ++r) {
      __m256 v = acc[0].v[r];
      float b = acc[0].b[r];
      for (int c = 1; c < kChains; ++c) {
        v = _mm256_add_ps(v, acc[c].v[r]);
        b += acc[c].b[r];
      }
      out[r * out_stride + j] = ops::cpu::HorizontalSum256(v) - b;
    }
  }
}

template <class T>
LLM_QUANT_AVX2 void GemmAvx2(QuantType type, const uint8_t* w, int64_t row_bytes, int64_t n_rows,
                             int64_t k, const Q8Block* x, int64_t x_stride, int64_t m, float* out,
                             int64_t out_stride) {
  const int64_t bytes = QuantBlockBytes(type), chunks = QuantBlockElems(type) / 32;
  const int64_t nb = k / QuantBlockElems(type);
  if (n_rows < 1) return;
  const uintptr_t last = reinterpret_cast<uintptr_t>(w + (n_rows - 1) * row_bytes + nb * bytes - 1);
  for (int64_t j0 = 0; j0 < n_rows; j0 += kTileRows) {
    const int64_t rows = std::min(kTileRows, n_rows - j0);
    const uint8_t* tile = w + j0 * row_bytes;
    for (int64_t i = 0; i < m; i += kMaxRowsPerPass) {
      const Q8Block* xi = x + i * x_stride;
      float* o = out + i * out_stride + j0;
      switch (std::min<int64_t>(kMaxRowsPerPass, m - i)) {
        case 1:
          RowsAvx2<T, 1>(bytes, chunks, tile, row_bytes, rows, nb, xi, x_stride, last, o,
                         out_stride);
          break;
        case 2:
          RowsAvx2<T, 2>(bytes, chunks, tile, row_bytes, rows, nb, xi, x_stride, last, o,
                         out_stride);
          break;
        case 3:
          RowsAvx2<T, 3>(bytes, chunks, tile, row_bytes, rows, nb, xi, x_stride, last, o,
                         out_stride);
          break;
        default:
          RowsAvx2<T, 4>(bytes, chunks, tile, row_bytes, rows, nb, xi, x_stride, last, o,
                         out_stride);
          break;
      }
    }
  }
}

template <class T>
LLM_QUANT_AVX2 void DequantizeAvx2(QuantType type, const uint8_t* rows, int64_t row_bytes,
                                   int64_t n_rows, int64_t k, float* out) {
  const int64_t bytes = QuantBlockBytes(type), elems = QuantBlockElems(type), nb = k / elems;
  for (int64_t j = 0; j < n_rows; ++j) {
    for (int64_t blk = 0; blk < nb; ++blk) {
      DequantSink sink{out + j * k + blk * elems};
      T::Block(rows + j * row_bytes + blk * bytes, &sink);
    }
  }
}

LLM_QUANT_AVX2 void QuantizeRowQ8Avx2(const float* x, int64_t k, Q8Block* out) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < k / 32; ++b) {
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + 32 * b + 8 * i);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(amax, 1), _mm256_castps256_ps128(amax));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float d = _mm_cvtss_f32(m4) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m256 mul = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) {
      q[i] = _mm256_cvtps_epi32(
          _mm256_round_ps(_mm256_mul_ps(v[i], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    const __m256i sum32 =
        _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum32), _mm256_extracti128_si256(sum32, 1));
    s4 = _mm_hadd_epi32(s4, s4);
    s4 = _mm_hadd_epi32(s4, s4);
    // Packs interleave the 128-bit lanes; the permute puts the 32 bytes back in order.
    const __m256i p16a = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
    const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                   _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].qs), p8);
    out[b].d = d;
    out[b].s = d * static_cast<float>(_mm_cvtsi128_si32(s4));
  }
}

bool HasAvx2Kernels() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  return has;
}

}  // namespace

bool IsQuantType(int ggml_type) {
  for (QuantType t : {QuantType::kQ4_0, QuantType::kQ4_1, QuantType::kQ5_0, QuantType::kQ8_0,
                      QuantType::kQ4_K, QuantType::kQ5_K, QuantType::kQ6_K}) {
    if (static_cast<int>(t) == ggml_type) return true;
  }
  return false;
}

std::string_view QuantTypeName(QuantType type) {
  switch (type) {
    case QuantType::kQ4_0:
      return "Q4_0";
    case QuantType::kQ4_1:
      return "Q4_1";
    case QuantType::kQ5_0:
      return "Q5_0";
    case QuantType::kQ8_0:
      return "Q8_0";
    case QuantType::kQ4_K:
      return "Q4_K";
    case QuantType::kQ5_K:
      return "Q5_K";
    case QuantType::kQ6_K:
      return "Q6_K";
  }
  return "?";
}

int64_t QuantBlockElems(QuantType type) {
  switch (type) {
    case QuantType::kQ4_K:
    case QuantType::kQ5_K:
    case QuantType::kQ6_K:
      return 256;
    default:
      return 32;
  }
}

int64_t QuantBlockBytes(QuantType type) {
  switch (type) {
    case QuantType::kQ4_0:
      return 18;
    case QuantType::kQ4_1:
      return 20;
    case QuantType::kQ5_0:
      return 22;
    case QuantType::kQ8_0:
      return 34;
    case QuantType::kQ4_K:
      return 144;
    case QuantType::kQ5_K:
      return 176;
    case QuantType::kQ6_K:
      return 210;
  }
  return 0;
}

bool QuantKernelsUseAvx2() { return HasAvx2Kernels(); }

void QuantizeRowQ8Portable(const float* x, int64_t k, Q8Block* out) {
  for (int64_t b = 0; b < k / 32; ++b) {
    const float* v = x + 32 * b;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int i = 0; i < 32; ++i) {
      const int q = static_cast<int>(std::nearbyint(v[i] * id));
      out[b].qs[i] = static_cast<int8_t>(q);
      sum += q;
    }
    out[b].d = d;
    out[b].s = d * static_cast<float>(sum);
  }
}

void QuantizeRowQ8(const float* x, int64_t k, Q8Block* out) {
  if (HasAvx2Kernels()) return QuantizeRowQ8Avx2(x, k, out);
  QuantizeRowQ8Portable(x, k, out);
}

void DequantizeRows(QuantType type, const uint8_t* rows, int64_t row_bytes, int64_t n_rows,
                    int64_t k, float* out) {
  const int chunks = ChunksPerBlock(type);
  const int64_t nb = k / QuantBlockElems(type), bytes = QuantBlockBytes(type);
  int16_t q[32];
  float a[2], b[2];
  for (int64_t j = 0; j < n_rows; ++j) {
    const uint8_t* row = rows + j * row_bytes;
    float* o = out + j * k;
    for (int64_t blk = 0; blk < nb; ++blk) {
      for (int c = 0; c < chunks; ++c) {
        DecodeChunk(type, row + blk * bytes, c, q, a, b);
        for (int i = 0; i < 32; ++i) *o++ = a[i / 16] * q[i] - b[i / 16];
      }
    }
  }
}

void DequantizeRowsFast(QuantType type, const uint8_t* rows, int64_t row_bytes, int64_t n_rows,
                        int64_t k, float* out) {
  if (!HasAvx2Kernels()) return DequantizeRows(type, rows, row_bytes, n_rows, k, out);
  switch (type) {
    case QuantType::kQ4_0:
      return DequantizeAvx2<Q4_0Avx2>(type, rows, row_bytes, n_rows, k, out);
    case QuantType::kQ4_1:
      return DequantizeAvx2<Q4_1Avx2>(type, rows, row_bytes, n_rows, k, out);
    case QuantType::kQ5_0:
      return DequantizeAvx2<Q5_0Avx2>(type, rows, row_bytes, n_rows, k, out);
    case QuantType::kQ8_0:
      return DequantizeAvx2<Q8_0Avx2>(type, rows, row_bytes, n_rows, k, out);
    case QuantType::kQ4_K:
      return DequantizeAvx2<QK45Avx2<false>>(type, rows, row_bytes, n_rows, k, out);
    case QuantType::kQ5_K:
      return DequantizeAvx2<QK45Avx2<true>>(type, rows, row_bytes, n_rows, k, out);
    case QuantType::kQ6_K:
      return DequantizeAvx2<Q6_KAvx2>(type, rows, row_bytes, n_rows, k, out);
  }
}

void QuantGemmPortable(QuantType type, const uint8_t* w, int64_t row_bytes, int64_t n_rows,
                       int64_t k, const Q8Block* x, int64_t x_stride, int64_t m, float* out,
                       int64_t out_stride) {
  for (int64_t j0 = 0; j0 < n_rows; j0 += kTileRows) {
    const int64_t rows = std::min(kTileRows, n_rows - j0);
    for (int64_t i = 0; i < m; i += kMaxRowsPerPass) {
      const int r = static_cast<int>(std::min<int64_t>(kMaxRowsPerPass, m - i));
      for (int64_t j = j0; j < j0 + rows; ++j) {
        RowPortable(type, w + j * row_bytes, k, x + i * x_stride, x_stride, r,
                    out + i * out_stride + j, out_stride);
      }
    }
  }
}

void QuantGemm(QuantType type, const uint8_t* w, int64_t row_bytes, int64_t n_rows, int64_t k,
               const Q8Block* x, int64_t x_stride, int64_t m, float* out, int64_t out_stride) {
  if (!HasAvx2Kernels()) {
    return QuantGemmPortable(type, w, row_bytes, n_rows, k, x, x_stride, m, out, out_stride);
  }
  switch (type) {
    case QuantType::kQ4_0:
      return GemmAvx2<Q4_0Avx2>(type, w, row_bytes, n_rows, k, x, x_stride, m, out, out_stride);
    case QuantType::kQ4_1:
      return GemmAvx2<Q4_1Avx2>(type, w, row_bytes, n_rows, k, x, x_stride, m, out, out_stride);
    case QuantType::kQ5_0:
      return GemmAvx2<Q5_0Avx2>(type, w, row_bytes, n_rows, k, x, x_stride, m, out, out_stride);
    case QuantType::kQ8_0:
      return GemmAvx2<Q8_0Avx2>(type, w, row_bytes, n_rows, k, x, x_stride, m, out, out_stride);
    case QuantType::kQ4_K:
      return GemmAvx2<QK45Avx2<false>>(type, w, row_bytes, n_rows, k, x, x_stride, m, out,
                                       out_stride);
    case QuantType::kQ5_K:
      return GemmAvx2<QK45Avx2<true>>(type, w, row_bytes, n_rows, k, x, x_stride, m, out,
                                      out_stride);
    case QuantType::kQ6_K:
      return GemmAvx2<Q6_KAvx2>(type, w, row_bytes, n_rows, k, x, x_stride, m, out, out_stride);
  }
}

}  // namespace llm::cpu
