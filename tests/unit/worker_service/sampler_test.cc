#include "worker_service/sampler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/philox.h"

namespace llm {
namespace {

std::vector<float> RandomLogits(int vocab, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(vocab);
  for (float& x : v) x = d(rng);
  return v;
}

// Draws `n` tokens for one sequence whose logits are `logits` at every step (no output
// tokens added, so penalties stay off).
std::vector<TokenId> Draw(const SamplingParams& p, const std::vector<float>& logits, int n,
                          int seq_index = 0) {
  SequenceSampler seq(p, seq_index, {});
  SequenceSampler* rows[] = {&seq};
  std::vector<TokenId> out;
  for (int i = 0; i < n; ++i) {
    std::vector<float> row = logits;
    out.push_back(Sampler::Sample(row, static_cast<int>(row.size()), rows)[0].token);
  }
  return out;
}

SamplingParams Params(double temperature, uint64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  return p;
}

// Random123's known-answer vectors for Philox4x32-10.
TEST(Philox, MatchesRandom123KnownAnswers) {
  using philox::U32x4;
  struct Kat {
    U32x4 ctr;
    uint32_t k0, k1;
    U32x4 want;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       0xffffffff,
       0xffffffff,
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       0xa4093822,
       0x299f31d0,
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Kat& k : kats) {
    const U32x4 got = philox::Philox4x32_10(k.ctr, k.k0, k.k1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], k.want.v[i]) << "word " << i;
  }
}

TEST(Philox, UniformsAreInTheOpenUnitIntervalAndUnbiased) {
  EXPECT_GT(philox::Uniform(0), 0.0);
  EXPECT_LT(philox::Uniform(0xffffffffu), 1.0);
  double sum = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) sum += philox::Uniform(philox::DrawBits(42, 7, i));
  EXPECT_NEAR(sum / n, 0.5, 0.005);  // sd of the mean: 0.29 / sqrt(n) = 0.0009
}

TEST(Sampler, UnseededSequencesDrawDifferentStreams) {
  const std::vector<float> logits = RandomLogits(64, 3, 1.0f);
  SamplingParams p;
  EXPECT_NE(Draw(p, logits, 50), Draw(p, logits, 50));
  SequenceSampler a(p, 0, {}), b(p, 0, {});
  EXPECT_NE(a.key(), b.key());
}

TEST(Sampler, TiesAtTheTopKAndTopPBoundariesKeepTheLowestIds) {
  // Scaled logits: 2 (ids 4, 6), 1 (ids 1, 3, 7), 0 (others).
  const std::vector<float> logits{0, 1, 0, 1, 2, 0, 2, 1};
  SamplingParams p = Params(1.0, 1);
  p.top_k = 3;
  std::vector<TokenId> kept = Sampler::KeptTokens(p, logits);
  EXPECT_EQ(kept, (std::vector<TokenId>{4, 6, 1}));
  // top_p: the two 2s hold 2e^2 / (2e^2 + 3e + 3) = 0.57 of the mass; 0.6 needs one more.
  p.top_k = -1;
  p.top_p = 0.6;
  kept = Sampler::KeptTokens(p, logits);
  EXPECT_EQ(kept, (std::vector<TokenId>{4, 6, 1}));
}

TEST(Sampler, GreedyIsTheArgmaxAfterPenalties) {
  std::vector<float> logits{1.0f, 3.0f, 2.5f, -1.0f};
  SamplingParams p = Params(0.0, 1);
  EXPECT_EQ(Draw(p, logits, 1)[0], 1);
  p.repetition_penalty = 2.0;  // token 1 is in the prompt: 3 / 2 = 1.5 < 2.5
  const TokenId prompt[] = {1};
  SequenceSampler seq(p, 0, prompt);
  SequenceSampler* rows[] = {&seq};
  EXPECT_EQ(Sampler::Sample(logits, 4, rows)[0].token, 2);
}

