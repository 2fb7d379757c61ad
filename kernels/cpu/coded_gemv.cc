#include "kernels/cpu/coded_gemv.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>

#include "common/half.h"

namespace llm::cpu {
namespace {

constexpr int64_t kGroup = 64;                   // weights per group
constexpr int64_t kGroupBytes = kGroup * 3 / 2;  // 64 bytes of sign and mantissa, 32 of codes
constexpr int kZeroCode = 15;                    // exponent 0: zeros and subnormals
// Groups ahead of the decode that each group's two prefetches fetch (3 KB; past the end of the
// matrix they fetch nothing, a prefetch never faults). Far enough ahead that the lines arrive
// before the decode reaches them: a shorter distance leaves part of the memory's latency exposed
// (bench_cpu_gemv's sweep of distances: docs/performance/results.md).
constexpr int64_t kPrefetchGroups = 32;

// The byte of a group that holds weight c (0 <= c < 64). The decode interleaves the high and low
// bytes per 128-bit lane (vpunpcklbw / vpunpckhbw): lane L's bytes 0..7 become bf16 8L..8L+7 of
// the first half (weights 0..31), its bytes 8..15 bf16 8L..8L+7 of the second (weights 32..63).
int BytePosition(int c) {
  const int half = c / 32, w = c % 32;
  return 16 * (w / 8) + 8 * half + w % 8;
}

// The 64 bf16 of one group, in order: weights 0..31 in *a, 32..63 in *b.
__attribute__((target("avx512f,avx512bw,avx512vbmi"), always_inline)) inline void Decode(
    const uint8_t* group, __m512i high_table, __m512i low_table, __m512i* a, __m512i* b) {
  const __m512i sm = _mm512_loadu_si512(group);
  const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 64));
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i lo = _mm256_and_si256(codes, nibble);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(codes, 4), nibble);
  const __m512i idx = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  const __m512i e_high = _mm512_permutexvar_epi8(idx, high_table);
  const __m512i e_low = _mm512_permutexvar_epi8(idx, low_table);
  // mask ? sm : table, bitwise (0xCA: A ? B : C).
  const __m512i high = _mm512_ternarylogic_epi32(_mm512_set1_epi8(char(0x80)), sm, e_high, 0xCA);
  const __m512i low = _mm512_ternarylogic_epi32(_mm512_set1_epi8(0x7F), sm, e_low, 0xCA);
  *a = _mm512_unpacklo_epi8(low, high);
  *b = _mm512_unpackhi_epi8(low, high);
}

__attribute__((target("avx512f,avx512bf16"), always_inline)) inline __m512 Dot(__m512 acc,
                                                                               __m512i w,
                                                                               const uint16_t* x) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(w),
                          reinterpret_cast<__m512bh>(_mm512_loadu_si512(x)));
}

}  // namespace

bool CodedGemvSupported() {
  static const bool supported = __builtin_cpu_supports("avx512bf16") &&
                                __builtin_cpu_supports("avx512vbmi") &&
                                __builtin_cpu_supports("avx512bw");
  return supported;
}

std::unique_ptr<CodedBf16Matrix> CodedBf16Matrix::Create(const uint16_t* weight, int64_t n,
                                                         int64_t k) {
  if (n < 1 || k < kGroup || k % kGroup != 0 || !CodedGemvSupported()) return nullptr;
  // The 15 consecutive nonzero exponents that cover the most weights.
  std::array<int64_t, 256> count{};
  for (int64_t i = 0; i < n * k; ++i) ++count[(weight[i] >> 7) & 0xFF];
  int base = 1;
  int64_t best = -1;
  for (int e = 1; e + kZeroCode - 1 <= 255; ++e) {
    int64_t covered = 0;
    for (int c = 0; c < kZeroCode; ++c) covered += count[e + c];
    if (covered > best) best = covered, base = e;
  }
  // Exceptions are added one by one: past 1 in 64 weights coding would not pay.
  if (n * k - best - count[0] > n * k / 64) return nullptr;
  std::unique_ptr<CodedBf16Matrix> m(new CodedBf16Matrix());
  m->n_ = n;
  m->k_ = k;
  for (int c = 0; c < kZeroCode; ++c) {
    m->high_[c] = static_cast<uint8_t>((base + c) >> 1);
    m->low_[c] = static_cast<uint8_t>(((base + c) & 1) << 7);
  }
  m->data_.resize(static_cast<size_t>((n * k * 3 / 2 + 63) / 64));
  uint8_t* out = m->data_.data()->bytes;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < k / kGroup; ++g) {
      uint8_t* group = out + (r * (k / kGroup) + g) * kGroupBytes;
      for (int c = 0; c < kGroup; ++c) {
        const int64_t col = g * kGroup + c;
        const uint16_t w = weight[r * k + col];
        const int e = (w >> 7) & 0xFF;
        int code;
        uint8_t sm = static_cast<uint8_t>(((w >> 8) & 0x80) | (w & 0x7F));
        if (e == 0) {
          code = kZeroCode;
        } else if (e >= base && e < base + kZeroCode) {
          code = e - base;
        } else {
          code = kZeroCode;
          sm = 0;
          m->exceptions_.push_back({static_cast<int32_t>(r), static_cast<int32_t>(col), w});
        }
        const int p = BytePosition(c);
        group[p] = sm;
        uint8_t& code_byte = group[64 + p % 32];
        code_byte = p < 32 ? static_cast<uint8_t>((code_byte & 0xF0) | code)
                           : static_cast<uint8_t>((code_byte & 0x0F) | (code << 4));
      }
    }
  }
  return m;
}

