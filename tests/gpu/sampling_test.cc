// The device sampler (worker_service/device_sampler.h) against the host Sampler, its
// reference, on random logits: the same tokens, draw for draw (same seeds, same Philox
// counters), the same top-N logprob ids with values within 1e-4 (the device's log-sum-exp is
// fp32, the host's double), and the error of a non-finite row.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tests/gpu/gpu_test_util.h"
#include "tests/testing/sampling_sequence.h"
#include "worker_service/device_sampler.h"
#include "worker_service/sampler.h"

namespace llm {
namespace {

using ::llm::testing::SamplingSequence;
using ops::gpu_testing::CudaTest;
using ops::gpu_testing::DeviceTensor;

// Logits [rows, vocab]: normal with sd `scale`; with `quantum` > 0 rounded to multiples of it
// (many exact ties).
HostTensor Logits(int rows, int vocab, std::mt19937& rng, float scale = 3.0f,
                  float quantum = 0.0f) {
  HostTensor t(DType::kF32, {rows, vocab});
  std::normal_distribution<float> d(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) {
    float v = d(rng);
    if (quantum > 0) v = std::round(v / quantum) * quantum;
    t.data<float>()[i] = v;
  }
  return t;
}

// A sequence sampled on both sides: `host` by Sampler, `device` by DeviceSampler.
struct Twin {
  SamplingSequence host, device;
  Twin(const SamplingParams& p, int seq_index, const std::vector<TokenId>& prompt = {})
      : host(p, seq_index, prompt), device(p, seq_index, prompt) {}
};

struct StepResult {
  std::vector<SampledToken> host, device;
};

class CudaSampling : public CudaTest {
 protected:
  std::unique_ptr<DeviceSampler> MakeSampler(int max_rows, int vocab, int max_logprobs = 20) {
    absl::StatusOr<std::unique_ptr<DeviceSampler>> s = DeviceSampler::Create(
        {.device = 0, .max_rows = max_rows, .vocab_size = vocab, .max_logprobs = max_logprobs});
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  // One step of every twin in `rows` (in that order) on `logits`; each side records its
  // sampled tokens in its sequences' state, as the worker's BatchState does (the device keeps
  // its own counts besides, from which it samples; a slot taken later starts from the state's).
  // `allowed`: the rows' token masks (SampleRow::allowed), none when empty.
  static StepResult Step(DeviceSampler& ds, const std::vector<Twin*>& rows,
                         const HostTensor& logits,
                         const std::vector<const uint32_t*>& allowed = {}) {
    const int vocab = static_cast<int>(logits.view().shape[1]);
    std::vector<SampleRow> host, device;
    for (size_t i = 0; i < rows.size(); ++i) {
      host.push_back(rows[i]->host.row());
      device.push_back(rows[i]->device.row());
      if (i < allowed.size()) host.back().allowed = device.back().allowed = allowed[i];
    }
    StepResult r;
    std::vector<float> copy(logits.data<float>(), logits.data<float>() + logits.numel());
    r.host = Sampler::Sample(copy, vocab, host);
    for (size_t i = 0; i < rows.size(); ++i) rows[i]->host.Append(r.host[i].token);
    DeviceTensor d_logits(logits);
    const absl::Status s = ds.Sample({}, d_logits.view(), device, &r.device);
    EXPECT_TRUE(s.ok()) << s;
    // The logits are read only (the penalized, scaled ones live in the sampler's workspace).
    EXPECT_TRUE(ops::gpu_testing::BitEqual(d_logits.Download(), logits));
    if (!s.ok()) r.device.assign(rows.size(), SampledToken{-1});
    for (size_t i = 0; i < rows.size(); ++i) rows[i]->device.Append(r.device[i].token);
    return r;
  }

  // Tokens equal; logprobs (when asked) within 1e-4 with the same top ids.
  static void ExpectSame(const StepResult& r, const std::vector<Twin*>& rows) {
    ASSERT_EQ(r.device.size(), r.host.size());
    for (size_t i = 0; i < r.host.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "row " << i);
      EXPECT_EQ(r.device[i].token, r.host[i].token);
      if (!rows[i]->host.params.logprobs.has_value()) continue;
      EXPECT_NEAR(r.device[i].logprob, r.host[i].logprob, 1e-4);
      ASSERT_EQ(r.device[i].top_logprobs.size(), r.host[i].top_logprobs.size());
      for (size_t j = 0; j < r.host[i].top_logprobs.size(); ++j) {
        EXPECT_EQ(r.device[i].top_logprobs[j].first, r.host[i].top_logprobs[j].first) << j;
        EXPECT_NEAR(r.device[i].top_logprobs[j].second, r.host[i].top_logprobs[j].second, 1e-4)
            << j;
      }
    }
  }
};

SamplingParams Params(double temperature, uint64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  return p;
}

TEST_F(CudaSampling, GreedyIsTheHostsArgmaxIncludingTies) {
  std::mt19937 rng(1);
  for (const int vocab : {100, 32000}) {
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab);
    auto ds = MakeSampler(4, vocab);
    ASSERT_NE(ds, nullptr);
    SamplingParams p = Params(0.0, 1);
    p.logprobs = 5;
    Twin a(p, 0), b(p, 0), c(Params(0.0, 2), 0), d(p, 0);
    std::vector<Twin*> rows{&a, &b, &c, &d};
    for (int step = 0; step < 4; ++step) {
      // Coarse quanta: the maximum is tied in many rows; lowest id wins on both sides.
      HostTensor logits = Logits(4, vocab, rng, 2.0f, step % 2 == 0 ? 1.0f : 0.0f);
      // Row 3: every logit equal.
      for (int i = 0; i < vocab; ++i) logits.data<float>()[3 * vocab + i] = 0.5f;
      const StepResult r = Step(*ds, rows, logits);
      ExpectSame(r, rows);
      EXPECT_EQ(r.device[3].token, 0);
    }
  }
}

TEST_F(CudaSampling, TinyTemperaturesAndOverflowingLogitsFallBackToTheArgmax) {
  std::mt19937 rng(10);
  const int vocab = 500;
  auto ds = MakeSampler(2, vocab);
  ASSERT_NE(ds, nullptr);
  // Below 1e-5: greedy on both sides. 1e-4 with logits near 1e35: the scaled logits overflow
  // to inf, min-p's s - max is NaN for every token, nothing survives: the argmax.
  SamplingParams overflow = Params(1e-4, 2);
  overflow.min_p = 0.5;
  Twin a(Params(1e-6, 1), 0), b(overflow, 0);
  std::vector<Twin*> rows{&a, &b};
  for (int step = 0; step < 3; ++step) {
    HostTensor logits = Logits(2, vocab, rng);
    float* row1 = logits.data<float>() + vocab;
    for (int i = 0; i < vocab; ++i) row1[i] *= 1e34f;
    const StepResult r = Step(*ds, rows, logits);
    ExpectSame(r, rows);
    for (int row = 0; row < 2; ++row) {
      const float* x = logits.data<float>() + row * vocab;
      EXPECT_EQ(r.device[row].token, std::max_element(x, x + vocab) - x) << "row " << row;
    }
  }
}

TEST_F(CudaSampling, SeededDrawsMatchTheHostTokenForToken) {
  std::mt19937 rng(2);
  for (const int vocab : {100, 32000}) {
    struct Case {
      double temperature;
      int top_k;
      double top_p, min_p;
    };
    std::vector<Case> cases;
    for (double t : {0.1, 1.0, 100.0}) {
      for (int k : {-1, 1, 5, vocab}) cases.push_back({t, k, 1.0, 0.0});
      for (double tp : {0.1, 0.9}) cases.push_back({t, -1, tp, 0.0});
      cases.push_back({t, -1, 1.0, 0.1});
      cases.push_back({t, 20, 0.9, 0.05});
    }
    auto ds = MakeSampler(static_cast<int>(cases.size()), vocab);
    ASSERT_NE(ds, nullptr);
    std::vector<std::unique_ptr<Twin>> twins;
    std::vector<Twin*> rows;
    for (size_t i = 0; i < cases.size(); ++i) {
      SamplingParams p = Params(cases[i].temperature, 1000 + i);
      p.top_k = cases[i].top_k;
      p.top_p = cases[i].top_p;
      p.min_p = cases[i].min_p;
      twins.push_back(std::make_unique<Twin>(p, static_cast<int>(i % 3)));
      rows.push_back(twins.back().get());
    }
    const int steps = vocab > 1000 ? 6 : 100;
    for (int step = 0; step < steps; ++step) {
      SCOPED_TRACE(::testing::Message() << "vocab " << vocab << ", step " << step);
      // Every other step ties (quantized logits), at the top-k and top-p boundaries too.
      const StepResult r = Step(
          *ds, rows,
          Logits(static_cast<int>(rows.size()), vocab, rng, 3.0f, step % 2 == 1 ? 0.5f : 0.0f));
      for (size_t i = 0; i < rows.size(); ++i) {
        EXPECT_EQ(r.device[i].token, r.host[i].token)
            << "row " << i << ": temperature " << cases[i].temperature << ", top_k "
            << cases[i].top_k << ", top_p " << cases[i].top_p << ", min_p " << cases[i].min_p;
      }
    }
  }
}

TEST_F(CudaSampling, PenaltiesMatchTheHostAfterOutputTokens) {
  std::mt19937 rng(3);
  const int vocab = 100;
  auto ds = MakeSampler(4, vocab);
  ASSERT_NE(ds, nullptr);
  SamplingParams rep = Params(0.0, 1);  // greedy: the penalties alone decide
  rep.repetition_penalty = 1.8;
  SamplingParams freq = Params(0.7, 2);
  freq.frequency_penalty = 1.5;
  freq.presence_penalty = 0.5;
  SamplingParams all = Params(1.0, 3);
  all.repetition_penalty = 0.6;
  all.frequency_penalty = -0.5;
  all.presence_penalty = 1.0;
  all.logprobs = 3;
  Twin a(rep, 0, {1, 2, 3, 50, 99}), b(freq, 0, {7}), c(all, 0, {4, 4, 5}), d(Params(1.0, 4), 0);
  std::vector<Twin*> rows{&a, &b, &c, &d};
  // Few distinct logits, so that the penalized tokens matter step after step.
  const HostTensor base = Logits(4, vocab, rng, 1.0f);
  for (int step = 0; step < 30; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    ExpectSame(Step(*ds, rows, base), rows);
  }
  EXPECT_EQ(ds->free_penalty_slots(), 1);  // three penalized sequences of four slots
  ds->Release(a.device.state.device_slot);
  EXPECT_EQ(ds->free_penalty_slots(), 2);
  ds->Release(a.device.state.device_slot);  // no longer held: nothing to free twice
  EXPECT_EQ(ds->free_penalty_slots(), 2);
}

// logit_bias, row by row: greedy rows whose argmax it moves, sampled rows with banned tokens,
// with penalties after it, rows without biases between, and a row with half the vocabulary
// biased.
TEST_F(CudaSampling, LogitBiasMatchesTheHost) {
  std::mt19937 rng(11);
  for (const int vocab : {100, 32000}) {
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab);
    auto ds = MakeSampler(5, vocab);
    ASSERT_NE(ds, nullptr);
    SamplingParams lift = Params(0.0, 1);  // greedy: token 7 wins every step
    lift.logit_bias = {{7, 100.0f}, {vocab - 1, -3.5f}};
    lift.logprobs = 3;                    // the raw distribution's: unbiased
    SamplingParams ban = Params(1.0, 2);  // the five likeliest of the first step never drawn
    ban.top_k = 20;
    SamplingParams pen = Params(0.8, 3);  // bias, then the penalties
    pen.repetition_penalty = 1.5;
    pen.frequency_penalty = 0.5;
    pen.logit_bias = {{2, 4.0f}, {3, -2.0f}, {11, 6.5f}};
    SamplingParams wide = Params(1.0, 4);  // most of the vocabulary: the staging grows
    for (int t = 0; t < vocab; t += 2) wide.logit_bias.push_back({t, -100.0f});
    const HostTensor first = Logits(5, vocab, rng);
    std::vector<int> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    const float* row1 = first.data<float>() + vocab;
    std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                      [&](int a, int b) { return row1[a] > row1[b]; });
    for (int i = 0; i < 5; ++i) ban.logit_bias.push_back({order[i], -100.0f});
    Twin a(lift, 0), b(ban, 0), c(pen, 0, {2, 5}), d(Params(1.0, 5), 0), e(wide, 1);
    std::vector<Twin*> rows{&a, &b, &c, &d, &e};
    for (int step = 0; step < (vocab > 1000 ? 4 : 30); ++step) {
      SCOPED_TRACE(::testing::Message() << "step " << step);
      const HostTensor later = Logits(5, vocab, rng);
      const StepResult r = Step(*ds, rows, step == 0 ? first : later);
      ExpectSame(r, rows);
      EXPECT_EQ(r.device[0].token, 7);
      for (int i = 0; i < 5; ++i) {
        if (step == 0) EXPECT_NE(r.device[1].token, order[i]);
      }
      EXPECT_EQ(r.device[4].token % 2, 1);  // even ids banned
    }
    // A step without any bias after steps with them.
    Twin f(Params(1.0, 6), 0);
    std::vector<Twin*> plain{&f};
    ExpectSame(Step(*ds, plain, Logits(1, vocab, rng)), plain);
  }
}

