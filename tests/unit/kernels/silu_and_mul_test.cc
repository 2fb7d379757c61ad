// SiluAndMul against silu(gate) * up computed in double.
#include <cmath>
#include <limits>
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

TEST(SiluAndMul, MatchesTheFormula) {
  std::mt19937 rng(20);
  // Up to rows past the op's threshold for the OpenMP pool (64 x 1536); widths with and
  // without a partial AVX-512 register.
  for (auto [tokens, inter] :
       {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {16, 300}, {2, 32}, {64, 1536}, {40, 1001}}) {
    HostTensor x = Random({tokens, 2 * inter}, rng, -8.0f, 8.0f);
    HostTensor out = Poisoned({tokens, inter});
    ASSERT_TRUE(SiluAndMul({}, out.view(), x.view()).ok());
    std::vector<double> want(tokens * inter);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t i = 0; i < inter; ++i) {
        const double g = x.data<float>()[t * 2 * inter + i];
        const double u = x.data<float>()[t * 2 * inter + inter + i];
        want[t * inter + i] = g / (1.0 + std::exp(-g)) * u;
      }
    }
    EXPECT_TRUE(AllClose(out.data<float>(), want, 1e-6, 1e-5)) << tokens << "x" << inter;
  }
}

// Far outside the usual range, as the formula in float gives it: silu(g) -> g for large g, -> -0
// for very negative g (exp(-g) overflows to +inf, g / inf); silu(+inf) = +inf, silu(-inf) =
// -inf / inf = NaN; NaN stays NaN.
TEST(SiluAndMul, ExtremeInputs) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> gates = {0.0f,
                                    -0.0f,
                                    1e-30f,
                                    -1e-30f,
                                    20.0f,
                                    -20.0f,
                                    88.0f,
                                    -88.0f,
                                    89.0f,
                                    -89.0f,
                                    1e6f,
                                    -1e6f,
                                    3e38f,
                                    -3e38f,
                                    inf,
                                    -inf,
                                    std::numeric_limits<float>::quiet_NaN()};
  const int64_t n = static_cast<int64_t>(gates.size());
  HostTensor x = GatedRow(gates, 0.5f);
  HostTensor out = Poisoned({1, n});
  ASSERT_TRUE(SiluAndMul({}, out.view(), x.view()).ok());
  for (int64_t i = 0; i < n; ++i) {
    const float g = gates[i], got = out.data<float>()[i];
    if (std::isnan(g) || g == -inf) {
      EXPECT_TRUE(std::isnan(got)) << "gate " << g << ": " << got;
      continue;
    }
    const double want =
        g == inf ? inf : static_cast<double>(g) / (1.0 + std::exp(-double{g})) * 0.5;
    if (std::isinf(want)) {
      EXPECT_EQ(got, want) << "gate " << g;
    } else {
      EXPECT_NEAR(got, want, 1e-6 * std::fabs(want) + 1e-35) << "gate " << g;
      EXPECT_EQ(std::signbit(got), std::signbit(want)) << "gate " << g << ": " << got;
    }
  }
}

TEST(SiluAndMul, HalvesOfARowGiveTheWholeRowsBits) {
  ExpectHalvesOfARowGiveTheWholeRowsBits(
      [](const TensorView& out, const TensorView& x) { return SiluAndMul({}, out, x); }, 21);
}

TEST(SiluAndMul, ErrorsNameTheArgument) {
  ExpectGatedShapeErrorsNameTheArgument(
      [](const TensorView& out, const TensorView& x) { return SiluAndMul({}, out, x); },
      "SiluAndMul");
}

}  // namespace
}  // namespace llm::ops
