// Scale (x *= factor) and Softcap (x = cap * tanh(x / cap)) in place, against double-precision
// loops. Scale: bit-exact (a product of two floats is exact in double, so rounding it to f32 is
// the f32 multiply). Softcap: rtol 1e-6, no atol: the op's tanh (Cephes' tanhf on AVX2, else
// std::tanh) is within about 2.5e-7 of tanh, plus x / cap's and the product's roundings (2^-24
// each).
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/test_util.h"

namespace llm::ops {
namespace {

using testing::AllClose;
using testing::Random;

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(Scale, MultipliesEveryElementExactly) {
  std::mt19937 rng(50);
  // Any shape: 0-d, 1-d with a partial register, 3-d, and past the OpenMP threshold.
  HostTensor scalar(DType::kF32, std::initializer_list<int64_t>{});
  scalar.data<float>()[0] = 3.0f;
  std::vector<HostTensor> xs;
  xs.push_back(std::move(scalar));
  xs.push_back(Random({13}, rng, -100.0f, 100.0f));
  xs.push_back(Random({3, 5, 7}, rng, -100.0f, 100.0f));
  xs.push_back(Random({5, 20011}, rng, -100.0f, 100.0f));
  for (const float factor : {std::sqrt(2304.0f), 45.25f, -0.5f, 0.0f}) {
    for (const HostTensor& x : xs) {
      SCOPED_TRACE(::testing::Message() << x.view().ToString() << " * " << factor);
      const std::vector<float> before = testing::ToVector(x);
      ASSERT_TRUE(Scale({}, x.view(), factor).ok());
      for (int64_t i = 0; i < x.numel(); ++i) {
        const float want = static_cast<float>(static_cast<double>(before[i]) * factor);
        ASSERT_EQ(std::memcmp(&x.data<float>()[i], &want, sizeof(float)), 0)
            << "element " << i << ": got " << x.data<float>()[i] << ", want " << want;
      }
    }
  }
}

TEST(Scale, EmptyIsANoOp) {
  HostTensor x(DType::kF32, {0, 4});
  EXPECT_TRUE(Scale({}, x.view(), 2.0f).ok());
  TensorView null_empty = x.view();
  null_empty.data = nullptr;
  EXPECT_TRUE(Scale({}, null_empty, 2.0f).ok());
}

TEST(Scale, ErrorsNameTheArgument) {
  std::mt19937 rng(51);
  HostTensor x = Random({4, 6}, rng);
  TensorView cols = x.view();  // every other column: not contiguous
  cols.shape = {4, 3};
  cols.strides = {6, 2};
  EXPECT_EQ(Scale({}, cols, 2.0f).message,
            "Scale: x: must be contiguous, got f32 [4, 3] on cpu with non-row-major strides");
  EXPECT_EQ(Scale({}, x.view(), kInf).message, "Scale: factor must be finite, got inf");
  EXPECT_EQ(Scale({}, x.view(), std::nanf("")).message, "Scale: factor must be finite, got nan");
  HostTensor h(DType::kBF16, {2, 3});
  EXPECT_EQ(Scale({}, h.view(), 2.0f).message,
            "Scale: x: the CPU backend takes f32 only, got bf16 [2, 3] on cpu");
  HostTensor i(DType::kI32, {2});
  EXPECT_EQ(Scale({}, i.view(), 2.0f).message,
            "Scale: x: expected f32|bf16|f16, any shape, got i32 [2] on cpu");
}

std::vector<double> NaiveSoftcap(const std::vector<float>& x, double cap) {
  std::vector<double> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = cap * std::tanh(x[i] / cap);
  return want;
}

TEST(Softcap, MatchesTheFormula) {
  std::mt19937 rng(52);
  // Gemma 2's final_logit_softcapping (30) and attn_logit_softcapping (50); sizes with and
  // without a partial register, the last past the OpenMP threshold.
  for (const float cap : {30.0f, 50.0f, 1.0f}) {
    for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{9}, int64_t{1000}, int64_t{70001}}) {
      SCOPED_TRACE(::testing::Message() << "cap " << cap << ", n " << n);
      HostTensor x = Random({n}, rng, -12.0f * cap, 12.0f * cap);
      const std::vector<double> want = NaiveSoftcap(testing::ToVector(x), cap);
      ASSERT_TRUE(Softcap({}, x.view(), cap).ok());
      EXPECT_TRUE(AllClose(x.data<float>(), want, 0.0, 1e-6));
    }
  }
}

