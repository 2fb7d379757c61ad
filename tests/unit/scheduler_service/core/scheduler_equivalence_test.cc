// One request set, many configurations: every stream must equal the token function's stream
// (so all configurations agree), and every block must be free afterwards.
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler_service/core/scheduler.h"
#include "tests/testing/scheduler_harness.h"

namespace llm {
namespace {

constexpr int kBs = 16;
constexpr TokenId kEos = 3;
constexpr int kMaxModelLen = 512;

struct TestRequest {
  std::string id;
  std::vector<TokenId> prompt;
  SamplingParams params;
  int priority = 0;
};

std::vector<TestRequest> MakeRequests(uint32_t seed, int count) {
  std::mt19937 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<TokenId> shared(64);
  for (TokenId& t : shared) t = uniform(10, 30000);
  std::vector<TestRequest> out;
  for (int i = 0; i < count; ++i) {
    TestRequest r;
    r.id = "r" + std::to_string(i);
    if (uniform(0, 2) == 0) r.prompt = shared;  // a shared prefix for the prefix cache
    const int len = uniform(1, 200);
    for (int k = 0; k < len; ++k) r.prompt.push_back(uniform(10, 30000));
    r.params.n = std::vector<int>{1, 1, 1, 2, 4}[uniform(0, 4)];
    r.params.max_tokens = uniform(1, 60);
    r.params.min_tokens = uniform(0, 1) ? 0 : uniform(0, r.params.max_tokens);
    r.params.ignore_eos = uniform(0, 5) == 0;
    r.params.seed = uniform(0, 3);
    r.priority = uniform(0, 3);
    out.push_back(std::move(r));
  }
  return out;
}

using Combo = std::tuple<bool /*small pool*/, PreemptionMode, bool /*chunked*/, bool /*caching*/,
                         SchedulingPolicy, bool /*async scheduling*/, int /*sliding window*/>;

class SchedulerEquivalence : public ::testing::TestWithParam<Combo> {};

TEST_P(SchedulerEquivalence, StreamsMatchTheTokenFunctionAndEveryBlockIsFreed) {
  const auto [small, mode, chunked, caching, policy, async, window] = GetParam();
  SchedulerConfig config;
  config.max_model_len = kMaxModelLen;
  config.enable_chunked_prefill = chunked;
  config.max_num_batched_tokens = chunked ? 256 : kMaxModelLen;
  config.long_prefill_token_threshold = chunked ? 64 : 0;
  config.max_num_seqs = 64;
  config.preemption_mode = mode;
  config.policy = policy;
  config.eos_token_id = kEos;
  const BlockSpaceManagerConfig cache{.block_size = kBs,
                                      .num_gpu_blocks = small ? 80 : 4000,
                                      .num_cpu_blocks = 200,
                                      .watermark = 0.01,
                                      .enable_prefix_caching = caching,
                                      .sliding_window = window};
  FakeExecutorConfig ec = SchedulerHarness::ExecConfig(cache, kEos, 0.03);
  // The fake model reads only the window: a block given back too early, and written by another
  // sequence, fails its KV check.
  ec.attention_window = window;
  SchedulerHarness h(config, cache, ec);
  h.async = async;
  const std::vector<TestRequest> requests = MakeRequests(42, 60);
  // Arrivals over the first steps, so that admission interleaves with decoding.
  size_t next = 0;
  int steps = 0;
  while (next < requests.size() || h.Busy()) {
    for (int k = 0; k < 3 && next < requests.size(); ++k, ++next) {
      const TestRequest& r = requests[next];
      ASSERT_TRUE(h.Add(r.id, r.prompt, r.params, r.priority).ok());
    }
    h.Step();
    ASSERT_FALSE(::testing::Test::HasFailure());
    ASSERT_LT(++steps, 100000);
  }
  for (const TestRequest& r : requests) {
    const Stream& st = h.streams[r.id];
    ASSERT_TRUE(st.finished) << r.id;
    ASSERT_EQ(st.tokens.size(), static_cast<size_t>(r.params.n)) << r.id;
    for (int j = 0; j < r.params.n; ++j) {
      EXPECT_EQ(st.tokens[j],
                ExpectedStream(h.executor, ec, r.prompt, r.params, j, kEos, kMaxModelLen))
          << r.id << " sequence " << j;
    }
  }
  h.ExpectAllBlocksFree();
  const SchedulerStats stats = h.scheduler.stats();
  if (small) {
    EXPECT_GT(stats.num_preemptions, 0);
    if (mode == PreemptionMode::kSwap) EXPECT_GT(stats.num_swap_outs, 0);
  } else {
    EXPECT_EQ(stats.num_preemptions, 0);
  }
  if (caching) EXPECT_GT(stats.prefix_cache_hit_rate, 0);
  if (window > 0) {
    EXPECT_GT(stats.num_window_released_blocks, 100);
  } else {
    EXPECT_EQ(stats.num_window_released_blocks, 0);
  }
  EXPECT_GT(h.executor.num_copies(), 0);  // n > 1 copied on write
}

std::string ComboName(const ::testing::TestParamInfo<Combo>& info) {
  const auto [small, mode, chunked, caching, policy, async, window] = info.param;
  return std::string(small ? "SmallPool" : "LargePool") +
         (mode == PreemptionMode::kSwap ? "Swap" : "Recompute") + (chunked ? "Chunked" : "Whole") +
         (caching ? "Cached" : "Uncached") +
         (policy == SchedulingPolicy::kPriority ? "Priority" : "Fcfs") + (async ? "Async" : "") +
         (window > 0 ? "Window" + std::to_string(window) : "");
}

INSTANTIATE_TEST_SUITE_P(
    AllConfigurations, SchedulerEquivalence,
    ::testing::Combine(::testing::Bool(),
                       ::testing::Values(PreemptionMode::kRecompute, PreemptionMode::kSwap),
                       ::testing::Bool(), ::testing::Bool(),
                       ::testing::Values(SchedulingPolicy::kFcfs, SchedulingPolicy::kPriority),
                       ::testing::Bool(), ::testing::Values(0)),
    ComboName);

// A model whose every layer attends to the last 24 positions (1.5 blocks): the blocks before
// the window go back to the pool as sequences advance, through preemption, swaps, forks and
// the prefix cache, and no sequence loses the KV its window shows.
INSTANTIATE_TEST_SUITE_P(SlidingWindow, SchedulerEquivalence,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(PreemptionMode::kRecompute,
                                                              PreemptionMode::kSwap),
                                            ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(SchedulingPolicy::kFcfs),
                                            ::testing::Bool(), ::testing::Values(24)),
                         ComboName);

}  // namespace
}  // namespace llm
