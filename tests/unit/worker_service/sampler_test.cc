#include "worker_service/sampler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/philox.h"
#include "protocol/batch_state.h"
#include "tests/testing/sampling_sequence.h"

namespace llm {
namespace {

using ::llm::testing::SamplingSequence;

std::vector<float> RandomLogits(int vocab, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(vocab);
  for (float& x : v) x = d(rng);
  return v;
}

// Draws `n` tokens for one sequence whose logits are `logits` at every step, each token
// recorded in its state as a worker does.
std::vector<TokenId> Draw(const SamplingParams& p, const std::vector<float>& logits, int n,
                          int seq_index = 0) {
  SamplingSequence seq(p, seq_index);
  const SampleRow rows[] = {seq.row()};
  std::vector<TokenId> out;
  for (int i = 0; i < n; ++i) {
    std::vector<float> row = logits;
    out.push_back(Sampler::Sample(row, static_cast<int>(row.size()), rows)[0].token);
    seq.Append(out.back());
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
  SamplingSequence seq(p, 0, prompt);
  const SampleRow rows[] = {seq.row()};
  EXPECT_EQ(Sampler::Sample(logits, 4, rows)[0].token, 2);
}

TEST(Sampler, PenaltiesChangeLogitsExactlyAsSpecified) {
  SamplingParams p = Params(1.0, 1);
  p.repetition_penalty = 1.5;
  p.frequency_penalty = 0.5;
  p.presence_penalty = 0.25;
  const TokenId prompt[] = {1, 2, 1};
  SamplingSequence seq(p, 0, prompt);
  for (TokenId t : {2, 3, 3}) seq.Append(t);
  std::vector<float> row{0.7f, 3.0f, -2.0f, 1.2f, 5.0f};
  Sampler::ApplyPenalties(seq.row(), row);
  EXPECT_FLOAT_EQ(row[0], 0.7f);                            // untouched
  EXPECT_FLOAT_EQ(row[1], 3.0f / 1.5f);                     // prompt, positive: divided
  EXPECT_FLOAT_EQ(row[2], -2.0f * 1.5f - 0.5f - 0.25f);     // prompt + once in output, negative
  EXPECT_FLOAT_EQ(row[3], 1.2f / 1.5f - 2 * 0.5f - 0.25f);  // twice in output
  EXPECT_FLOAT_EQ(row[4], 5.0f);
}

TEST(Sampler, LogitBiasMovesTheGreedyArgmax) {
  const std::vector<float> logits{1.0f, 3.0f, 2.5f, -1.0f};
  SamplingParams p = Params(0.0, 1);
  EXPECT_EQ(Draw(p, logits, 1)[0], 1);
  p.logit_bias = {{3, 5.0f}};  // -1 + 5 = 4 > 3
  EXPECT_EQ(Draw(p, logits, 3), (std::vector<TokenId>{3, 3, 3}));
  p.logit_bias = {{1, -100.0f}};  // the argmax banned: the runner-up
  EXPECT_EQ(Draw(p, logits, 1)[0], 2);
}

TEST(Sampler, LogitBiasIsAddedBeforeThePenalties) {
  SamplingParams p = Params(1.0, 1);
  p.repetition_penalty = 2.0;
  p.frequency_penalty = 0.5;
  p.logit_bias = {{0, 1.0f}, {2, -3.0f}};
  const TokenId prompt[] = {0};
  SamplingSequence seq(p, 0, prompt);
  seq.Append(2);
  std::vector<float> row{1.0f, 0.5f, 1.0f};
  Sampler::ApplyLogitBias(p, row);
  Sampler::ApplyPenalties(seq.row(), row);
  EXPECT_FLOAT_EQ(row[0], (1.0f + 1.0f) / 2.0f);         // biased, then divided
  EXPECT_FLOAT_EQ(row[1], 0.5f);                         // untouched
  EXPECT_FLOAT_EQ(row[2], (1.0f - 3.0f) * 2.0f - 0.5f);  // negative once biased: multiplied
}

TEST(Sampler, MinusOneHundredBansATokenUnderSampling) {
  // Token 5 holds nearly all the mass; banned, it is never drawn, and the rest keep their
  // relative frequencies; the reported logprobs stay the raw distribution's.
  std::vector<float> logits = RandomLogits(16, 7, 1.0f);
  logits[5] = 8.0f;
  SamplingParams p = Params(1.0, 99);
  p.logprobs = 2;
  p.logit_bias = {{5, -100.0f}};
  SamplingSequence seq(p, 0);
  const SampleRow rows[] = {seq.row()};
  std::map<TokenId, int> seen;
  for (int i = 0; i < 2000; ++i) {
    std::vector<float> row = logits;
    const SampledToken t = Sampler::Sample(row, 16, rows)[0];
    ++seen[t.token];
    seq.Append(t.token);
    ASSERT_EQ(t.top_logprobs.size(), 2u);
    EXPECT_EQ(t.top_logprobs[0].first, 5);  // raw: still the most likely
  }
  EXPECT_EQ(seen.count(5), 0u);
  EXPECT_GT(seen.size(), 8u);
  // Unbiased, the same seed draws token 5 nearly always.
  p.logit_bias.clear();
  const std::vector<TokenId> plain = Draw(p, logits, 50);
  EXPECT_GT(std::count(plain.begin(), plain.end(), 5), 40);
}

// A structured output's mask: only allowed tokens are drawn, greedy or sampled under every
// filter, with the allowed ones keeping their relative frequencies; logprobs stay raw.
TEST(Sampler, TokenMaskAllowsOnlyItsTokens) {
  std::vector<float> logits = RandomLogits(70, 5, 1.0f);
  logits[9] = 6.0f;  // the argmax, not allowed
  std::vector<uint32_t> mask(3, 0);
  for (int t : {3, 33, 34, 69}) mask[t / 32] |= 1u << (t % 32);
  auto allowed = [&](TokenId t) { return t == 3 || t == 33 || t == 34 || t == 69; };
  for (const SamplingParams& p : {Params(0.0, 1), Params(1.0, 2), Params(0.7, 3)}) {
    SamplingParams q = p;
    q.logprobs = 1;
    if (q.temperature == 0.7) {
      q.top_k = 3;
      q.top_p = 0.8;
      q.min_p = 0.05;
      q.repetition_penalty = 1.2;
    }
    SamplingSequence seq(q, 0);
    SampleRow row = seq.row();
    row.allowed = mask.data();
    const SampleRow rows[] = {row};
    std::map<TokenId, int> seen;
    for (int i = 0; i < 400; ++i) {
      std::vector<float> copy = logits;
      const SampledToken t = Sampler::Sample(copy, 70, rows)[0];
      ASSERT_TRUE(allowed(t.token)) << t.token;
      EXPECT_EQ(t.top_logprobs[0].first, 9);  // raw: the masked argmax is still the likeliest
      ++seen[t.token];
      seq.Append(t.token);
    }
    if (q.temperature == 1.0) EXPECT_EQ(seen.size(), 4u);  // every allowed token drawn
  }
  std::vector<float> row = logits;
  Sampler::ApplyAllowed(mask.data(), row);
  for (int t = 0; t < 70; ++t) {
    EXPECT_EQ(std::isinf(row[t]) && row[t] < 0, !allowed(t)) << t;
  }
}

TEST(Sampler, SameSeedSameTokensWhateverElseIsInTheBatch) {
  const std::vector<float> logits = RandomLogits(64, 1, 1.0f);
  const SamplingParams p = Params(1.0, 1234);
  const std::vector<TokenId> alone = Draw(p, logits, 50);
  EXPECT_EQ(Draw(p, logits, 50), alone);
  EXPECT_NE(Draw(Params(1.0, 4321), logits, 50), alone);

  // The same sequence in a batch with two others, one of them with penalties.
  SamplingSequence seq(p, 0);
  SamplingParams other = Params(0.7, 99);
  other.top_k = 5;
  SamplingSequence a(other, 0);
  SamplingParams penalized = Params(1.3, 7);
  penalized.frequency_penalty = 1.0;
  SamplingSequence b(penalized, 0);
  const SampleRow rows[] = {a.row(), seq.row(), b.row()};
  std::vector<TokenId> batched;
  for (int i = 0; i < 50; ++i) {
    std::vector<float> batch = RandomLogits(64, 100 + i, 1.0f);
    batch.insert(batch.end(), logits.begin(), logits.end());
    const std::vector<float> third = RandomLogits(64, 200 + i, 1.0f);
    batch.insert(batch.end(), third.begin(), third.end());
    const std::vector<SampledToken> out = Sampler::Sample(batch, 64, rows);
    a.Append(out[0].token);
    seq.Append(out[1].token);
    b.Append(out[2].token);
    batched.push_back(out[1].token);
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
  SamplingSequence seq(p, 0, prompt);
  const SampleRow rows[] = {seq.row()};
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

// One request (slot 0) on a worker's BatchState, driven by the steps a scheduler would send: its
// prompt computed in one step (n > 1: forking at that sample), then one decode step at a time,
// each row sampled by the host Sampler from SampleRowOf's rows. The logits of a row depend only
// on its sequence's index and output length (Logit), so two workers that hold the same
// sequences see the same logits.
class OneRequestWorker {
 public:
  static constexpr int kVocab = 64;

  OneRequestWorker(const SamplingParams& params, std::vector<TokenId> prompt)
      : params_(params),
        prompt_(std::move(prompt)),
        batch_({.num_gpu_blocks = 8, .num_cpu_blocks = 0, .block_size = 64, .vocab_size = kVocab}) {
  }

  static float Logit(int position, int seq_index, TokenId token) {
    uint64_t h = (uint64_t(position) * 1000003u + uint64_t(seq_index) * 7919u + uint64_t(token)) *
                 0x9e3779b97f4a7c15ULL;
    h ^= h >> 29;
    return static_cast<float>(static_cast<int>(h % 2000)) / 400.0f - 2.5f;
  }

  // Admits the request; with `outputs` (one per live sequence), as resumed on workers that never
  // held it: those sequences come with their output so far, and each samples its next token.
  void Admit(const std::vector<std::vector<TokenId>>& outputs = {}) {
    SchedulerOutput step;
    step.step_id = ++step_id_;
    const int live = outputs.empty() ? 1 : static_cast<int>(outputs.size());
    for (int j = 0; j < live; ++j) {
      ScheduledSequence& s = step.seqs.emplace_back();
      s.index = j;
      s.new_to_workers = true;
      s.replace_block_table = true;
      s.new_token_ids.begin = static_cast<uint32_t>(step.token_ids.size());
      if (!outputs.empty()) {
        step.token_ids.insert(step.token_ids.end(), outputs[j].begin(), outputs[j].end());
      }
      s.new_token_ids.size = static_cast<uint32_t>(step.token_ids.size()) - s.new_token_ids.begin;
      s.block_ids = {static_cast<uint32_t>(step.block_ids.size()), 1};
      step.block_ids.push_back(j);
    }
    const int output_len = outputs.empty() ? 0 : static_cast<int>(outputs[0].size());
    step.new_requests.push_back(
        {.slot = 0,
         .request_id = "r",
         .prompt_token_ids = prompt_,
         .sampling_params = &params_,
         .num_scheduled_tokens = static_cast<int>(prompt_.size()) + output_len,
         .num_samples = outputs.empty() ? params_.n : live,
         .seqs = {0, static_cast<uint32_t>(live)}});
    RunStep(step);
  }

  // One decode step of every live sequence.
  void Decode() {
    const BatchState::Request& req = *batch_.FindRequest(0);
    SchedulerOutput step;
    step.step_id = ++step_id_;
    int live = 0;
    for (int j = 0; j < static_cast<int>(req.seqs.size()); ++j) {
      if (!req.seqs[j].live) continue;
      step.seqs.push_back({.index = j});
      ++live;
    }
    step.cached_requests.push_back({.slot = 0,
                                    .request_id = "r",
                                    .num_computed_tokens = req.num_computed_tokens,
                                    .num_scheduled_tokens = 1,
                                    .num_samples = live,
                                    .seqs = {0, static_cast<uint32_t>(live)}});
    RunStep(step);
  }

  // The output of each sequence so far.
  std::vector<std::vector<TokenId>> Outputs() const {
    std::vector<std::vector<TokenId>> out;
    for (const BatchState::Sequence& seq : batch_.FindRequest(0)->seqs) {
      if (seq.live) out.emplace_back(seq.token_ids.begin() + prompt_.size(), seq.token_ids.end());
    }
    return out;
  }
  const SamplingState& state(int seq_index) const {
    return batch_.FindRequest(0)->seqs[seq_index].sampling;
  }

 private:
  void RunStep(const SchedulerOutput& step) {
    ASSERT_TRUE(batch_.Apply(step).ok());
    const BatchInputs& in = batch_.inputs();
    const BatchState::Request& req = *batch_.FindRequest(0);
    std::vector<float> logits;
    std::vector<SampleRow> rows;
    for (const BatchInputs::Sample& sample : in.samples) {
      const int parent = in.seqs[sample.batch_seq].index;
      const int position = static_cast<int>(req.seqs[parent].token_ids.size() - prompt_.size());
      for (TokenId t = 0; t < kVocab; ++t) logits.push_back(Logit(position, parent, t));
      rows.push_back(SampleRowOf(batch_, 0, sample.seq_index));
    }
    std::vector<TokenId> tokens;
    for (const SampledToken& s : Sampler::Sample(logits, kVocab, rows)) tokens.push_back(s.token);
    batch_.AppendSampled(tokens);
  }

  SamplingParams params_;
  std::vector<TokenId> prompt_;
  BatchState batch_;
  int64_t step_id_ = 0;
};

SamplingParams PenalizedForks() {
  SamplingParams p = Params(0.8, 77);
  p.n = 3;
  p.top_k = 30;
  p.repetition_penalty = 1.5;
  p.frequency_penalty = 0.5;
  p.presence_penalty = 0.4;
  return p;
}

// The tokens three forked sequences with penalties sample, recorded from the sampler in which
// every sequence had its own copy of the params, prompt set and counts: holding that state
// once changes none of them.
TEST(SamplerOnBatchState, ForkedSequencesWithPenaltiesSampleTheTokensTheyAlwaysDid) {
  OneRequestWorker worker(PenalizedForks(), {3, 9, 9, 17, 40, 3});
  worker.Admit();
  for (int step = 1; step < 12; ++step) worker.Decode();
  EXPECT_EQ(worker.Outputs(),
            (std::vector<std::vector<TokenId>>{{16, 7, 19, 53, 34, 61, 17, 8, 6, 42, 56, 59},
                                               {62, 16, 25, 1, 13, 27, 36, 12, 5, 18, 21, 31},
                                               {30, 21, 52, 7, 28, 4, 41, 49, 56, 43, 45, 60}}));
  for (int j = 0; j < 3; ++j) EXPECT_EQ(worker.state(j).num_samples, 12u) << j;
}

// Workers that take a request over get each sequence's output as its tokens: its counter and
// its counts go on from there, so it samples what it would have on the workers it left.
TEST(SamplerOnBatchState, AResumedRequestContinuesItsCounterAndCounts) {
  for (const int n : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << "n = " << n);
    SamplingParams p = PenalizedForks();
    p.n = n;
    const std::vector<TokenId> prompt{3, 9, 9, 17, 40, 3};
    OneRequestWorker stayed(p, prompt), left(p, prompt);
    stayed.Admit();
    left.Admit();
    for (int step = 1; step < 5; ++step) {
      stayed.Decode();
      left.Decode();
    }
    OneRequestWorker resumed(p, prompt);
    resumed.Admit(left.Outputs());
    stayed.Decode();
    for (int j = 0; j < n; ++j) {
      EXPECT_EQ(resumed.state(j).num_samples, 6u) << j;
      EXPECT_EQ(resumed.state(j).output_counts, stayed.state(j).output_counts) << j;
    }
    EXPECT_EQ(resumed.Outputs(), stayed.Outputs());
    for (int step = 0; step < 6; ++step) {
      stayed.Decode();
      resumed.Decode();
    }
    EXPECT_EQ(resumed.Outputs(), stayed.Outputs());
  }
}

// Without a penalty nothing reads the output counts or the prompt's tokens: none are kept.
TEST(SamplerOnBatchState, NothingIsCountedWithoutAPenalty) {
  SamplingParams p = Params(0.8, 5);
  p.n = 2;
  OneRequestWorker worker(p, {1, 2, 2, 3});
  worker.Admit();
  for (int step = 1; step < 8; ++step) worker.Decode();
  for (int j = 0; j < 2; ++j) {
    EXPECT_EQ(worker.state(j).num_samples, 8u);
    EXPECT_TRUE(worker.state(j).output_counts.empty());
  }
  p.presence_penalty = 0.5;
  OneRequestWorker penalized(p, {1, 2, 2, 3});
  penalized.Admit();
  for (int step = 1; step < 8; ++step) penalized.Decode();
  for (int j = 0; j < 2; ++j) {
    int counted = 0;
    for (const auto& [t, c] : penalized.state(j).output_counts) counted += c;
    EXPECT_EQ(counted, 8);
  }
}

}  // namespace
}  // namespace llm