// Structured outputs' token masks, row by row: greedy and sampled rows (with top-k, top-p,
// min-p, penalties) draw only allowed tokens, the same ones as the host; logprobs stay the raw
// distribution's; a row without a mask among masked ones is left alone.
TEST_F(CudaSampling, TokenMasksMatchTheHost) {
  std::mt19937 rng(12);
  for (const int vocab : {100, 32000}) {
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab);
    auto ds = MakeSampler(4, vocab);
    ASSERT_NE(ds, nullptr);
    const int words = (vocab + 31) / 32;
    SamplingParams greedy = Params(0.0, 1);
    greedy.logprobs = 2;
    SamplingParams filtered = Params(0.9, 2);
    filtered.top_k = 5;
    filtered.top_p = 0.9;
    filtered.min_p = 0.01;
    SamplingParams pen = Params(1.0, 3);
    pen.repetition_penalty = 1.3;
    pen.presence_penalty = 0.5;
    Twin a(greedy, 0), b(filtered, 0), c(pen, 0, {1, 2}), d(Params(1.0, 4), 0);
    std::vector<Twin*> rows{&a, &b, &c, &d};
    auto set = [](std::vector<uint32_t>& m, int t) { m[t / 32] |= 1u << (t % 32); };
    auto has = [](const std::vector<uint32_t>& m, int t) { return (m[t / 32] >> (t % 32)) & 1u; };
    for (int step = 0; step < (vocab > 1000 ? 4 : 30); ++step) {
      SCOPED_TRACE(::testing::Message() << "step " << step);
      // a: a random third of the vocabulary; b: three tokens; c: one; d: no mask.
      std::vector<std::vector<uint32_t>> masks(3, std::vector<uint32_t>(words, 0));
      set(masks[0], 0);
      for (int t = 1; t < vocab; ++t) {
        if (rng() % 3 == 0) set(masks[0], t);
      }
      for (int k = 0; k < 3; ++k) set(masks[1], static_cast<int>(rng() % vocab));
      const int only = static_cast<int>(rng() % vocab);
      set(masks[2], only);
      const StepResult r = Step(*ds, rows, Logits(4, vocab, rng),
                                {masks[0].data(), masks[1].data(), masks[2].data(), nullptr});
      ExpectSame(r, rows);
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(has(masks[i], r.device[i].token)) << "row " << i;
      EXPECT_EQ(r.device[2].token, only);
    }
  }
}