std::vector<uint16_t> CodedBf16Matrix::DecodeRow(int64_t r) const {
  std::vector<uint16_t> row(static_cast<size_t>(k_));
  const uint8_t* data = data_.data()->bytes + r * (k_ / kGroup) * kGroupBytes;
  for (int64_t col = 0; col < k_; ++col) {
    const uint8_t* group = data + (col / kGroup) * kGroupBytes;
    const int p = BytePosition(static_cast<int>(col % kGroup));
    const int code = p < 32 ? group[64 + p] & 0x0F : group[64 + p - 32] >> 4;
    const uint8_t sm = group[p];
    row[col] =
        static_cast<uint16_t>(((sm & 0x80) << 8) | (high_[code] << 8) | low_[code] | (sm & 0x7F));
  }
  for (auto e = FirstException(r); e != exceptions_.end() && e->row == r; ++e) {
    row[e->col] = e->bits;
  }
  return row;
}

std::vector<CodedBf16Matrix::Exception>::const_iterator CodedBf16Matrix::FirstException(
    int64_t row) const {
  return std::lower_bound(exceptions_.begin(), exceptions_.end(), row,
                          [](const Exception& a, int64_t r) { return a.row < r; });
}

size_t CodedBf16Matrix::bytes() const {
  return data_.size() * sizeof(Line) + exceptions_.size() * sizeof(Exception);
}

namespace {

// Row `row` of out for the M rows of x: each group of the row decoded once, dotted with every
// row of x. One row at a time, so that each thread reads one sequential stream, which the
// hardware prefetcher and the prefetches above keep ahead of; several rows at once are several
// streams, and they lose most of the gain over oneDNN (docs/performance/results.md).
template <int M>
__attribute__((target("avx512f,avx512bw,avx512vbmi,avx512bf16"))) inline void RowPass(
    const uint8_t* w, int64_t groups, int64_t n, int64_t k, __m512i high_table, __m512i low_table,
    const uint16_t* x, const float* bias, float* out, int64_t row) {
  __m512 acc[M][2];
  for (int j = 0; j < M; ++j) acc[j][0] = acc[j][1] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const char* ahead = reinterpret_cast<const char*>(w + (g + kPrefetchGroups) * kGroupBytes);
    _mm_prefetch(ahead, _MM_HINT_T0);
    _mm_prefetch(ahead + 64, _MM_HINT_T0);
    __m512i a, b;
    Decode(w + g * kGroupBytes, high_table, low_table, &a, &b);
    for (int j = 0; j < M; ++j) {
      const uint16_t* xj = x + j * k + g * kGroup;
      acc[j][0] = Dot(acc[j][0], a, xj);
      acc[j][1] = Dot(acc[j][1], b, xj + 32);
    }
  }
  for (int j = 0; j < M; ++j) {
    out[j * n + row] = _mm512_reduce_add_ps(_mm512_add_ps(acc[j][0], acc[j][1])) +
                       (bias != nullptr ? bias[row] : 0.0f);
  }
}

}  // namespace

template <int M>
__attribute__((target("avx512f,avx512bw,avx512vbmi,avx512bf16"))) void CodedBf16Matrix::Rows(
    const uint16_t* x, const float* bias, float* out, int64_t r0, int64_t r1) const {
  const __m512i high_table = _mm512_load_si512(high_);
  const __m512i low_table = _mm512_load_si512(low_);
  const int64_t groups = k_ / kGroup;
  const uint8_t* data = data_.data()->bytes;
  for (int64_t r = r0; r < r1; ++r) {
    RowPass<M>(data + r * groups * kGroupBytes, groups, n_, k_, high_table, low_table, x, bias, out,
               r);
  }
  // The exceptions of these rows.
  for (auto e = FirstException(r0); e != exceptions_.end() && e->row < r1; ++e) {
    const float w = Bf16ToFloat(e->bits);
    for (int j = 0; j < M; ++j) out[j * n_ + e->row] += Bf16ToFloat(x[j * k_ + e->col]) * w;
  }
}

void CodedBf16Matrix::Forward(const uint16_t* x, int m, const float* bias, float* out) const {
  // Contiguous row ranges, of about 8 KB of coded weight at least.
  const int64_t min_rows = std::max<int64_t>(1, 8192 / (k_ * 3 / 2));
  const int threads =
      static_cast<int>(std::min<int64_t>(omp_get_max_threads(), (n_ + min_rows - 1) / min_rows));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t per = (n_ + nt - 1) / nt;
    const int64_t r0 = std::min(n_, t * per), r1 = std::min(n_, r0 + per);
    if (r0 < r1) {
      switch (m) {
        case 1:
          Rows<1>(x, bias, out, r0, r1);
          break;
        case 2:
          Rows<2>(x, bias, out, r0, r1);
          break;
        case 3:
          Rows<3>(x, bias, out, r0, r1);
          break;
        default:
          Rows<4>(x, bias, out, r0, r1);
          break;
      }
    }
  }
}

}  // namespace llm::cpu