TEST(Sampler, PenaltiesChangeLogitsExactlyAsSpecified) {
  SamplingParams p = Params(1.0, 1);
  p.repetition_penalty = 1.5;
  p.frequency_penalty = 0.5;
  p.presence_penalty = 0.25;
  const TokenId prompt[] = {1, 2};
  SequenceSampler seq(p, 0, prompt);
  for (TokenId t : {2, 3, 3}) seq.AddOutputToken(t);
  std::vector<float> row{0.7f, 3.0f, -2.0f, 1.2f, 5.0f};
  Sampler::ApplyPenalties(seq, row);
  EXPECT_FLOAT_EQ(row[0], 0.7f);                            // untouched
  EXPECT_FLOAT_EQ(row[1], 3.0f / 1.5f);                     // prompt, positive: divided
  EXPECT_FLOAT_EQ(row[2], -2.0f * 1.5f - 0.5f - 0.25f);     // prompt + once in output, negative
  EXPECT_FLOAT_EQ(row[3], 1.2f / 1.5f - 2 * 0.5f - 0.25f);  // twice in output
  EXPECT_FLOAT_EQ(row[4], 5.0f);
}

TEST(Sampler, SameSeedSameTokensWhateverElseIsInTheBatch) {
  const std::vector<float> logits = RandomLogits(64, 1, 1.0f);
  const SamplingParams p = Params(1.0, 1234);
  const std::vector<TokenId> alone = Draw(p, logits, 50);
  EXPECT_EQ(Draw(p, logits, 50), alone);
  EXPECT_NE(Draw(Params(1.0, 4321), logits, 50), alone);

  // The same sequence in a batch with two others, one of them unseeded.
  SequenceSampler seq(p, 0, {});
  SamplingParams other = Params(0.7, 99);
  other.top_k = 5;
  SequenceSampler a(other, 0, {});
  SamplingParams unseeded;
  SequenceSampler b(unseeded, 0, {});
  SequenceSampler* rows[] = {&a, &seq, &b};
  std::vector<TokenId> batched;
  for (int i = 0; i < 50; ++i) {
    std::vector<float> batch = RandomLogits(64, 100 + i, 1.0f);
    batch.insert(batch.end(), logits.begin(), logits.end());
    const std::vector<float> third = RandomLogits(64, 200 + i, 1.0f);
    batch.insert(batch.end(), third.begin(), third.end());
    batched.push_back(Sampler::Sample(batch, 64, rows)[1].token);
  }
  EXPECT_EQ(batched, alone);
  // Sequence 1 of the same request draws its own stream.
  EXPECT_NE(Draw(p, logits, 50, /*seq_index=*/1), alone);
}

// The tokens a naive implementation allows: temperature, min-p, top-k, top-p in that order.
std::vector<bool> Allowed(const SamplingParams& p, const std::vector<float>& logits) {
  const int v = static_cast<int>(logits.size());
  std::vector<double> prob(v);
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (int i = 0; i < v; ++i) sum += prob[i] = std::exp((logits[i] - mx) / p.temperature);
  for (double& q : prob) q /= sum;
  const double pmax = *std::max_element(prob.begin(), prob.end());
  std::vector<bool> ok(v);
  for (int i = 0; i < v; ++i) ok[i] = prob[i] >= p.min_p * pmax;
  std::vector<int> idx(v);
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int a, int b) { return prob[a] > prob[b]; });
  double kept = 0;
  int rank = 0;
  for (int i : idx) {
    if (!ok[i]) continue;
    if (p.top_k > 0 && rank >= p.top_k) ok[i] = false;
    ++rank;
    if (ok[i]) kept += prob[i];
  }
  double cum = 0;
  bool reached = false;
  for (int i : idx) {
    if (!ok[i]) continue;
    if (reached) {
      ok[i] = false;
      continue;
    }
    cum += prob[i];
    reached = cum >= p.top_p * kept;
  }
  return ok;
}