TEST_F(CudaSampling, ForkedChildStartsFromTheParentsCounts) {
  std::mt19937 rng(4);
  const int vocab = 64;
  auto ds = MakeSampler(2, vocab);
  ASSERT_NE(ds, nullptr);
  SamplingParams p = Params(0.0, 9);
  p.frequency_penalty = 2.0;
  p.repetition_penalty = 1.3;
  const std::vector<TokenId> prompt{3, 4};
  Twin parent(p, 0, prompt);
  std::vector<Twin*> rows{&parent};
  const HostTensor logits = Logits(1, vocab, rng, 1.0f);
  std::vector<TokenId> parent_tokens;
  for (int step = 0; step < 5; ++step) {
    const StepResult r = Step(*ds, rows, logits);
    ExpectSame(r, rows);
    parent_tokens.push_back(r.host[0].token);
  }
  // The child's host state has the parent's output; its device twin's state has the counter
  // only, so that only Fork can give it the parent's counts.
  Twin child(p, 1, prompt);
  for (TokenId t : parent_tokens) child.host.Append(t);
  child.device.state.num_samples = child.host.state.num_samples;
  ASSERT_TRUE(ds->Fork({}, parent.device.state, &child.device.state).ok());
  std::vector<Twin*> both{&parent, &child};
  HostTensor two(DType::kF32, {2, vocab});
  for (int r = 0; r < 2; ++r) {
    std::copy(logits.data<float>(), logits.data<float>() + vocab, two.data<float>() + r * vocab);
  }
  for (int step = 0; step < 5; ++step) ExpectSame(Step(*ds, both, two), both);
}

