// CodedBf16Matrix (bf16 weights coded in 12 bits, kernels/cpu/coded_gemv.h):
//   - lossless: every row decodes to the bf16 bits it was made from, including zeros of both
//     signs, subnormals and exceptions (exponents outside the coded window, above and below);
//   - Forward against an fp64 loop over the same bf16 values, 1 to 4 rows of x, with and without
//     bias, on 1, 2 and 3 threads, outputs poisoned (NaN) before each call;
//   - inside the PackedLinear of a bf16 weight: the same results as oneDNN on the packed weight.
#include "kernels/cpu/coded_gemv.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/half.h"
#include "gtest/gtest.h"
#include "kernels/cpu/packed_linear.h"
#include "tests/unit/kernels/test_util.h"

namespace llm::cpu {
namespace {

using ops::testing::AllClose;
using ops::testing::Poisoned;
using ops::testing::Random;

// A weight like a trained model's (normal, sigma 0.05) in bf16 bits, with in every row: +0, -0,
// a positive and a negative subnormal, and one exception (1 in 64 weights at most, what Create
// codes), far above the matrix's exponents (+-16..64) in even rows and far below (about 1e-12)
// in odd ones; `*num_exceptions` is how many.
std::vector<uint16_t> ModelLikeWeight(int64_t n, int64_t k, std::mt19937& rng,
                                      int64_t* num_exceptions) {
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::uniform_int_distribution<int64_t> col(0, k - 1);
  std::vector<uint16_t> w(static_cast<size_t>(n * k));
  for (uint16_t& v : w) {
    // |w| in [1e-4, 0.24]: 12 exponents, within the 15 the code covers (redrawing the rare
    // others), so that the exceptions are exactly those placed below.
    float f;
    do f = normal(rng);
    while (std::abs(f) < 1e-4f || std::abs(f) > 0.24f);
    v = FloatToBf16(f);
  }
  *num_exceptions = 0;
  for (int64_t r = 0; r < n; ++r) {
    uint16_t* row = w.data() + r * k;
    row[col(rng)] = 0x0000;  // +0
    row[col(rng)] = 0x8000;  // -0
    row[col(rng)] = 0x0003;  // subnormal
    row[col(rng)] = 0x8041;  // negative subnormal
    const int64_t c = col(rng);
    if (r % 2 == 0) {
      row[c] = FloatToBf16((r % 4 ? -1.0f : 1.0f) * (16.0f + static_cast<float>(r % 48)));
    } else {
      row[c] = FloatToBf16(1e-12f * static_cast<float>(1 + r % 7));
    }
    ++*num_exceptions;
  }
  return w;
}

// sum_c x[c] * w[c] in fp64 over the bf16 values; subnormal weights count as 0, as vdpbf16ps
// (and oneDNN's bf16 kernels) flush them.
double Dot(const uint16_t* x, const uint16_t* w, int64_t k) {
  double acc = 0;
  for (int64_t c = 0; c < k; ++c) {
    const bool subnormal = (w[c] & 0x7F80) == 0;
    acc += subnormal ? 0.0 : double(Bf16ToFloat(x[c])) * Bf16ToFloat(w[c]);
  }
  return acc;
}

struct Shape {
  int64_t n, k;
};
// K of one group and of several; N of 1 row, fewer rows than threads, odd, and a few thousand.
const Shape kShapes[] = {{1, 64}, {2, 128}, {5, 576}, {193, 576}, {70, 1536}, {3001, 192}};

TEST(CodedBf16Matrix, DecodesEveryRowBitForBit) {
  if (!CodedGemvSupported()) GTEST_SKIP() << "this CPU lacks AVX512_BF16 or AVX512_VBMI";
  std::mt19937 rng(60);
  for (const Shape& s : kShapes) {
    int64_t num_exceptions;
    const std::vector<uint16_t> w = ModelLikeWeight(s.n, s.k, rng, &num_exceptions);
    std::unique_ptr<CodedBf16Matrix> m = CodedBf16Matrix::Create(w.data(), s.n, s.k);
    ASSERT_NE(m, nullptr) << s.n << "x" << s.k;
    EXPECT_EQ(m->num_exceptions(), num_exceptions) << s.n << "x" << s.k;
    for (int64_t r = 0; r < s.n; ++r) {
      const std::vector<uint16_t> row = m->DecodeRow(r);
      ASSERT_EQ(std::memcmp(row.data(), w.data() + r * s.k, static_cast<size_t>(s.k) * 2), 0)
          << s.n << "x" << s.k << " row " << r;
    }
    // 12 bits a weight, plus the exception list.
    EXPECT_LE(m->bytes(), static_cast<size_t>(s.n * s.k * 3 / 2) + 64 +
                              static_cast<size_t>(num_exceptions) * 12);
  }
}

TEST(CodedBf16Matrix, ForwardMatchesAnFp64Loop) {
  if (!CodedGemvSupported()) GTEST_SKIP() << "this CPU lacks AVX512_BF16 or AVX512_VBMI";
  std::mt19937 rng(61);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const int saved_threads = omp_get_max_threads();
  for (const Shape& s : kShapes) {
    int64_t num_exceptions;
    const std::vector<uint16_t> w = ModelLikeWeight(s.n, s.k, rng, &num_exceptions);
    std::unique_ptr<CodedBf16Matrix> m = CodedBf16Matrix::Create(w.data(), s.n, s.k);
    ASSERT_NE(m, nullptr);
    std::vector<float> bias(static_cast<size_t>(s.n));
    for (float& b : bias) b = uniform(rng);
    for (int rows = 1; rows <= CodedBf16Matrix::kMaxRows; ++rows) {
      std::vector<uint16_t> x(static_cast<size_t>(rows * s.k));
      for (uint16_t& v : x) v = FloatToBf16(uniform(rng));
      for (bool with_bias : {false, true}) {
        std::vector<double> want(static_cast<size_t>(rows * s.n));
        for (int i = 0; i < rows; ++i) {
          for (int64_t j = 0; j < s.n; ++j) {
            want[i * s.n + j] =
                Dot(x.data() + i * s.k, w.data() + j * s.k, s.k) + (with_bias ? bias[j] : 0.0);
          }
        }
        for (int threads : {1, 2, 3}) {
          omp_set_num_threads(threads);
          HostTensor out = Poisoned({rows, s.n});
          m->Forward(x.data(), rows, with_bias ? bias.data() : nullptr, out.data<float>());
          // Both sides multiply the same bf16 values exactly; fp32 sums against fp64.
          EXPECT_TRUE(AllClose(out.data<float>(), want, 1e-4, 1e-4))
              << s.n << "x" << s.k << ", " << rows << " row(s)" << (with_bias ? ", bias" : "")
              << ", " << threads << " thread(s)";
        }
      }
    }
  }
  omp_set_num_threads(saved_threads);
}

TEST(CodedBf16Matrix, RefusesWhatItCannotCodeWell) {
  if (!CodedGemvSupported()) GTEST_SKIP() << "this CPU lacks AVX512_BF16 or AVX512_VBMI";
  // K not a multiple of 64, or no rows.
  const std::vector<uint16_t> w(100 * 96, FloatToBf16(0.5f));
  EXPECT_EQ(CodedBf16Matrix::Create(w.data(), 100, 96), nullptr);
  EXPECT_EQ(CodedBf16Matrix::Create(w.data(), 150, 32), nullptr);
  EXPECT_EQ(CodedBf16Matrix::Create(w.data(), 0, 64), nullptr);
  EXPECT_NE(CodedBf16Matrix::Create(w.data(), 150, 64), nullptr);
  // Weights over 30 exponents, evenly: half of them would be exceptions.
  std::vector<uint16_t> spread(64 * 64);
  for (size_t i = 0; i < spread.size(); ++i) {
    spread[i] = FloatToBf16(std::ldexp(1.0f, -static_cast<int>(i % 30)));
  }
  EXPECT_EQ(CodedBf16Matrix::Create(spread.data(), 64, 64), nullptr);
  // The same with 1 weight in 100 outside 15 exponents: coded.
  for (size_t i = 0; i < spread.size(); ++i) {
    spread[i] = FloatToBf16(std::ldexp(1.0f, -static_cast<int>(i % 100 == 0 ? 20 : i % 15)));
  }
  std::unique_ptr<CodedBf16Matrix> m = CodedBf16Matrix::Create(spread.data(), 64, 64);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->num_exceptions(), 41);
}

// A bf16 PackedLinear runs steps of 1 to kMaxRows rows on its coded copy (when K allows) and
// larger ones on oneDNN; with SetCodedWeights(false) every step runs on oneDNN. Same results.
TEST(CodedBf16Matrix, PackedLinearSmallStepsMatchOneDnn) {
  if (!CodedGemvSupported() || !CpuHasNativeBf16()) {
    GTEST_SKIP() << "this CPU lacks AVX512_BF16 or AVX512_VBMI";
  }
  std::mt19937 rng(62);
  for (const Shape& s : {Shape{960, 576}, Shape{576, 1536}, Shape{33, 100}}) {
    HostTensor w = Random({s.n, s.k}, rng, -0.1f, 0.1f);
    HostTensor b = Random({s.n}, rng);
    std::unique_ptr<PackedLinear> coded, plain;
    SetCodedWeights(false);
    ASSERT_TRUE(PackedLinear::Create(w.view(), b.view(), DType::kBF16, &plain).ok());
    SetCodedWeights(true);
    ASSERT_TRUE(PackedLinear::Create(w.view(), b.view(), DType::kBF16, &coded).ok());
    EXPECT_FALSE(plain->has_coded());
    EXPECT_EQ(coded->has_coded(), s.k % 64 == 0) << s.n << "x" << s.k;
    // The coded copy's 12 bits a weight come on top of the packed weight.
    EXPECT_EQ(coded->packed_bytes() > plain->packed_bytes() + s.n * s.k, coded->has_coded());
    for (int64_t rows = 1; rows <= CodedBf16Matrix::kMaxRows + 1; ++rows) {
      const bool on_coded = coded->has_coded() && rows <= CodedBf16Matrix::kMaxRows;
      EXPECT_EQ(coded->ImplementationName(rows) == "coded_bf16", on_coded) << rows;
      EXPECT_NE(plain->ImplementationName(rows), "coded_bf16");
      HostTensor x = Random({rows, s.k}, rng);
      HostTensor got = Poisoned({rows, s.n}), want = Poisoned({rows, s.n});
      ASSERT_TRUE(coded->Forward(got.view(), x.view()).ok());
      ASSERT_TRUE(plain->Forward(want.view(), x.view()).ok());
      std::vector<double> want_d(want.data<float>(), want.data<float>() + rows * s.n);
      EXPECT_TRUE(AllClose(got.data<float>(), want_d, 1e-4, 1e-4))
          << s.n << "x" << s.k << ", " << rows << " row(s)";
    }
  }
}

}  // namespace
}  // namespace llm::cpu
