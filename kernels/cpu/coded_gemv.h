// Small-M matmuls on bf16 weights stored in 12 bits per weight, losslessly: batch-1 decode on
// the CPU reads every weight once per token and is bound by memory bandwidth, so reading 3/4 of
// the bytes is the lever (bench_cpu_gemv compares it with oneDNN; docs/performance/results.md
// has the figures).
//
// A bf16 weight is sign, 8 exponent bits and 7 mantissa bits. A trained model's weights use few
// exponents (SmolLM2-135M in bf16: all but 0.01% of its weights lie in the 15 consecutive
// exponents that cover the most of their matrix, 0.05% at most in one matrix), so a
// CodedBf16Matrix stores per weight one byte of sign and mantissa and a 4-bit code: codes
// 0..14 are the 15 consecutive exponents that cover the most weights of the matrix, code 15 is
// exponent 0 (zeros and subnormals). The rest, the exceptions, are stored as code 15
// with sign and mantissa 0 (the weight reads as +0) and listed (row, column, value); Forward adds
// their products after the row's dot product. Every weight is thus used at its exact bf16 value:
// the result is that of a bf16 matmul (bf16 x bf16 products summed in fp32 with vdpbf16ps,
// which reads subnormals as zero, as oneDNN's bf16 kernels do), up to the order of the sums.
// The idea is DFloat11's (lossless exponent coding), with a fixed-width code that AVX-512 VBMI
// decodes in registers (vpermb on the codes).
//
// Layout: per row, per group of 64 weights, 64 bytes of sign and mantissa, then 32 bytes of codes
// (two per byte), the group's weights permuted so that the decode's in-lane byte interleave
// yields its 64 bf16 in order. K must be a multiple of 64.
//
// Forward computes out = x weight^T (+ bias) for up to kMaxRows rows of x (bf16), over row
// ranges of the weight on the OpenMP pool (kernels/cpu/thread_pool.h).
//
// Needs AVX512_BF16 and AVX512_VBMI (CodedGemvSupported(), checked once at run time).
//
// Thread-safety: Forward is const and may run on several threads at once.
#ifndef LLM_KERNELS_CPU_CODED_GEMV_H_
#define LLM_KERNELS_CPU_CODED_GEMV_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace llm::cpu {

// Whether this CPU runs CodedBf16Matrix (AVX512_BF16 and AVX512_VBMI).
bool CodedGemvSupported();

class CodedBf16Matrix {
 public:
  // Rows of x one Forward takes.
  static constexpr int kMaxRows = 4;

  // Codes `weight` (bf16 bits [n, k], row-major); null when k is not a multiple of 64, the CPU
  // lacks the instructions, or more than 1 in 64 weights would be exceptions (a matrix whose
  // weights spread over many exponents). The weight's memory can be freed afterwards.
  static std::unique_ptr<CodedBf16Matrix> Create(const uint16_t* weight, int64_t n, int64_t k);

  // out[i][j] = sum_c x[i][c] * weight[j][c] (+ bias[j]) for i < m: x bf16 [m, k], out f32
  // [m, n], bias f32 [n] or null; 1 <= m <= kMaxRows.
  void Forward(const uint16_t* x, int m, const float* bias, float* out) const;

  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  // Bytes of the coded weight and its exception list.
  size_t bytes() const;
  int64_t num_exceptions() const { return static_cast<int64_t>(exceptions_.size()); }
  // Row r's bf16 bits decoded from the coded form one weight at a time (no SIMD), exceptions
  // included: the weight given to Create, bit for bit. For tests.
  std::vector<uint16_t> DecodeRow(int64_t r) const;

 private:
  struct Exception {
    int32_t row = 0;
    int32_t col = 0;
    uint16_t bits = 0;  // the weight, bf16
  };

  CodedBf16Matrix() = default;
  // The first exception of row `row` or of a later one.
  std::vector<Exception>::const_iterator FirstException(int64_t row) const;
  // Rows [r0, r1) of out for the m rows of x.
  template <int M>
  void Rows(const uint16_t* x, const float* bias, float* out, int64_t r0, int64_t r1) const;

  int64_t n_ = 0, k_ = 0;
  struct alignas(64) Line {
    uint8_t bytes[64];
  };
  std::vector<Line> data_;  // n * k * 3 / 2 bytes
  // vpermb tables, by code: the bf16's high byte without the sign (exponent >> 1) and its low
  // byte without the mantissa ((exponent & 1) << 7).
  alignas(64) uint8_t high_[64] = {};
  alignas(64) uint8_t low_[64] = {};
  std::vector<Exception> exceptions_;  // by row, then column
};

}  // namespace llm::cpu

#endif  // LLM_KERNELS_CPU_CODED_GEMV_H_