TEST_F(CudaSampling, LogprobsAreTheRawDistributionsTopN) {
  std::mt19937 rng(5);
  for (const int vocab : {100, 32000}) {
    auto ds = MakeSampler(3, vocab);
    ASSERT_NE(ds, nullptr);
    SamplingParams p0 = Params(0.8, 1);
    p0.logprobs = 20;
    p0.repetition_penalty = 1.5;  // changes the sampling, not the logprobs
    SamplingParams p1 = Params(0.0, 2);
    p1.logprobs = 0;  // the sampled token's only
    SamplingParams p2 = Params(1.0, 3);
    p2.logprobs = 7;
    p2.top_k = 3;
    Twin a(p0, 0, {1, 2}), b(p1, 0), c(p2, 0);
    std::vector<Twin*> rows{&a, &b, &c};
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE(::testing::Message() << "vocab " << vocab << ", step " << step);
      const StepResult r = Step(*ds, rows, Logits(3, vocab, rng, 2.0f, step == 1 ? 0.25f : 0.0f));
      ExpectSame(r, rows);
      EXPECT_EQ(r.device[0].top_logprobs.size(), 20u);
      EXPECT_TRUE(r.device[1].top_logprobs.empty());
    }
  }
}

TEST_F(CudaSampling, SeededRowIsIndependentOfItsBatch) {
  std::mt19937 rng(6);
  const int vocab = 1000;
  auto ds = MakeSampler(5, vocab);
  ASSERT_NE(ds, nullptr);
  SamplingParams p = Params(1.0, 77);
  p.top_p = 0.95;
  const HostTensor row = Logits(1, vocab, rng, 2.0f);
  auto draw = [&](int batch, int position) {
    std::vector<std::unique_ptr<SamplingSequence>> seqs;
    std::vector<SampleRow> rows;
    for (int i = 0; i < batch; ++i) {
      SamplingParams o = Params(0.5 + i, 100 + i);
      if (i % 2 == 0) o.frequency_penalty = 0.5;
      seqs.push_back(
          std::make_unique<SamplingSequence>(i == position ? p : o, i == position ? 0 : i));
      rows.push_back(seqs.back()->row());
    }
    std::vector<TokenId> tokens;
    for (int step = 0; step < 20; ++step) {
      HostTensor logits = Logits(batch, vocab, rng, 2.0f);
      std::copy(row.data<float>(), row.data<float>() + vocab,
                logits.data<float>() + position * vocab);
      DeviceTensor d(logits);
      std::vector<SampledToken> out;
      const absl::Status s = ds->Sample({}, d.view(), rows, &out);
      EXPECT_TRUE(s.ok()) << s;
      if (!s.ok()) return tokens;
      for (int i = 0; i < batch; ++i) seqs[i]->Append(out[i].token);
      tokens.push_back(out[position].token);
    }
    for (const auto& seq : seqs) ds->Release(seq->state.device_slot);
    return tokens;
  };
  const std::vector<TokenId> alone = draw(1, 0);
  EXPECT_EQ(draw(3, 1), alone);
  EXPECT_EQ(draw(5, 4), alone);
  std::vector<TokenId> host;
  SamplingSequence seq(p, 0);
  const SampleRow rows[] = {seq.row()};
  for (int step = 0; step < 20; ++step) {
    std::vector<float> copy(row.data<float>(), row.data<float>() + vocab);
    host.push_back(Sampler::Sample(copy, vocab, rows)[0].token);
    seq.Append(host.back());
  }
  EXPECT_EQ(host, alone);
}