// The tanh itself: cap 1 over every 257th float in [-10, 10] (both sides of the polynomial's
// 0.625 cut, tiny values near 0, the saturation past 9), relative error <= 1e-6; and the
// largest seen stays below 5e-7 (Cephes' tanhf: about 2.5e-7).
TEST(Softcap, TanhRelativeErrorBelow1e6) {
  std::vector<float> values;
  for (uint32_t bits = 0; bits < 0x41200000u; bits += 257) {  // 0 .. 10
    float v;
    std::memcpy(&v, &bits, sizeof(v));
    values.push_back(v);
    values.push_back(-v);
  }
  HostTensor x(DType::kF32, {static_cast<int64_t>(values.size())});
  std::memcpy(x.view().data, values.data(), values.size() * sizeof(float));
  const std::vector<double> want = NaiveSoftcap(values, 1.0);
  ASSERT_TRUE(Softcap({}, x.view(), 1.0f).ok());
  EXPECT_TRUE(AllClose(x.data<float>(), want, 0.0, 1e-6));
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] != 0)
      worst = std::max(worst, std::abs(x.data<float>()[i] - want[i]) / std::abs(want[i]));
  }
  EXPECT_LT(worst, 5e-7);
}

TEST(Softcap, SpecialValues) {
  const std::vector<float> in = {
      0.0f, -0.0f, kInf, -kInf, 3e38f, -3e38f, std::numeric_limits<float>::quiet_NaN()};
  HostTensor x(DType::kF32, {static_cast<int64_t>(in.size())});
  std::memcpy(x.view().data, in.data(), in.size() * sizeof(float));
  ASSERT_TRUE(Softcap({}, x.view(), 30.0f).ok());
  const float* got = x.data<float>();
  EXPECT_EQ(got[0], 0.0f);
  EXPECT_FALSE(std::signbit(got[0]));
  EXPECT_EQ(got[1], 0.0f);
  EXPECT_TRUE(std::signbit(got[1]));
  EXPECT_EQ(got[2], 30.0f);
  EXPECT_EQ(got[3], -30.0f);
  EXPECT_EQ(got[4], 30.0f);
  EXPECT_EQ(got[5], -30.0f);
  EXPECT_TRUE(std::isnan(got[6]));
}

TEST(Softcap, ErrorsNameTheArgument) {
  std::mt19937 rng(53);
  HostTensor x = Random({2, 5}, rng);
  for (const float cap : {0.0f, -30.0f}) {
    EXPECT_EQ(Softcap({}, x.view(), cap).message,
              "Softcap: cap must be finite and > 0, got " + std::to_string(cap));
  }
  EXPECT_EQ(Softcap({}, x.view(), kInf).message, "Softcap: cap must be finite and > 0, got inf");
  EXPECT_EQ(Softcap({}, x.view(), std::nanf("")).message,
            "Softcap: cap must be finite and > 0, got nan");
  TensorView t = x.view();  // transposed: not contiguous
  t.shape = {5, 2};
  t.strides = {1, 5};
  EXPECT_EQ(Softcap({}, t, 30.0f).message,
            "Softcap: x: must be contiguous, got f32 [5, 2] on cpu with non-row-major strides");
  HostTensor h(DType::kF16, {3});
  EXPECT_EQ(Softcap({}, h.view(), 30.0f).message,
            "Softcap: x: the CPU backend takes f32 only, got f16 [3] on cpu");
}

}  // namespace
}  // namespace llm::ops
