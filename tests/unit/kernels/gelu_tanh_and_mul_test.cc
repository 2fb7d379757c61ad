// GeluTanhAndMul against PyTorch's gelu(approximate='tanh') formula computed in double:
//   0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) * up.
// Tolerance: atol 1e-6 + rtol 1e-6. The op's v / (1 + exp(-2u)) is within a few f32 ulp of the
// exact value except where exp(-2u) is huge (g below about -3): there its argument's f32
// rounding (|2u| ulps) shows as relative error, on outputs below 1e-3 * |up| that atol covers.
#include <cmath>
#include <limits>
#include <numbers>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/test_util.h"

namespace llm::ops {
namespace {

using testing::AllClose;
using testing::ExpectGatedShapeErrorsNameTheArgument;
using testing::ExpectHalvesOfARowGiveTheWholeRowsBits;
using testing::GatedRow;
using testing::Poisoned;
using testing::Random;

constexpr double kAtol = 1e-6, kRtol = 1e-6;

double GeluTanh(double v) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * v * (1.0 + std::tanh(k * (v + 0.044715 * v * v * v)));
}

std::vector<double> Naive(const HostTensor& x, int64_t tokens, int64_t inter) {
  std::vector<double> want(tokens * inter);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < inter; ++i) {
      const double g = x.data<float>()[t * 2 * inter + i];
      const double u = x.data<float>()[t * 2 * inter + inter + i];
      want[t * inter + i] = GeluTanh(g) * u;
    }
  }
  return want;
}

TEST(GeluTanhAndMul, MatchesTheFormula) {
  std::mt19937 rng(40);
  // Up to rows past the op's threshold for the OpenMP pool (64 x 1536); widths with and
  // without a partial 8-float register.
  for (auto [tokens, inter] :
       {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {16, 300}, {2, 32}, {64, 1536}, {40, 1001}}) {
    HostTensor x = Random({tokens, 2 * inter}, rng, -8.0f, 8.0f);
    HostTensor out = Poisoned({tokens, inter});
    ASSERT_TRUE(GeluTanhAndMul({}, out.view(), x.view()).ok());
    EXPECT_TRUE(AllClose(out.data<float>(), Naive(x, tokens, inter), kAtol, kRtol))
        << tokens << "x" << inter;
  }
}

// Relative accuracy near 0 and on the positive side, where outputs are not small: rtol 1e-6
// with no atol.
TEST(GeluTanhAndMul, RelativeErrorBelow1e6WhereGeluIsNotTiny) {
  std::mt19937 rng(41);
  const int64_t tokens = 4, inter = 4099;
  HostTensor x = Random({tokens, 2 * inter}, rng, -1.5f, 30.0f);
  HostTensor out = Poisoned({tokens, inter});
  ASSERT_TRUE(GeluTanhAndMul({}, out.view(), x.view()).ok());
  EXPECT_TRUE(AllClose(out.data<float>(), Naive(x, tokens, inter), 0.0, kRtol));
}

// Far outside the usual range: gelu(v) -> v for large v, -> -0 for very negative v (exp(-2u)
// overflows to +inf, v / inf); infinities as PyTorch's formula gives them: gelu(+inf) = +inf,
// gelu(-inf) = -inf * 0 = NaN; NaN stays NaN.
TEST(GeluTanhAndMul, ExtremeInputs) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> gates = {0.0f,   -0.0f, 1e-30f, -1e-30f, 12.0f,  -12.0f, 50.0f,
                                    -50.0f, 1e6f,  -1e6f,  1e30f,   -1e30f, 3e38f,  -3e38f};
  const int64_t n = static_cast<int64_t>(gates.size());
  HostTensor x = GatedRow(gates, 0.5f);
  HostTensor out = Poisoned({1, n});
  ASSERT_TRUE(GeluTanhAndMul({}, out.view(), x.view()).ok());
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = GeluTanh(gates[i]) * 0.5;
  EXPECT_TRUE(AllClose(out.data<float>(), want, 1e-37, kRtol));

  HostTensor special(DType::kF32, {1, 6});
  special.data<float>()[0] = inf;
  special.data<float>()[1] = -inf;
  special.data<float>()[2] = std::numeric_limits<float>::quiet_NaN();
  special.data<float>()[3] = special.data<float>()[4] = special.data<float>()[5] = 1.0f;
  HostTensor o2 = Poisoned({1, 3});
  ASSERT_TRUE(GeluTanhAndMul({}, o2.view(), special.view()).ok());
  EXPECT_EQ(o2.data<float>()[0], inf);
  EXPECT_TRUE(std::isnan(o2.data<float>()[1]));
  EXPECT_TRUE(std::isnan(o2.data<float>()[2]));
}

TEST(GeluTanhAndMul, HalvesOfARowGiveTheWholeRowsBits) {
  ExpectHalvesOfARowGiveTheWholeRowsBits(
      [](const TensorView& out, const TensorView& x) { return GeluTanhAndMul({}, out, x); }, 42);
}

TEST(GeluTanhAndMul, ErrorsNameTheArgument) {
  ExpectGatedShapeErrorsNameTheArgument(
      [](const TensorView& out, const TensorView& x) { return GeluTanhAndMul({}, out, x); },
      "GeluTanhAndMul");
  HostTensor x16(DType::kF16, {2, 8}), out16(DType::kF16, {2, 4});
  EXPECT_EQ(GeluTanhAndMul({}, out16.view(), x16.view()).message,
            "GeluTanhAndMul: x: the CPU backend takes f32 only, got f16 [2, 8] on cpu");
}

}  // namespace
}  // namespace llm::ops
