// SiluAndMul against silu(gate) * up computed in double.
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/test_util.h"

namespace llm::ops {
namespace {

using testing::AllClose;
using testing::Poisoned;
using testing::Random;

TEST(SiluAndMul, MatchesTheFormula) {
  std::mt19937 rng(20);
  for (auto [tokens, inter] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {16, 300}}) {
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

TEST(SiluAndMul, ErrorsNameTheArgument) {
  std::mt19937 rng(21);
  HostTensor odd = Random({2, 7}, rng);
  HostTensor out = Poisoned({2, 3});
  EXPECT_EQ(SiluAndMul({}, out.view(), odd.view()).message,
            "SiluAndMul: x: expected an even last dim [T, 2 * I], got f32 [2, 7] on cpu");
  HostTensor x = Random({2, 8}, rng);
  EXPECT_EQ(SiluAndMul({}, out.view(), x.view()).message,
            "SiluAndMul: out: expected f32 [2, 4], got f32 [2, 3] on cpu");
}

}  // namespace
}  // namespace llm::ops
