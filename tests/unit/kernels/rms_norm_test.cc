// RmsNorm and FusedAddRmsNorm against a naive double-precision formula.
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

// want[t][h] = x[t][h] / sqrt(mean(x[t]^2) + eps) * w[h]
std::vector<double> NaiveRmsNorm(const float* x, const float* w, int64_t tokens, int64_t hidden,
                                 double eps) {
  std::vector<double> want(tokens * hidden);
  for (int64_t t = 0; t < tokens; ++t) {
    double ms = 0;
    for (int64_t h = 0; h < hidden; ++h) ms += double(x[t * hidden + h]) * x[t * hidden + h];
    ms /= hidden;
    for (int64_t h = 0; h < hidden; ++h) {
      want[t * hidden + h] = x[t * hidden + h] / std::sqrt(ms + eps) * w[h];
    }
  }
  return want;
}

TEST(RmsNorm, MatchesTheFormula) {
  std::mt19937 rng(10);
  // The last: rows past the op's threshold for the OpenMP pool.
  for (auto [tokens, hidden] : {std::pair<int64_t, int64_t>{1, 1}, {5, 17}, {9, 256}, {100, 576}}) {
    HostTensor x = Random({tokens, hidden}, rng, -3.0f, 3.0f);
    HostTensor w = Random({hidden}, rng, 0.5f, 1.5f);
    HostTensor out = Poisoned({tokens, hidden});
    ASSERT_TRUE(RmsNorm({}, out.view(), x.view(), w.view(), 1e-5f).ok());
    EXPECT_TRUE(AllClose(out.data<float>(),
                         NaiveRmsNorm(x.data<float>(), w.data<float>(), tokens, hidden, 1e-5), 1e-6,
                         1e-5))
        << tokens << "x" << hidden;
  }
}

TEST(RmsNorm, InPlace) {
  std::mt19937 rng(11);
  HostTensor x = Random({4, 64}, rng);
  HostTensor w = Random({64}, rng);
  const std::vector<double> want = NaiveRmsNorm(x.data<float>(), w.data<float>(), 4, 64, 1e-6);
  ASSERT_TRUE(RmsNorm({}, x.view(), x.view(), w.view(), 1e-6f).ok());
  EXPECT_TRUE(AllClose(x.data<float>(), want, 1e-6, 1e-5));
}

TEST(FusedAddRmsNorm, AddsIntoResidualThenNormalizes) {
  std::mt19937 rng(12);
  for (auto [kTokens, kHidden] : {std::pair<int64_t, int64_t>{6, 96}, {100, 576}}) {
    HostTensor x = Random({kTokens, kHidden}, rng);
    HostTensor residual = Random({kTokens, kHidden}, rng);
    HostTensor w = Random({kHidden}, rng);
    std::vector<float> sum(kTokens * kHidden);
    std::vector<double> sum_d(kTokens * kHidden);
    for (int64_t i = 0; i < kTokens * kHidden; ++i) {
      sum[i] = residual.data<float>()[i] + x.data<float>()[i];
      sum_d[i] = sum[i];
    }
    const std::vector<double> want =
        NaiveRmsNorm(sum.data(), w.data<float>(), kTokens, kHidden, 1e-5);
    ASSERT_TRUE(FusedAddRmsNorm({}, x.view(), residual.view(), w.view(), 1e-5f).ok());
    EXPECT_TRUE(AllClose(residual.data<float>(), sum_d, 0, 0)) << kTokens;
    EXPECT_TRUE(AllClose(x.data<float>(), want, 1e-6, 1e-5)) << kTokens;
  }
}

TEST(RmsNorm, ErrorsNameTheArgument) {
  std::mt19937 rng(13);
  HostTensor x = Random({2, 8}, rng);
  HostTensor w = Random({7}, rng);
  HostTensor out = Poisoned({2, 8});
  EXPECT_EQ(RmsNorm({}, out.view(), x.view(), w.view(), 1e-5f).message,
            "RmsNorm: weight: expected f32 [8], got f32 [7] on cpu");
  HostTensor residual = Random({3, 8}, rng);
  HostTensor w8 = Random({8}, rng);
  EXPECT_EQ(FusedAddRmsNorm({}, x.view(), residual.view(), w8.view(), 1e-5f).message,
            "FusedAddRmsNorm: residual: expected f32 [2, 8], got f32 [3, 8] on cpu");
  EXPECT_EQ(RmsNorm({}, out.view(), x.view(), w8.view(), 0.0f).message,
            "RmsNorm: eps must be > 0, got 0.000000");
}

}  // namespace
}  // namespace llm::ops
