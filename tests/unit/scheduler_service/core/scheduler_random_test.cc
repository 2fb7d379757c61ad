// A seeded randomized simulation: thousands of requests with random lengths, arrivals,
// aborts, priorities and n, over a pool small enough to preempt often. The scheduler's
// invariants are checked after every step (SchedulerHarness::Step), every finished stream is
// checked against the token function, and every block is free at the end.
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler_service/core/scheduler.h"
#include "tests/testing/scheduler_harness.h"

namespace llm {
namespace {

constexpr TokenId kEos = 5;
constexpr int kMaxModelLen = 1024;

struct Case {
  uint32_t seed;
  PreemptionMode mode;
  SchedulingPolicy policy;
  bool chunked;
  bool caching;
  bool async = false;  // async scheduling: the next step planned before the last is applied
};

class SchedulerRandom : public ::testing::TestWithParam<Case> {};

TEST_P(SchedulerRandom, InvariantsHoldAtEveryStepAndStreamsAreExact) {
  const Case c = GetParam();
  std::mt19937 rng(c.seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  SchedulerConfig config;
  config.max_model_len = kMaxModelLen;
  config.enable_chunked_prefill = c.chunked;
  config.max_num_batched_tokens = c.chunked ? 384 : kMaxModelLen;
  config.long_prefill_token_threshold = c.chunked ? 96 : 0;
  config.max_num_seqs = 48;
  config.preemption_mode = c.mode;
  config.policy = c.policy;
  config.eos_token_id = kEos;
  const BlockSpaceManagerConfig cache{.block_size = 16,
                                      .num_gpu_blocks = 160,
                                      .num_cpu_blocks = 64,
                                      .watermark = 0.01,
                                      .enable_prefix_caching = c.caching};
  const FakeExecutorConfig ec = SchedulerHarness::ExecConfig(cache, kEos, 0.02);
  SchedulerHarness h(config, cache, ec);
  h.async = c.async;

  struct Sent {
    std::vector<TokenId> prompt;
    SamplingParams params;
  };
  std::vector<std::vector<TokenId>> prefixes(4);
  for (auto& p : prefixes) {
    for (int k = 0; k < 48; ++k) p.push_back(uniform(10, 30000));
  }
  std::map<std::string, Sent> sent;
  std::set<std::string> aborted;
  std::vector<std::string> ids;
  constexpr int kRequests = 3000;
  int added = 0, steps = 0;
  while (added < kRequests || h.Busy()) {
    // Bursty arrivals.
    for (int k = uniform(0, 2) == 0 ? uniform(0, 8) : 0; k > 0 && added < kRequests; --k) {
      Sent s;
      if (uniform(0, 1)) s.prompt = prefixes[uniform(0, 3)];
      for (int len = uniform(1, uniform(0, 4) == 0 ? 400 : 60); len > 0; --len) {
        s.prompt.push_back(uniform(10, 30000));
      }
      s.params.n = uniform(0, 5) == 0 ? uniform(2, 4) : 1;
      s.params.max_tokens = uniform(1, uniform(0, 3) == 0 ? 200 : 30);
      s.params.ignore_eos = uniform(0, 9) == 0;
      s.params.seed = uniform(0, 1000);
      const std::string id = "q" + std::to_string(added++);
      ASSERT_TRUE(h.Add(id, s.prompt, s.params, uniform(0, 3)).ok()) << id;
      ids.push_back(id);
      sent.emplace(id, std::move(s));
    }
    // Random aborts, in any state.
    if (!ids.empty() && uniform(0, 15) == 0) {
      const std::string& id = ids[uniform(0, static_cast<int>(ids.size()) - 1)];
      const absl::Status s = h.scheduler.Abort(id);
      if (s.ok()) {
        aborted.insert(id);
      } else {
        ASSERT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
      }
    }
    h.Step();
    ASSERT_FALSE(::testing::Test::HasFailure()) << "step " << steps;
    ASSERT_LT(++steps, 200000);
  }
  int checked = 0;
  for (const auto& [id, s] : sent) {
    if (aborted.contains(id)) continue;
    const Stream& st = h.streams[id];
    ASSERT_TRUE(st.finished) << id;
    for (int j = 0; j < s.params.n; ++j) {
      ASSERT_EQ(st.tokens[j],
                ExpectedStream(h.executor, ec, s.prompt, s.params, j, kEos, kMaxModelLen))
          << id << " sequence " << j;
    }
    ++checked;
  }
  h.ExpectAllBlocksFree();
  const SchedulerStats stats = h.scheduler.stats();
  EXPECT_GT(checked, kRequests / 2);
  EXPECT_GT(aborted.size(), 10u);
  EXPECT_GT(stats.num_preemptions, 10);
  if (c.mode == PreemptionMode::kSwap) EXPECT_GT(stats.num_swap_outs, 0);
  std::printf("seed %u: %d steps, %d streams checked, %zu aborted, %ld preemptions (%ld swaps)\n",
              c.seed, steps, checked, aborted.size(), stats.num_preemptions, stats.num_swap_outs);
}

INSTANTIATE_TEST_SUITE_P(
    Seeds, SchedulerRandom,
    ::testing::Values(
        Case{1, PreemptionMode::kRecompute, SchedulingPolicy::kFcfs, true, true},
        Case{2, PreemptionMode::kSwap, SchedulingPolicy::kFcfs, true, false},
        Case{3, PreemptionMode::kRecompute, SchedulingPolicy::kPriority, false, true},
        Case{4, PreemptionMode::kSwap, SchedulingPolicy::kPriority, true, true},
        Case{5, PreemptionMode::kSwap, SchedulingPolicy::kFcfs, false, false},
        Case{6, PreemptionMode::kRecompute, SchedulingPolicy::kFcfs, true, true, true},
        Case{7, PreemptionMode::kSwap, SchedulingPolicy::kFcfs, true, false, true},
        Case{8, PreemptionMode::kRecompute, SchedulingPolicy::kPriority, false, true, true},
        Case{9, PreemptionMode::kSwap, SchedulingPolicy::kPriority, true, true, true},
        Case{10, PreemptionMode::kSwap, SchedulingPolicy::kFcfs, false, false, true}));

}  // namespace
}  // namespace llm
