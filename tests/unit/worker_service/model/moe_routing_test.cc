#include "worker_service/model/moe_routing.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace llm {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::Pointwise;

// softmax(row)[e] for the checks.
std::vector<float> Softmax(const std::vector<float>& row) {
  float sum = 0;
  std::vector<float> p;
  for (float v : row) sum += std::exp(v);
  for (float v : row) p.push_back(std::exp(v) / sum);
  return p;
}

// Three tokens over four experts, top-2: token 0 picks experts 2 and 0, token 1 experts 1 and
// 2, token 2 (a tie of experts 1 and 3 below expert 0) experts 0 and 1.
const std::vector<float> kLogits = {1.0f, -1.0f, 2.0f, 0.0f,   // token 0
                                    0.0f, 3.0f,  1.0f, -2.0f,  // token 1
                                    2.0f, 0.5f,  -1.f, 0.5f};  // token 2

TEST(MoeRoutingTest, GroupsTokensByExpertWithSoftmaxWeights) {
  MoeRouting r;
  r.Route(kLogits, 3, 4, 2, /*normalize=*/false);
  EXPECT_THAT(r.offsets, ElementsAre(0, 2, 4, 6, 6));
  EXPECT_THAT(r.tokens, ElementsAre(0, 2, 1, 2, 0, 1));  // ascending within an expert
  const std::vector<float> p0 = Softmax({1, -1, 2, 0}), p1 = Softmax({0, 3, 1, -2});
  const std::vector<float> p2 = Softmax({2, 0.5f, -1, 0.5f});
  EXPECT_THAT(r.weights, Pointwise(FloatNear(1e-6f),
                                   std::vector<float>{p0[0], p2[0], p1[1], p2[1], p0[2], p1[2]}));
  EXPECT_EQ(r.count(3), 0);
}

TEST(MoeRoutingTest, NormalizedWeightsSumToOnePerToken) {
  MoeRouting r;
  r.Route(kLogits, 3, 4, 2, /*normalize=*/true);
  std::vector<float> per_token(3, 0.0f);
  for (size_t i = 0; i < r.tokens.size(); ++i) per_token[r.tokens[i]] += r.weights[i];
  EXPECT_THAT(per_token, Pointwise(FloatNear(1e-6f), std::vector<float>{1, 1, 1}));
  // Token 0: p[2] / (p[0] + p[2]) = 1 / (1 + e^-1).
  EXPECT_NEAR(r.weights[4], 1.0f / (1.0f + std::exp(-1.0f)), 1e-6f);
}

TEST(MoeRoutingTest, ReusedAcrossStepsOfOtherSizes) {
  MoeRouting r;
  r.Route(kLogits, 3, 4, 2, false);
  r.Route(std::vector<float>{0.0f, 5.0f, 1.0f, 2.0f}, 1, 4, 1, true);
  EXPECT_THAT(r.offsets, ElementsAre(0, 0, 1, 1, 1));
  EXPECT_THAT(r.tokens, ElementsAre(0));
  EXPECT_THAT(r.weights, ElementsAre(1.0f));
  r.Route({}, 0, 4, 2, true);  // an empty step
  EXPECT_THAT(r.offsets, ElementsAre(0, 0, 0, 0, 0));
  EXPECT_TRUE(r.tokens.empty());
}

}  // namespace
}  // namespace llm