TEST(Sampler, TopKTopPAndMinPNeverEmitExcludedTokens) {
  struct Case {
    int top_k;
    double top_p, min_p;
  };
  for (const Case c : {Case{5, 1.0, 0.0}, Case{-1, 0.6, 0.0}, Case{-1, 1.0, 0.2},
                       Case{8, 0.8, 0.05}, Case{1, 1.0, 0.0}}) {
    SamplingParams p = Params(0.9, 7);
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    for (uint32_t s = 0; s < 5; ++s) {
      const std::vector<float> logits = RandomLogits(50, s, 2.0f);
      const std::vector<bool> ok = Allowed(p, logits);
      const std::vector<TokenId> kept = Sampler::KeptTokens(p, logits);
      EXPECT_EQ(static_cast<int>(kept.size()), std::count(ok.begin(), ok.end(), true));
      for (TokenId t : kept) EXPECT_TRUE(ok[t]) << "kept token " << t;
      std::map<TokenId, int> seen;
      for (TokenId t : Draw(p, logits, 2000)) {
        ASSERT_TRUE(ok[t]) << "token " << t << " excluded (top_k " << c.top_k << ", top_p "
                           << c.top_p << ", min_p " << c.min_p << ")";
        ++seen[t];
      }
      // And every allowed token is reachable: all of them show up when few are allowed.
      const int num_ok = static_cast<int>(std::count(ok.begin(), ok.end(), true));
      if (num_ok <= 5) {
        EXPECT_EQ(static_cast<int>(seen.size()), num_ok);
      }
    }
  }
}

// Pearson's chi-square of observed counts against expected probabilities.
double ChiSquare(const std::vector<int>& counts, const std::vector<double>& probs, int n) {
  double chi2 = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (probs[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i;
      continue;
    }
    const double e = probs[i] * n;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi2;
}

TEST(Sampler, FrequenciesMatchTheSoftmax) {
  const std::vector<float> logits{0.5f, -1.0f, 2.0f, 0.0f, 1.5f, -0.5f, 1.0f, -2.0f};
  const int n = 40000;
  // With temperature 0.8: expected softmax(logits / 0.8); 7 degrees of freedom.
  const SamplingParams p = Params(0.8, 2024);
  std::vector<int> counts(8);
  for (TokenId t : Draw(p, logits, n)) ++counts[t];
  std::vector<double> expect(8);
  double sum = 0;
  for (int i = 0; i < 8; ++i) sum += expect[i] = std::exp(logits[i] / 0.8);
  for (double& e : expect) e /= sum;
  EXPECT_LT(ChiSquare(counts, expect, n), 24.32);  // p = 0.001 critical value, df 7

  // top_k 4 then top_p 0.85, renormalized: the naive allowed set, softmax over it. The top
  // four hold 0.455, 0.276, 0.167 and 0.102 of their mass: top_p keeps three.
  SamplingParams q = Params(1.0, 77);
  q.top_k = 4;
  q.top_p = 0.85;
  const std::vector<bool> ok = Allowed(q, logits);
  std::vector<double> expect2(8, 0.0);
  double s2 = 0;
  for (int i = 0; i < 8; ++i) {
    if (ok[i]) s2 += expect2[i] = std::exp(logits[i]);
  }
  for (double& e : expect2) e /= s2;
  std::vector<int> counts2(8);
  for (TokenId t : Draw(q, logits, n)) ++counts2[t];
  const int df = static_cast<int>(std::count(ok.begin(), ok.end(), true)) - 1;
  ASSERT_EQ(df, 2);
  EXPECT_LT(ChiSquare(counts2, expect2, n), 13.82);  // p = 0.001, df 2
}

TEST(Sampler, LogprobsAreTheRawDistribution) {
  std::vector<float> logits{1.0f, 3.0f, 2.0f, 0.0f};
  SamplingParams p = Params(0.5, 3);
  p.logprobs = 2;
  p.repetition_penalty = 1.7;  // changes the sampling, not the reported logprobs
  const TokenId prompt[] = {1};
  SequenceSampler seq(p, 0, prompt);
  SequenceSampler* rows[] = {&seq};
  std::vector<float> row = logits;
  const SampledToken s = Sampler::Sample(row, 4, rows)[0];
  double lse = 0;
  for (float x : logits) lse += std::exp(x);
  lse = std::log(lse);
  EXPECT_NEAR(s.logprob, logits[s.token] - lse, 1e-6);
  ASSERT_EQ(s.top_logprobs.size(), 2u);
  EXPECT_EQ(s.top_logprobs[0].first, 1);
  EXPECT_NEAR(s.top_logprobs[0].second, 3.0 - lse, 1e-6);
  EXPECT_EQ(s.top_logprobs[1].first, 2);
  EXPECT_NEAR(s.top_logprobs[1].second, 2.0 - lse, 1e-6);
}

}  // namespace
}  // namespace llm