TEST_F(CudaSampling, NonFiniteRowFailsTheStepNamingIt) {
  std::mt19937 rng(7);
  const int vocab = 300;
  auto ds = MakeSampler(4, vocab);
  ASSERT_NE(ds, nullptr);
  std::vector<std::unique_ptr<SamplingSequence>> seqs;
  std::vector<SampleRow> rows;
  for (int i = 0; i < 4; ++i) {
    seqs.push_back(std::make_unique<SamplingSequence>(Params(1.0, i), 0));
    rows.push_back(seqs.back()->row());
  }
  struct Case {
    float value;
    const char* want;
  };
  for (const Case c :
       {Case{std::numeric_limits<float>::quiet_NaN(), "logit 17 of row 2 is NaN"},
        Case{-std::numeric_limits<float>::infinity(), "logit 17 of row 2 is infinite"}}) {
    HostTensor logits = Logits(4, vocab, rng);
    logits.data<float>()[2 * vocab + 17] = c.value;
    logits.data<float>()[2 * vocab + 250] = c.value;
    DeviceTensor d(logits);
    std::vector<SampledToken> out;
    const absl::Status s = ds->Sample({}, d.view(), rows, &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
    EXPECT_NE(s.message().find(c.want), std::string::npos) << s;
  }
}

TEST_F(CudaSampling, BadArgumentsAreErrors) {
  auto ds = MakeSampler(2, 50, 4);
  ASSERT_NE(ds, nullptr);
  std::mt19937 rng(8);
  SamplingParams p = Params(1.0, 1);
  SamplingSequence a(p, 0), b(p, 0);
  std::vector<SampleRow> rows{a.row(), b.row()};
  std::vector<SampledToken> out;
  DeviceTensor wrong(Logits(2, 51, rng));
  absl::Status s = ds->Sample({}, wrong.view(), rows, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("logits: expected f32 [2, 50]"), std::string::npos) << s;
  p.logprobs = 5;
  p.presence_penalty = 1.0;
  SamplingSequence c(p, 0);
  std::vector<SampleRow> one{c.row()};
  DeviceTensor ok(Logits(1, 50, rng));
  s = ds->Sample({}, ok.view(), one, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(c.state.device_slot.slot, -1);  // refused before it took a slot
  // Penalty slots run out only when the step's own penalized rows outnumber them.
  absl::StatusOr<std::unique_ptr<DeviceSampler>> one_slot =
      DeviceSampler::Create({.device = 0, .max_rows = 2, .vocab_size = 50, .max_penalty_slots = 1});
  ASSERT_TRUE(one_slot.ok()) << one_slot.status();
  SamplingParams pen = Params(1.0, 1);
  pen.presence_penalty = 1.0;
  SamplingSequence x(pen, 0), y(pen, 0);
  std::vector<SampleRow> both{x.row(), y.row()};
  DeviceTensor two(Logits(2, 50, rng));
  s = (*one_slot)->Sample({}, two.view(), both, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("held by sequences of this step"), std::string::npos) << s;
  (*one_slot)->Release(x.state.device_slot);
  (*one_slot)->Release(y.state.device_slot);
  EXPECT_EQ((*one_slot)->free_penalty_slots(), 1);
}

// A sequence whose penalty slot went to another (it was not in that step: swapped out, say)
// takes one again from its host counts and samples on as the host does; so does a sequence that
// arrives with output already (resumed on a new worker), whose counts start from its host ones.
TEST_F(CudaSampling, EvictedAndResumedSequencesKeepTheirCounts) {
  std::mt19937 rng(11);
  const int vocab = 64;
  absl::StatusOr<std::unique_ptr<DeviceSampler>> created = DeviceSampler::Create(
      {.device = 0, .max_rows = 2, .vocab_size = vocab, .max_penalty_slots = 2});
  ASSERT_TRUE(created.ok()) << created.status();
  DeviceSampler& ds = **created;
  SamplingParams p = Params(0.0, 5);  // greedy: the penalties alone move the tokens
  p.frequency_penalty = 0.8;
  p.repetition_penalty = 1.4;
  SamplingParams q = Params(0.9, 6);
  q.presence_penalty = 1.2;
  Twin a(p, 0, {1, 2}), b(q, 0, {3}), c(p, 0, {4});
  const HostTensor two = Logits(2, vocab, rng, 1.0f), one = Logits(1, vocab, rng, 1.0f);
  std::vector<Twin*> ab{&a, &b}, only_c{&c};
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    for (int step = 0; step < 4; ++step) ExpectSame(Step(ds, ab, two), ab);
    for (int step = 0; step < 3; ++step) ExpectSame(Step(ds, only_c, one), only_c);
  }
  // c took a slot from a or b each round, and they took theirs back; the one that lost its
  // slot last no longer holds it.
  EXPECT_GE(ds.slot_evictions(), 5);
  EXPECT_TRUE(ds.Holds(c.device.state.device_slot));
  EXPECT_NE(ds.Holds(a.device.state.device_slot), ds.Holds(b.device.state.device_slot));

  // Resumed: a fresh pair told the same output so far (repeats included) on both sides.
  Twin resumed(p, 0, {1, 2});
  std::uniform_int_distribution<TokenId> token(0, 7);  // few distinct tokens: large counts
  for (int i = 0; i < 20; ++i) {
    const TokenId t = token(rng);
    resumed.host.Append(t);
    resumed.device.Append(t);
  }
  ds.Release(a.device.state.device_slot);
  ds.Release(b.device.state.device_slot);
  ds.Release(c.device.state.device_slot);
  EXPECT_EQ(ds.free_penalty_slots(), 2);
  std::vector<Twin*> r{&resumed};
  HostTensor row(DType::kF32, {1, vocab});
  std::copy(two.data<float>(), two.data<float>() + vocab, row.data<float>());
  for (int step = 0; step < 5; ++step) ExpectSame(Step(ds, r, row), r);
  ds.Release(resumed.device.state.device_slot);
}

TEST_F(CudaSampling, LargeVocabulary) {
  std::mt19937 rng(9);
  const int vocab = 128256;
  auto ds = MakeSampler(3, vocab);
  ASSERT_NE(ds, nullptr);
  SamplingParams g = Params(0.0, 1);
  g.logprobs = 5;
  SamplingParams t = Params(0.9, 2);
  t.top_k = 50;
  t.top_p = 0.9;
  SamplingParams pen = Params(1.0, 3);
  pen.repetition_penalty = 1.2;
  Twin a(g, 0), b(t, 0), c(pen, 0, {5, 6, 7});
  std::vector<Twin*> rows{&a, &b, &c};
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    ExpectSame(Step(*ds, rows, Logits(3, vocab, rng)), rows);
  }
}

}  // namespace
}  // namespace llm
