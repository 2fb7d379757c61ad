#include "scheduler_service/core/scheduler.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler_service/core/request_prefetcher.h"
#include "scheduler_service/core/stop_checker.h"
#include "tests/testing/fake_detokenizer.h"
#include "tests/testing/scheduler_harness.h"

namespace llm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr int kBs = 16;

std::vector<TokenId> Prompt(int n, int first = 1) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

BlockSpaceManagerConfig Cache(int gpu, int cpu = 0, bool caching = false) {
  return {.block_size = kBs,
          .num_gpu_blocks = gpu,
          .num_cpu_blocks = cpu,
          .watermark = 0,
          .enable_prefix_caching = caching};
}

SchedulerConfig Config(bool chunked = false, int budget = 2048, int threshold = 0) {
  SchedulerConfig c;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = 256;
  c.max_model_len = 2048;
  c.enable_chunked_prefill = chunked;
  c.long_prefill_token_threshold = threshold;
  return c;
}

SamplingParams Params(int max_tokens, int n = 1) {
  SamplingParams p;
  p.n = n;
  p.max_tokens = max_tokens;
  return p;
}

// Every stream equals what the token function yields for its request.
void ExpectStreams(const SchedulerHarness& h, const std::string& id, std::vector<TokenId> prompt,
                   const SamplingParams& params, TokenId eos = -1, int max_model_len = 2048) {
  auto it = h.streams.find(id);
  ASSERT_NE(it, h.streams.end()) << id;
  const Stream& st = it->second;
  EXPECT_TRUE(st.finished) << id;
  ASSERT_THAT(st.tokens, SizeIs(params.n)) << id;
  const FakeExecutorConfig ec = SchedulerHarness::ExecConfig(Cache(1));
  for (int j = 0; j < params.n; ++j) {
    EXPECT_EQ(st.tokens[j], ExpectedStream(h.executor, ec, prompt, params, j, eos, max_model_len))
        << id << " sequence " << j;
  }
}

const ScheduledRequest* Find(const std::vector<ScheduledRequest>& list, std::string_view id) {
  for (const ScheduledRequest& r : list) {
    if (r.request_id == id) return &r;
  }
  return nullptr;
}

TEST(SchedulerConfig, ValidateNamesFieldValueAndRange) {
  EXPECT_TRUE(Config().Validate().ok());
  SchedulerConfig c = Config();
  c.max_num_batched_tokens = 512;
  EXPECT_THAT(c.Validate().message(),
              HasSubstr("max_num_batched_tokens is 512; without chunked prefill it must be >= "
                        "max_model_len = 2048"));
  c.enable_chunked_prefill = true;
  EXPECT_TRUE(c.Validate().ok());
  c.long_prefill_token_threshold = -1;
  EXPECT_THAT(c.Validate().message(), HasSubstr("long_prefill_token_threshold is -1"));
  c = Config();
  c.max_num_seqs = 0;
  EXPECT_THAT(c.Validate().message(), HasSubstr("max_num_seqs is 0; it must be >= 1"));
}

TEST(Scheduler, ValidateRequestRejectsBadInputWithAReason) {
  SchedulerConfig config = Config();
  config.vocab_size = 4096;
  SchedulerHarness h(config, Cache(10), SchedulerHarness::ExecConfig(Cache(10)));
  auto error = [&](std::vector<TokenId> prompt, const SamplingParams& params) {
    return std::string(h.scheduler.ValidateRequest(prompt, params).message());
  };
  SamplingParams bad = Params(4);
  bad.top_p = 0;
  EXPECT_THAT(error(Prompt(4), bad), HasSubstr("top_p is 0"));
  EXPECT_THAT(error({}, Params(4)), HasSubstr("the prompt is empty"));
  EXPECT_THAT(error({5, 4096}, Params(4)),
              HasSubstr("prompt token id 4096 at position 1 is outside the vocabulary [0, 4096)"));
  EXPECT_THAT(error({-1}, Params(4)), HasSubstr("prompt token id -1 at position 0"));
  EXPECT_THAT(
      error(Prompt(2048), Params(4)),
      HasSubstr("the prompt is 2048 tokens; at most 2047 are accepted (max_model_len 2048"));
  EXPECT_THAT(error(Prompt(2040), Params(9)),
              HasSubstr("the prompt is 2040 tokens and max_tokens is 9: 2040 + 9 = 2049 tokens, "
                        "over the model's maximum context length (max_model_len 2048)"));
  EXPECT_THAT(error(Prompt(161), Params(4)),
              HasSubstr("needs 11 KV-cache blocks; the cache has 10"));
  EXPECT_TRUE(
      h.scheduler.ValidateRequest(Prompt(152), Params(2048 - 152)).ok());  // the context, full
}

// Admission (ValidateRequest, from EngineCore::AddRequest) is the one check; AddRequest trusts
// it, and only asserts what would overrun the model's context.
TEST(Scheduler, AddRequestDoesNotCheckAgain) {
  SchedulerHarness h(Config(), Cache(10), SchedulerHarness::ExecConfig(Cache(10)));
  SamplingParams bad = Params(4);
  bad.top_p = 0;
  EXPECT_TRUE(h.Add("a", Prompt(4), bad).ok());
  EXPECT_DEATH((void)h.Add("b", Prompt(2040), Params(9)),
               "prompt \\+ max_tokens over max_model_len was admitted");
  EXPECT_DEATH((void)h.Add("c", {}, Params(4)), "AddRequest without ValidateRequest");
}

TEST(Scheduler, AddRequestRefusesAnIdInUse) {
  SchedulerHarness h(Config(), Cache(10), SchedulerHarness::ExecConfig(Cache(10)));
  ASSERT_TRUE(h.Add("a", Prompt(4), Params(4)).ok());
  EXPECT_EQ(h.Add("a", Prompt(4), Params(4)).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(h.scheduler.num_requests(), 1);
}

TEST(Scheduler, BatchesNewRequestsThenSendsOnlyTheDiff) {
  SchedulerHarness h(Config(), Cache(100), SchedulerHarness::ExecConfig(Cache(100)));
  ASSERT_TRUE(h.Add("a", Prompt(20), Params(5)).ok());
  ASSERT_TRUE(h.Add("b", Prompt(33, 500), Params(5)).ok());

  const SchedulerOutput& s1 = h.Step();
  ASSERT_THAT(s1.new_requests, SizeIs(2));
  EXPECT_THAT(s1.cached_requests, IsEmpty());
  const ScheduledRequest& a = s1.new_requests[0];
  EXPECT_EQ(a.request_id, "a");
  EXPECT_EQ(a.num_computed_tokens, 0);
  EXPECT_EQ(a.num_scheduled_tokens, 20);
  EXPECT_EQ(a.num_samples, 1);
  EXPECT_THAT(a.prompt_token_ids, SizeIs(20));
  ASSERT_THAT(s1.Seqs(a), SizeIs(1));
  EXPECT_TRUE(s1.Seqs(a)[0].new_to_workers);
  EXPECT_THAT(s1.BlockIds(s1.Seqs(a)[0]), SizeIs(2));
  EXPECT_THAT(s1.BlockIds(s1.Seqs(s1.new_requests[1])[0]), SizeIs(3));
  EXPECT_EQ(s1.total_num_scheduled_tokens, 53);
  EXPECT_EQ(h.scheduler.stats().last_step_num_scheduled_tokens, 53);
  EXPECT_EQ(h.scheduler.stats().num_running, 2);

  const SchedulerOutput& s2 = h.Step();
  EXPECT_THAT(s2.new_requests, IsEmpty());
  ASSERT_THAT(s2.cached_requests, SizeIs(2));
  for (const ScheduledRequest& r : s2.cached_requests) {
    EXPECT_EQ(r.num_scheduled_tokens, 1);
    EXPECT_FALSE(r.resumed_from_preemption);
    const ScheduledSequence& seq = s2.Seqs(r)[0];
    EXPECT_FALSE(seq.new_to_workers);
    EXPECT_FALSE(seq.replace_block_table);
    // The token sampled in step 1 is not sent back: the workers appended it.
    EXPECT_THAT(s2.NewTokenIds(seq), IsEmpty());
    EXPECT_THAT(s2.BlockIds(seq), IsEmpty());  // 21 and 34 tokens fit the blocks held
  }
  EXPECT_THAT(s2.token_ids, IsEmpty());

  h.Step();
  h.Step();
  const SchedulerOutput& s5 = h.Step();  // samples the 5th token: both finish
  EXPECT_THAT(s5.finished_request_ids, IsEmpty());
  EXPECT_TRUE(h.streams["a"].finished);
  EXPECT_EQ(h.streams["a"].status[0], SequenceStatus::kFinishedLength);
  EXPECT_FALSE(h.scheduler.HasUnfinishedRequests());
  const SchedulerOutput& s6 = h.Step();
  EXPECT_THAT(s6.finished_request_ids, ElementsAre("a", "b"));
  ExpectStreams(h, "a", Prompt(20), Params(5));
  ExpectStreams(h, "b", Prompt(33, 500), Params(5));
  h.ExpectAllBlocksFree();
}

// vLLM's tiny-pool scenario: 11 blocks of 16; two 80-token prompts fill 10; the first decode
// step has room for one more block only.
TEST(Scheduler, PreemptsTheNewestByRecomputeWhenThePoolRunsOut) {
  SchedulerHarness h(Config(), Cache(11), SchedulerHarness::ExecConfig(Cache(11)));
  ASSERT_TRUE(h.Add("a", Prompt(80), Params(40)).ok());
  ASSERT_TRUE(h.Add("b", Prompt(80, 1000), Params(40)).ok());
  EXPECT_THAT(h.Step().new_requests, SizeIs(2));
  ASSERT_TRUE(h.Add("c", Prompt(8, 3000), Params(2)).ok());  // would fit once b is out

  const SchedulerOutput& s2 = h.Step();
  ASSERT_THAT(s2.cached_requests, SizeIs(1));
  EXPECT_EQ(s2.cached_requests[0].request_id, "a");
  EXPECT_THAT(s2.new_requests, IsEmpty());  // no admission in a step that preempted
  SchedulerStats st = h.scheduler.stats();
  EXPECT_EQ(st.num_preemptions, 1);
  EXPECT_EQ(st.num_running, 1);
  EXPECT_EQ(st.num_waiting, 2);  // b, and c behind it
  EXPECT_EQ(h.scheduler.block_manager().stats().num_free_gpu_blocks, 5);

  bool resumed = false;
  for (int i = 0; i < 200 && h.scheduler.HasUnfinishedRequests(); ++i) {
    const SchedulerOutput& s = h.Step();
    if (const ScheduledRequest* b = Find(s.cached_requests, "b"); b && b->resumed_from_preemption) {
      resumed = true;
      EXPECT_EQ(b->num_computed_tokens, 0);
      EXPECT_EQ(b->num_scheduled_tokens, 81);  // prompt + the token sampled before preemption
      const ScheduledSequence& seq = s.Seqs(*b)[0];
      EXPECT_TRUE(seq.replace_block_table);
      EXPECT_THAT(s.BlockIds(seq), SizeIs(6));
      EXPECT_THAT(s.NewTokenIds(seq), IsEmpty());  // the workers kept its sampled token
    }
  }
  EXPECT_TRUE(resumed);
  h.RunToCompletion();
  ExpectStreams(h, "a", Prompt(80), Params(40));
  ExpectStreams(h, "b", Prompt(80, 1000), Params(40));
  ExpectStreams(h, "c", Prompt(8, 3000), Params(2));
  h.ExpectAllBlocksFree();
}

TEST(Scheduler, SchedulesAtMostMaxNumSeqsSequences) {
  SchedulerConfig config = Config();
  config.max_num_seqs = 2;
  SchedulerHarness h(config, Cache(100), SchedulerHarness::ExecConfig(Cache(100)));
  ASSERT_TRUE(h.Add("a", Prompt(8), Params(3)).ok());
  ASSERT_TRUE(h.Add("b", Prompt(8, 100), Params(3)).ok());
  ASSERT_TRUE(h.Add("c", Prompt(8, 200), Params(3)).ok());
  EXPECT_THAT(h.Step().new_requests, SizeIs(2));
  EXPECT_EQ(h.scheduler.stats().num_waiting, 1);
  ASSERT_TRUE(h.Add("d", Prompt(8, 300), Params(3, /*n=*/2)).ok());
  h.RunToCompletion();
  ExpectStreams(h, "c", Prompt(8, 200), Params(3));
  ExpectStreams(h, "d", Prompt(8, 300), Params(3, 2));
  h.ExpectAllBlocksFree();
}

// n > 1 requests fork after their prefill: admission counts them as n sequences, so the live
// sequences of the running requests never exceed max_num_seqs.
TEST(Scheduler, ForkedSequencesStayWithinMaxNumSeqs) {
  SchedulerConfig config = Config();
  config.max_num_seqs = 5;
  SchedulerHarness h(config, Cache(200), SchedulerHarness::ExecConfig(Cache(200)));
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(h.Add(absl::StrCat("r", i), Prompt(8, 100 * i), Params(6, /*n=*/2)).ok());
  }
  ASSERT_TRUE(h.Add("single", Prompt(8, 900), Params(6)).ok());
  int most = 0;
  for (int steps = 0; h.scheduler.HasUnfinishedRequests() && steps < 1000; ++steps) {
    h.Step();
    const SchedulerStats st = h.scheduler.stats();
    EXPECT_LE(st.num_running_seqs, 5);
    most = std::max(most, st.num_running_seqs);
  }
  EXPECT_EQ(most, 5);  // r0, r1 forked and the single one
  for (int i = 0; i < 6; ++i) {
    ExpectStreams(h, absl::StrCat("r", i), Prompt(8, 100 * i), Params(6, 2));
  }
  ExpectStreams(h, "single", Prompt(8, 900), Params(6));
  EXPECT_THAT(h.scheduler.ValidateRequest(Prompt(8), Params(6, /*n=*/6)).message(),
              HasSubstr("n is 6; it must be at most max_num_seqs = 5"));
}

TEST(Scheduler, SchedulesSeveralPartialPrefillsUnderTheBudget) {
  SchedulerHarness h(Config(/*chunked=*/true, /*budget=*/64, /*threshold=*/32), Cache(100),
                     SchedulerHarness::ExecConfig(Cache(100)));
  ASSERT_TRUE(h.Add("a", Prompt(100), Params(3)).ok());
  ASSERT_TRUE(h.Add("b", Prompt(100, 300), Params(3)).ok());
  ASSERT_TRUE(h.Add("c", Prompt(100, 600), Params(3)).ok());
  const SchedulerOutput& s1 = h.Step();
  ASSERT_THAT(s1.new_requests, SizeIs(2));
  EXPECT_EQ(s1.new_requests[0].num_scheduled_tokens, 32);
  EXPECT_EQ(s1.new_requests[1].num_scheduled_tokens, 32);
  EXPECT_EQ(s1.total_num_samples, 0);
  EXPECT_TRUE(h.streams.empty());
  for (int computed : {32, 64}) {
    const SchedulerOutput& s = h.Step();
    ASSERT_THAT(s.cached_requests, SizeIs(2));
    EXPECT_EQ(s.cached_requests[1].num_computed_tokens, computed);
    EXPECT_EQ(s.cached_requests[1].num_scheduled_tokens, 32);
  }
  const SchedulerOutput& s4 = h.Step();
  ASSERT_THAT(s4.cached_requests, SizeIs(2));
  EXPECT_EQ(s4.cached_requests[0].num_scheduled_tokens, 4);
  EXPECT_EQ(s4.cached_requests[0].num_samples, 1);
  ASSERT_THAT(s4.new_requests, SizeIs(1));  // c takes the 56 tokens left, capped at 32
  EXPECT_EQ(s4.new_requests[0].request_id, "c");
  EXPECT_EQ(s4.new_requests[0].num_scheduled_tokens, 32);
  EXPECT_EQ(h.streams["a"].tokens[0].size(), 1u);
  h.RunToCompletion();
  ExpectStreams(h, "a", Prompt(100), Params(3));
  ExpectStreams(h, "b", Prompt(100, 300), Params(3));
  ExpectStreams(h, "c", Prompt(100, 600), Params(3));
  h.ExpectAllBlocksFree();
}

TEST(Scheduler, ChunksALongPromptAtTheThresholdAndSamplesOnlyAtItsEnd) {
  SchedulerHarness h(Config(/*chunked=*/true, /*budget=*/512, /*threshold=*/32), Cache(100),
                     SchedulerHarness::ExecConfig(Cache(100)));
  ASSERT_TRUE(h.Add("a", Prompt(100), Params(3)).ok());
  h.RunToCompletion();
  EXPECT_THAT(h.last_step_tokens, ElementsAre(32, 32, 32, 4, 1, 1, 0));
  EXPECT_EQ(h.streams["a"].num_updates, 3);
  ExpectStreams(h, "a", Prompt(100), Params(3));
  h.ExpectAllBlocksFree();
}

TEST(Scheduler, AbortMidPrefillAndMidDecodeFreesAtOnceAndTellsTheWorkers) {
  SchedulerHarness h(Config(/*chunked=*/true, /*budget=*/32, /*threshold=*/16), Cache(100),
                     SchedulerHarness::ExecConfig(Cache(100)));
  ASSERT_TRUE(h.Add("a", Prompt(64), Params(10)).ok());
  ASSERT_TRUE(h.Add("b", Prompt(10, 200), Params(10)).ok());
  h.Step();  // a: 16 of 64 (mid-prefill); b: its whole prompt, one token sampled
  EXPECT_EQ(h.executor.num_requests(), 2);
  const int free_before = h.scheduler.block_manager().stats().num_free_gpu_blocks;
  ASSERT_TRUE(h.scheduler.Abort("a").ok());
  EXPECT_EQ(h.scheduler.block_manager().stats().num_free_gpu_blocks, free_before + 4);
  EXPECT_EQ(h.scheduler.Abort("a").code(), absl::StatusCode::kNotFound);
  const SchedulerOutput& s2 = h.Step();
  EXPECT_THAT(s2.finished_request_ids, ElementsAre("a"));
  EXPECT_EQ(h.executor.num_requests(), 1);
  ASSERT_THAT(s2.cached_requests, SizeIs(1));
  EXPECT_EQ(s2.cached_requests[0].num_scheduled_tokens, 1);  // b decodes

  ASSERT_TRUE(h.scheduler.Abort("b").ok());
  ASSERT_TRUE(h.Add("c", Prompt(8), Params(2)).ok());
  ASSERT_TRUE(h.scheduler.Abort("c").ok());  // never sent to the workers
  const SchedulerOutput& s3 = h.Step();
  EXPECT_THAT(s3.finished_request_ids, ElementsAre("b"));
  EXPECT_FALSE(h.scheduler.HasUnfinishedRequests());
  h.ExpectAllBlocksFree();
  EXPECT_EQ(h.streams["b"].tokens[0].size(), 2u);
  EXPECT_FALSE(h.streams["b"].finished);  // aborts are reported by the engine, not as outputs
}

TEST(Scheduler, HigherPriorityArrivalPreemptsTheLowestPriorityNewestFirst) {
  SchedulerConfig config = Config();
  config.policy = SchedulingPolicy::kPriority;
  SchedulerHarness h(config, Cache(11), SchedulerHarness::ExecConfig(Cache(11)));
  ASSERT_TRUE(h.Add("low1", Prompt(80), Params(20), /*priority=*/5).ok());
  ASSERT_TRUE(h.Add("low2", Prompt(64, 300), Params(20), /*priority=*/5).ok());
  EXPECT_THAT(h.Step().new_requests, SizeIs(2));  // 9 of 11 blocks held
  ASSERT_TRUE(h.Add("high", Prompt(48, 900), Params(20), /*priority=*/0).ok());
  const SchedulerOutput& s2 = h.Step();
  ASSERT_THAT(s2.new_requests, SizeIs(1));
  EXPECT_EQ(s2.new_requests[0].request_id, "high");
  ASSERT_THAT(s2.cached_requests, SizeIs(1));
  EXPECT_EQ(s2.cached_requests[0].request_id, "low1");
  SchedulerStats st = h.scheduler.stats();
  EXPECT_EQ(st.num_preemptions, 1);
  EXPECT_EQ(st.num_waiting, 1);  // low2, recomputed later
  h.RunToCompletion();
  ExpectStreams(h, "low1", Prompt(80), Params(20));
  ExpectStreams(h, "low2", Prompt(64, 300), Params(20));
  ExpectStreams(h, "high", Prompt(48, 900), Params(20));
  h.ExpectAllBlocksFree();
}

TEST(Scheduler, FcfsNeverLetsALaterArrivalPreempt) {
  SchedulerHarness h(Config(), Cache(11), SchedulerHarness::ExecConfig(Cache(11)));
  ASSERT_TRUE(h.Add("low1", Prompt(80), Params(5), 5).ok());
  ASSERT_TRUE(h.Add("low2", Prompt(64, 300), Params(5), 5).ok());
  h.Step();
  ASSERT_TRUE(h.Add("high", Prompt(48, 900), Params(5), 0).ok());
  const SchedulerOutput& s2 = h.Step();
  EXPECT_THAT(s2.new_requests, IsEmpty());
  EXPECT_EQ(h.scheduler.stats().num_preemptions, 0);
  h.RunToCompletion();
  h.ExpectAllBlocksFree();
}

TEST(Scheduler, SwapsOutAndBackInKeepingTheComputedTokens) {
  SchedulerConfig config = Config();
  config.preemption_mode = PreemptionMode::kSwap;
  SchedulerHarness h(config, Cache(11, 20), SchedulerHarness::ExecConfig(Cache(11, 20)));
  ASSERT_TRUE(h.Add("a", Prompt(80), Params(20)).ok());
  ASSERT_TRUE(h.Add("b", Prompt(80, 1000), Params(20)).ok());
  h.Step();
  const SchedulerOutput& s2 = h.Step();
  EXPECT_THAT(s2.blocks_to_swap_out, SizeIs(5));
  SchedulerStats st = h.scheduler.stats();
  EXPECT_EQ(st.num_swapped, 1);
  EXPECT_EQ(st.num_swap_outs, 1);
  EXPECT_GT(st.cpu_kv_usage, 0);
  bool swapped_in = false;
  while (h.scheduler.HasUnfinishedRequests()) {
    const SchedulerOutput& s = h.Step();
    if (!s.blocks_to_swap_in.empty()) {
      swapped_in = true;
      EXPECT_THAT(s.blocks_to_swap_in, SizeIs(5));
      const ScheduledRequest* b = Find(s.cached_requests, "b");
      ASSERT_NE(b, nullptr);
      EXPECT_EQ(b->num_computed_tokens, 80);  // nothing recomputed
      EXPECT_EQ(b->num_scheduled_tokens, 1);
      EXPECT_TRUE(s.Seqs(*b)[0].replace_block_table);
    }
  }
  EXPECT_TRUE(swapped_in);
  h.RunToCompletion();
  ExpectStreams(h, "a", Prompt(80), Params(20));
  ExpectStreams(h, "b", Prompt(80, 1000), Params(20));
  h.ExpectAllBlocksFree();
}

TEST(Scheduler, SwapFallsBackToRecomputeWhenTheCpuPoolIsTooSmall) {
  SchedulerConfig config = Config();
  config.preemption_mode = PreemptionMode::kSwap;
  SchedulerHarness h(config, Cache(11, 2), SchedulerHarness::ExecConfig(Cache(11, 2)));
  ASSERT_TRUE(h.Add("a", Prompt(80), Params(10)).ok());
  ASSERT_TRUE(h.Add("b", Prompt(80, 1000), Params(10)).ok());
  h.Step();
  const SchedulerOutput& s2 = h.Step();
  EXPECT_THAT(s2.blocks_to_swap_out, IsEmpty());
  EXPECT_EQ(h.scheduler.stats().num_waiting, 1);
  EXPECT_EQ(h.scheduler.stats().num_swapped, 0);
  h.RunToCompletion();
  ExpectStreams(h, "b", Prompt(80, 1000), Params(10));
  h.ExpectAllBlocksFree();
}

TEST(Scheduler, ARequestThatOutgrowsTheWholePoolEndsAborted) {
  SchedulerHarness h(Config(), Cache(11), SchedulerHarness::ExecConfig(Cache(11)));
  ASSERT_TRUE(h.Add("a", Prompt(16), Params(300)).ok());
  h.RunToCompletion();
  const Stream& st = h.streams["a"];
  EXPECT_TRUE(st.finished);
  EXPECT_EQ(st.status[0], SequenceStatus::kFinishedAborted);
  // 11 blocks hold 176 tokens; the 177th (the 161st output) has no slot anywhere.
  EXPECT_THAT(st.tokens[0], SizeIs(161));
  EXPECT_EQ(h.scheduler.stats().num_preemptions, 1);
  h.ExpectAllBlocksFree();
}

TEST(Scheduler, ForksNSequencesAfterThePrefillAndCopiesTheSharedLastBlock) {
  SchedulerHarness h(Config(), Cache(50), SchedulerHarness::ExecConfig(Cache(50)));
  ASSERT_TRUE(h.Add("a", Prompt(20), Params(8, /*n=*/4)).ok());
  const SchedulerOutput& s1 = h.Step();
  ASSERT_THAT(s1.new_requests, SizeIs(1));
  EXPECT_EQ(s1.new_requests[0].num_samples, 4);
  EXPECT_THAT(s1.Seqs(s1.new_requests[0]), SizeIs(1));

  const SchedulerOutput& s2 = h.Step();
  ASSERT_THAT(s2.cached_requests, SizeIs(1));
  const ScheduledRequest& r = s2.cached_requests[0];
  ASSERT_THAT(s2.Seqs(r), SizeIs(4));
  EXPECT_EQ(r.num_samples, 4);
  EXPECT_EQ(s2.total_num_scheduled_tokens, 4);
  // The workers forked the sequences at the sample too (prompt, token j, sequence 0's table)
  // and appended the tokens: none is new to them and no token id is sent.
  int replaced = 0;
  for (int j = 0; j < 4; ++j) {
    const ScheduledSequence& seq = s2.Seqs(r)[j];
    EXPECT_FALSE(seq.new_to_workers) << j;
    EXPECT_THAT(s2.NewTokenIds(seq), IsEmpty()) << j;
    if (!seq.replace_block_table) continue;
    ++replaced;
    // The full first block stays shared.
    EXPECT_EQ(s2.BlockIds(seq)[0], s1.block_ids[0]) << j;
  }
  // Four sequences share the half-full second block: three copy it (their tables are resent),
  // the last writes in place (the table the workers copied at the fork).
  EXPECT_THAT(s2.blocks_to_copy, SizeIs(3));
  EXPECT_EQ(replaced, 3);
  h.RunToCompletion();
  ExpectStreams(h, "a", Prompt(20), Params(8, 4));
  const Stream& st = h.streams["a"];
  for (int j = 1; j < 4; ++j) EXPECT_NE(st.tokens[j], st.tokens[0]);
  h.ExpectAllBlocksFree();
}

TEST(Scheduler, PrefixCacheHitsReduceTheTokensToCompute) {
  SchedulerHarness h(Config(), Cache(50, 0, /*caching=*/true),
                     SchedulerHarness::ExecConfig(Cache(50)));
  ASSERT_TRUE(h.Add("a", Prompt(64), Params(2)).ok());
  h.RunToCompletion();
  ASSERT_TRUE(h.Add("b", Prompt(64), Params(2)).ok());
  const SchedulerOutput& s = h.Step();
  ASSERT_THAT(s.new_requests, SizeIs(1));
  EXPECT_EQ(s.new_requests[0].num_computed_tokens, 48);  // never the last token's block
  EXPECT_EQ(s.new_requests[0].num_scheduled_tokens, 16);
  h.RunToCompletion();
  EXPECT_EQ(h.streams["b"].num_cached_prompt_tokens, 48);
  EXPECT_EQ(h.streams["a"].num_cached_prompt_tokens, 0);
  EXPECT_GT(h.scheduler.stats().prefix_cache_hit_rate, 0.3);
  EXPECT_EQ(h.streams["a"].tokens, h.streams["b"].tokens);
  h.ExpectAllBlocksFree();
}

TEST(Scheduler, StopsOnEosAfterMinTokensUnlessIgnored) {
  constexpr TokenId kEos = 7;
  SchedulerConfig config = Config();
  config.eos_token_id = kEos;
  SchedulerHarness h(config, Cache(50), SchedulerHarness::ExecConfig(Cache(50), kEos, 1.0));
  SamplingParams min3 = Params(10);
  min3.min_tokens = 3;
  SamplingParams ignore = Params(10);
  ignore.ignore_eos = true;
  ASSERT_TRUE(h.Add("plain", Prompt(8), Params(10)).ok());
  ASSERT_TRUE(h.Add("min3", Prompt(8), min3).ok());
  ASSERT_TRUE(h.Add("ignore", Prompt(8), ignore).ok());
  h.RunToCompletion();
  EXPECT_THAT(h.streams["plain"].tokens[0], ElementsAre(kEos));
  EXPECT_EQ(h.streams["plain"].status[0], SequenceStatus::kFinishedStopped);
  EXPECT_THAT(h.streams["min3"].tokens[0], ElementsAre(kEos, kEos, kEos));
  EXPECT_THAT(h.streams["ignore"].tokens[0], SizeIs(10));
  EXPECT_EQ(h.streams["ignore"].status[0], SequenceStatus::kFinishedLength);
  h.ExpectAllBlocksFree();
}

// EOS ends a sequence without a stop token (OpenAI's stop_reason null); a stop_token_ids entry
// is recorded (its stop_reason).
TEST(StopChecker, RecordsAStopTokenIdButNotEos) {
  const StopChecker checker(/*eos_token_id=*/7, /*max_model_len=*/100);
  Request req;
  req.num_prompt_tokens = 2;
  req.params.stop_token_ids = {5};
  checker.Prepare(&req);
  Sequence seq;
  seq.tokens = {1, 2, 7};
  seq.last_token = 7;
  EXPECT_EQ(checker.Check(req, &seq), SequenceStatus::kFinishedStopped);
  EXPECT_EQ(seq.stop_token, -1);
  seq.tokens = {1, 2, 5};
  seq.last_token = 5;
  EXPECT_EQ(checker.Check(req, &seq), SequenceStatus::kFinishedStopped);
  EXPECT_EQ(seq.stop_token, 5);
  seq.tokens = {1, 2, 3};
  seq.last_token = 3;
  EXPECT_EQ(checker.Check(req, &seq), std::nullopt);
}

TEST(Scheduler, StopsOnStopTokenIdsStopStringsAndMaxTokensUpToMaxModelLen) {
  SchedulerConfig config = Config();
  config.max_model_len = 30;
  FakeDetokenizerFactory detok;
  SchedulerHarness h(config, Cache(50), SchedulerHarness::ExecConfig(Cache(50)), &detok);
  const std::vector<TokenId> reference = ExpectedStream(
      h.executor, SchedulerHarness::ExecConfig(Cache(1)), Prompt(8), Params(10), 0, -1, 2048);
  ASSERT_THAT(reference, SizeIs(10));
  SamplingParams by_id = Params(10);
  by_id.stop_token_ids = {reference[3]};
  SamplingParams by_string = Params(10);
  by_string.stop = {"<" + std::to_string(reference[4]) + ">"};
  ASSERT_TRUE(h.Add("id", Prompt(8), by_id).ok());
  ASSERT_TRUE(h.Add("string", Prompt(8), by_string).ok());
  ASSERT_TRUE(h.scheduler.ValidateRequest(Prompt(25, 50), Params(5)).ok());
  ASSERT_TRUE(h.Add("long", Prompt(25, 50), Params(5)).ok());
  h.RunToCompletion();
  const auto first = [&](TokenId t) {
    return std::find(reference.begin(), reference.end(), t) - reference.begin() + 1;
  };
  EXPECT_THAT(h.streams["id"].tokens[0], SizeIs(first(reference[3])));
  EXPECT_EQ(h.streams["id"].status[0], SequenceStatus::kFinishedStopped);
  EXPECT_THAT(h.streams["string"].tokens[0], SizeIs(first(reference[4])));
  EXPECT_EQ(h.streams["string"].status[0], SequenceStatus::kFinishedStopped);
  EXPECT_THAT(h.streams["long"].tokens[0], SizeIs(5));  // 25 + 5 = max_model_len, the most admitted
  EXPECT_EQ(h.streams["long"].status[0], SequenceStatus::kFinishedLength);
  h.ExpectAllBlocksFree();
}

TEST(Scheduler, LargeBatchesTakeThePrefetchingPathWithTheSameResults) {
  constexpr int kRequests = 2 * static_cast<int>(kPrefetchMinBatch);
  SchedulerConfig config = Config();
  config.max_num_seqs = kRequests;
  config.max_num_batched_tokens = 32 * kRequests;
  SchedulerHarness h(config, Cache(2 * kRequests),
                     SchedulerHarness::ExecConfig(Cache(2 * kRequests)));
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(h.Add("r" + std::to_string(i), Prompt(4 + i % 13, i), Params(3 + i % 20)).ok());
  }
  h.Step();
  EXPECT_EQ(h.scheduler.stats().num_running, kRequests);
  h.RunToCompletion();
  for (int i = 0; i < kRequests; ++i) {
    ExpectStreams(h, "r" + std::to_string(i), Prompt(4 + i % 13, i), Params(3 + i % 20));
  }
  h.ExpectAllBlocksFree();
}

TEST(Scheduler, StopStringsCountOnlyFromMinTokens) {
  FakeDetokenizerFactory detok;
  SchedulerHarness h(Config(), Cache(50), SchedulerHarness::ExecConfig(Cache(50)), &detok);
  const std::vector<TokenId> reference = ExpectedStream(
      h.executor, SchedulerHarness::ExecConfig(Cache(1)), Prompt(8), Params(10), 0, -1, 2048);
  // The second token's text would stop the sequence, but only text from the 3rd token on
  // is searched.
  ASSERT_EQ(std::count(reference.begin() + 2, reference.end(), reference[1]), 0);
  SamplingParams p = Params(10);
  p.min_tokens = 3;
  p.stop = {"<" + std::to_string(reference[1]) + ">"};
  ASSERT_TRUE(h.Add("a", Prompt(8), p).ok());
  h.RunToCompletion();
  EXPECT_EQ(h.streams["a"].tokens[0], reference);
  EXPECT_EQ(h.streams["a"].status[0], SequenceStatus::kFinishedLength);
  h.ExpectAllBlocksFree();
}

// The engine's outputs carry each sequence's text from its own detokenizer (the one that
// finds stop strings), with what it held back delivered by the output that ends the
// sequence; without a DetokenizerFactory there is no text.
TEST(Scheduler, OutputsCarryEachSequencesTextWithWhatWasHeldBackAtTheEnd) {
  FakeDetokenizerFactory detok;
  SchedulerHarness h(Config(), Cache(50), SchedulerHarness::ExecConfig(Cache(50)), &detok);
  const std::vector<TokenId> reference = ExpectedStream(
      h.executor, SchedulerHarness::ExecConfig(Cache(1)), Prompt(8), Params(10), 0, -1, 2048);
  SamplingParams by_id = Params(10);
  by_id.stop_token_ids = {reference[3]};
  ASSERT_TRUE(h.Add("n2", Prompt(8), Params(10, 2)).ok());
  ASSERT_TRUE(h.Add("id", Prompt(8), by_id).ok());
  h.RunToCompletion();
  ExpectStreams(h, "n2", Prompt(8), Params(10, 2));
  for (int j : {0, 1}) {
    EXPECT_EQ(h.streams["n2"].text[j], FakeText(h.streams["n2"].tokens[j])) << j;
  }
  EXPECT_EQ(h.streams["id"].status[0], SequenceStatus::kFinishedStopped);
  EXPECT_EQ(h.streams["id"].text[0], FakeText(h.streams["id"].tokens[0]));

  SchedulerHarness plain(Config(), Cache(50), SchedulerHarness::ExecConfig(Cache(50)));
  ASSERT_TRUE(plain.Add("a", Prompt(8), Params(10)).ok());
  plain.RunToCompletion();
  EXPECT_EQ(plain.streams["a"].tokens[0], reference);
  EXPECT_EQ(plain.streams["a"].text[0], "");
}

TEST(Scheduler, AStopStringEndsTheTextBeforeItOrAfterItWhenIncluded) {
  FakeDetokenizerFactory detok;
  SchedulerHarness h(Config(), Cache(50), SchedulerHarness::ExecConfig(Cache(50)), &detok);
  const std::vector<TokenId> reference = ExpectedStream(
      h.executor, SchedulerHarness::ExecConfig(Cache(1)), Prompt(8), Params(10), 0, -1, 2048);
  const size_t at = std::find(reference.begin(), reference.end(), reference[4]) - reference.begin();
  const std::vector<TokenId> before(reference.begin(), reference.begin() + at);
  SamplingParams cut = Params(10);
  cut.stop = {FakeText({reference[4]})};
  SamplingParams keep = cut;
  keep.include_stop_str_in_output = true;
  ASSERT_TRUE(h.Add("cut", Prompt(8), cut).ok());
  ASSERT_TRUE(h.Add("keep", Prompt(8), keep).ok());
  h.RunToCompletion();
  for (const char* id : {"cut", "keep"}) {
    EXPECT_THAT(h.streams[id].tokens[0], SizeIs(at + 1)) << id;
    EXPECT_EQ(h.streams[id].status[0], SequenceStatus::kFinishedStopped) << id;
  }
  EXPECT_EQ(h.streams["cut"].text[0], FakeText(before));
  EXPECT_EQ(h.streams["keep"].text[0], FakeText(before) + FakeText({reference[4]}));
}

TEST(Scheduler, ADroppedSequenceEndsWithTheTextItsDetokenizerHeldBack) {
  FakeDetokenizerFactory detok;
  SchedulerHarness h(Config(), Cache(11), SchedulerHarness::ExecConfig(Cache(11)), &detok);
  ASSERT_TRUE(h.Add("a", Prompt(16), Params(300)).ok());
  h.RunToCompletion();
  const Stream& st = h.streams["a"];
  EXPECT_EQ(st.status[0], SequenceStatus::kFinishedAborted);
  EXPECT_THAT(st.tokens[0], SizeIs(161));
  EXPECT_EQ(st.text[0], FakeText(st.tokens[0]));
  h.ExpectAllBlocksFree();
}

TEST(Scheduler, UpdateFromOutputRejectsAMismatchedAnswer) {
  SchedulerHarness h(Config(), Cache(50), SchedulerHarness::ExecConfig(Cache(50)));
  ASSERT_TRUE(h.Add("a", Prompt(8), Params(4)).ok());
  const SchedulerOutput& s = h.scheduler.Schedule();
  ModelOutput wrong_step{.step_id = s.step_id + 1, .sampled_token_ids = {1}};
  EXPECT_THAT(h.scheduler.UpdateFromOutput(wrong_step).status().message(), HasSubstr("awaited"));
  ModelOutput wrong_count{.step_id = s.step_id, .sampled_token_ids = {1, 2}};
  EXPECT_THAT(h.scheduler.UpdateFromOutput(wrong_count).status().message(),
              HasSubstr("2 sampled tokens for 1 samples"));
  ModelOutput right{.step_id = s.step_id, .sampled_token_ids = {1}};
  ASSERT_TRUE(h.scheduler.UpdateFromOutput(right).ok());
  EXPECT_EQ(h.scheduler.UpdateFromOutput(right).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace llm

namespace llm {
namespace {

// Steps the harness's scheduler on `exec` (a worker group other than the harness's) until no
// request is left; records the streams and checks the invariants after each step.
void RunOn(SchedulerHarness& h, FakeExecutor& exec) {
  for (int steps = 0; h.scheduler.HasUnfinishedRequests() || h.scheduler.has_finished_to_report();
       ++steps) {
    ASSERT_LT(steps, 10000);
    const SchedulerOutput& out = h.scheduler.Schedule();
    ModelOutput mo;
    const absl::Status s = exec.Execute(out, &mo);
    ASSERT_TRUE(s.ok()) << s;
    absl::StatusOr<const StepOutputs*> outputs = h.scheduler.UpdateFromOutput(mo);
    ASSERT_TRUE(outputs.ok()) << outputs.status();
    h.Record(**outputs);
    const absl::Status inv = h.scheduler.CheckInvariants();
    ASSERT_TRUE(inv.ok()) << inv;
  }
  EXPECT_EQ(exec.num_requests(), 0) << "the new workers still hold requests";
}

std::vector<std::string> Ids(const std::vector<ScheduledRequest>& list) {
  std::vector<std::string> ids;
  for (const ScheduledRequest& r : list) ids.emplace_back(r.request_id);
  return ids;
}

TEST(Scheduler, ResetForNewWorkersRequeuesRunningAndSwappedInOrderWithEveryBlockFree) {
  SchedulerConfig config = Config();
  config.preemption_mode = PreemptionMode::kSwap;
  const BlockSpaceManagerConfig old_cache = Cache(11, 20, /*caching=*/true);
  SchedulerHarness h(config, old_cache, SchedulerHarness::ExecConfig(old_cache));
  ASSERT_TRUE(h.Add("a", Prompt(80), Params(20)).ok());
  ASSERT_TRUE(h.Add("b", Prompt(80, 1000), Params(20)).ok());
  h.Step();
  h.Step();  // b is swapped out (as in SwapsOutAndBackInKeepingTheComputedTokens)
  ASSERT_TRUE(h.Add("c", Prompt(20, 3000), Params(8)).ok());
  ASSERT_TRUE(h.Add("d", Prompt(20, 4000), Params(8)).ok());
  h.Step();
  h.Step();
  SchedulerStats before = h.scheduler.stats();
  ASSERT_EQ(before.num_running, 1);
  ASSERT_EQ(before.num_swapped, 1);
  ASSERT_EQ(before.num_waiting, 2);
  const int a_tokens = static_cast<int>(h.streams["a"].tokens[0].size());
  ASSERT_GT(a_tokens, 0);
  // The workers fail during the next step: it is planned and never answered.
  (void)h.scheduler.Schedule();

  // The new group has a cache of another size (and no host blocks).
  const BlockSpaceManagerConfig new_cache = Cache(40, 0, /*caching=*/true);
  h.scheduler.ResetForNewWorkers(new_cache);
  const SchedulerStats after = h.scheduler.stats();
  EXPECT_EQ(after.num_running, 0);
  EXPECT_EQ(after.num_swapped, 0);
  EXPECT_EQ(after.num_waiting, 4);
  EXPECT_EQ(after.num_worker_resets, 1);
  const BlockSpaceManager& m = h.scheduler.block_manager();
  EXPECT_EQ(m.gpu_pool().num_blocks(), 40);
  EXPECT_EQ(m.stats().num_free_gpu_blocks, 40);
  EXPECT_EQ(m.num_sequences(), 0);
  const absl::Status inv = h.scheduler.CheckInvariants();
  EXPECT_TRUE(inv.ok()) << inv;

  // The next step sends every request whole, as new, in arrival order, with no prefix hit
  // (a's blocks were in the old prefix cache) and its generated tokens kept.
  FakeExecutor fresh(SchedulerHarness::ExecConfig(new_cache));
  const SchedulerOutput& first = h.scheduler.Schedule();
  EXPECT_THAT(Ids(first.new_requests), ElementsAre("a", "b", "c", "d"));
  EXPECT_THAT(first.cached_requests, IsEmpty());
  EXPECT_THAT(first.blocks_to_swap_in, IsEmpty());
  for (const ScheduledRequest& r : first.new_requests) {
    EXPECT_EQ(r.num_computed_tokens, 0) << r.request_id;
    EXPECT_FALSE(r.resumed_from_preemption) << r.request_id;
  }
  const ScheduledRequest& a = first.new_requests[0];
  EXPECT_EQ(a.num_scheduled_tokens, 80 + a_tokens);
  EXPECT_EQ(first.Seqs(a)[0].new_token_ids.size, static_cast<uint32_t>(a_tokens));
  ModelOutput mo;
  ASSERT_TRUE(fresh.Execute(first, &mo).ok());
  absl::StatusOr<const StepOutputs*> outputs = h.scheduler.UpdateFromOutput(mo);
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  h.Record(**outputs);
  RunOn(h, fresh);

  // Every stream is what an undisturbed run yields: no token twice, none lost.
  ExpectStreams(h, "a", Prompt(80), Params(20));
  ExpectStreams(h, "b", Prompt(80, 1000), Params(20));
  ExpectStreams(h, "c", Prompt(20, 3000), Params(8));
  ExpectStreams(h, "d", Prompt(20, 4000), Params(8));
  EXPECT_EQ(h.scheduler.block_manager().stats().num_free_gpu_blocks, 40);
}

TEST(Scheduler, ResetForNewWorkersKeepsPriorityOrderAndForkedSequences) {
  SchedulerConfig config = Config();
  config.policy = SchedulingPolicy::kPriority;
  const BlockSpaceManagerConfig cache = Cache(100);
  SchedulerHarness h(config, cache, SchedulerHarness::ExecConfig(cache));
  ASSERT_TRUE(h.Add("low", Prompt(30, 10), Params(12, /*n=*/1), /*priority=*/5).ok());
  ASSERT_TRUE(h.Add("fork", Prompt(30, 500), Params(12, /*n=*/3), /*priority=*/1).ok());
  ASSERT_TRUE(h.Add("mid", Prompt(30, 900), Params(12, /*n=*/2), /*priority=*/3).ok());
  for (int i = 0; i < 5; ++i) h.Step();
  ASSERT_THAT(h.streams["fork"].tokens, SizeIs(3));
  ASSERT_EQ(h.streams["fork"].tokens[2].size(), 5u);
  (void)h.scheduler.Schedule();
  h.scheduler.ResetForNewWorkers(cache);
  EXPECT_EQ(h.scheduler.stats().num_waiting, 3);
  FakeExecutor fresh(SchedulerHarness::ExecConfig(cache));
  const SchedulerOutput& first = h.scheduler.Schedule();
  EXPECT_THAT(Ids(first.new_requests), ElementsAre("fork", "mid", "low"));
  const ScheduledRequest& f = first.new_requests[0];
  EXPECT_EQ(f.seqs.size, 3u);
  EXPECT_EQ(f.num_samples, 3);
  for (const ScheduledSequence& s : first.Seqs(f)) {
    EXPECT_TRUE(s.new_to_workers);
    EXPECT_EQ(s.new_token_ids.size, 5u);
  }
  ModelOutput mo;
  ASSERT_TRUE(fresh.Execute(first, &mo).ok());
  absl::StatusOr<const StepOutputs*> outputs = h.scheduler.UpdateFromOutput(mo);
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  h.Record(**outputs);
  RunOn(h, fresh);
  ExpectStreams(h, "fork", Prompt(30, 500), Params(12, 3));
  ExpectStreams(h, "mid", Prompt(30, 900), Params(12, 2));
  ExpectStreams(h, "low", Prompt(30, 10), Params(12, 1));
}

}  // namespace
}  // namespace llm

namespace llm {
namespace {

TEST(Scheduler, AsyncPlansEachDecodeOnTheTokenInFlightAndNeverPastMaxTokens) {
  SchedulerHarness h(Config(), Cache(50), SchedulerHarness::ExecConfig(Cache(50)));
  h.async = true;
  ASSERT_TRUE(h.Add("a", Prompt(8), Params(4)).ok());
  // Step 1, the prefill, is handed over and not applied yet.
  const SchedulerOutput& s1 = h.Step();
  EXPECT_EQ(s1.step_id, 1);
  EXPECT_EQ(h.scheduler.num_steps_in_flight(), 1);
  EXPECT_TRUE(h.streams.empty());
  // Step 2 decodes the token step 1 samples, before anyone knows it; the workers will have it.
  const SchedulerOutput& s2 = h.Step();
  ASSERT_THAT(s2.cached_requests, SizeIs(1));
  EXPECT_EQ(s2.cached_requests[0].num_computed_tokens, 8);
  EXPECT_EQ(s2.cached_requests[0].num_scheduled_tokens, 1);
  EXPECT_EQ(s2.cached_requests[0].num_samples, 1);
  EXPECT_THAT(s2.token_ids, IsEmpty());
  EXPECT_THAT(h.streams["a"].tokens[0], SizeIs(1));  // step 1 applied after step 2 was planned
  const SchedulerOutput& s3 = h.Step();
  ASSERT_THAT(s3.cached_requests, SizeIs(1));
  EXPECT_EQ(s3.cached_requests[0].num_computed_tokens, 9);
  const SchedulerOutput& s4 = h.Step();
  ASSERT_THAT(s4.cached_requests, SizeIs(1));
  EXPECT_EQ(s4.cached_requests[0].num_computed_tokens, 10);
  // Steps 1 to 4 sample its 4 tokens: nothing is planned past them.
  const SchedulerOutput& s5 = h.Step();
  EXPECT_TRUE(s5.cached_requests.empty() && s5.new_requests.empty());
  h.RunToCompletion();
  ExpectStreams(h, "a", Prompt(8), Params(4));
  const SchedulerStats stats = h.scheduler.stats();
  EXPECT_EQ(stats.num_samples_discarded, 0);
  EXPECT_GE(stats.num_steps_planned_ahead, 3);
  h.ExpectAllBlocksFree();
}

TEST(Scheduler, AsyncSequencesThatEndAtTheStepTheyWerePlannedPastShowNothingBeyondTheirStop) {
  // Many sequences stop where nothing predicts it (EOS, stop token ids, stop strings), each
  // with the next step already planned for it: the token sampled there is dropped, its
  // blocks are freed, and its request is reported ended to the workers.
  constexpr TokenId kEos = 7;
  SchedulerConfig config = Config();
  config.eos_token_id = kEos;
  FakeDetokenizerFactory detok;
  const FakeExecutorConfig ec = SchedulerHarness::ExecConfig(Cache(400), kEos, 0.15);
  SchedulerHarness h(config, Cache(400), ec, &detok);
  h.async = true;
  struct Sent {
    std::vector<TokenId> prompt;
    SamplingParams params;
  };
  std::map<std::string, Sent> sent;
  for (int i = 0; i < 64; ++i) {
    Sent s{Prompt(5 + i % 23, 100 + 37 * i), Params(4 + i % 29, i % 5 == 0 ? 3 : 1)};
    s.params.seed = i;
    const std::vector<TokenId> reference =
        ExpectedStream(h.executor, ec, s.prompt, s.params, 0, -1, 2048);
    if (i % 3 == 1) s.params.stop_token_ids = {reference[reference.size() / 2]};
    if (i % 3 == 2) s.params.stop = {"<" + std::to_string(reference[reference.size() / 3]) + ">"};
    const std::string id = "r" + std::to_string(i);
    ASSERT_TRUE(h.Add(id, s.prompt, s.params).ok());
    sent.emplace(id, std::move(s));
  }
  std::map<std::string, int> sample_rounds;  // planned, per request
  while (h.Busy()) {
    const SchedulerOutput& out = h.Step();
    ASSERT_FALSE(::testing::Test::HasFailure());
    for (const auto* list : {&out.new_requests, &out.cached_requests}) {
      for (const ScheduledRequest& r : *list) {
        if (r.num_samples > 0) ++sample_rounds[std::string(r.request_id)];
      }
    }
  }
  for (const auto& [id, s] : sent) {
    const Stream& st = h.streams[id];
    ASSERT_TRUE(st.finished) << id;
    for (int j = 0; j < s.params.n; ++j) {
      std::vector<TokenId> want = ExpectedStream(h.executor, ec, s.prompt, s.params, j, kEos, 2048);
      // A stop string ends the sequence at the token that completes it (FakeDetokenizer: one
      // token, one "<id>").
      if (!s.params.stop.empty()) {
        for (size_t k = 0; k < want.size(); ++k) {
          if ("<" + std::to_string(want[k]) + ">" == s.params.stop[0]) {
            want.resize(k + 1);
            break;
          }
        }
      }
      EXPECT_EQ(st.tokens[j], want) << id << " sequence " << j;
    }
    // Planned at most one round past what ended it, and never past max_tokens.
    EXPECT_LE(sample_rounds[id], s.params.max_tokens) << id;
  }
  const SchedulerStats stats = h.scheduler.stats();
  EXPECT_GT(stats.num_samples_discarded, 20) << "too few sequences ended with a step in flight";
  EXPECT_GT(stats.num_steps_planned_ahead, 10);
  h.ExpectAllBlocksFree();
}

TEST(Scheduler, SynchronousSchedulingPlansNothingAheadAndDropsNothing) {
  constexpr TokenId kEos = 7;
  SchedulerConfig config = Config();
  config.eos_token_id = kEos;
  SchedulerHarness h(config, Cache(100), SchedulerHarness::ExecConfig(Cache(100), kEos, 0.2));
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(h.Add("r" + std::to_string(i), Prompt(6 + i, 10 * i), Params(20)).ok());
  }
  h.RunToCompletion();
  EXPECT_EQ(h.scheduler.stats().num_steps_planned_ahead, 0);
  EXPECT_EQ(h.scheduler.stats().num_samples_discarded, 0);
  h.ExpectAllBlocksFree();
}

TEST(Scheduler, AnAbortWithAStepInFlightDropsWhatThatStepSampledForIt) {
  SchedulerHarness h(Config(), Cache(50), SchedulerHarness::ExecConfig(Cache(50)));
  h.async = true;
  ASSERT_TRUE(h.Add("a", Prompt(8), Params(10)).ok());
  ASSERT_TRUE(h.Add("b", Prompt(9, 50), Params(10)).ok());
  h.Step();
  h.Step();  // step 2 planned; step 1 applied
  ASSERT_EQ(h.scheduler.num_steps_in_flight(), 1);
  ASSERT_TRUE(h.scheduler.Abort("a").ok());
  const int before = static_cast<int>(h.streams["a"].tokens[0].size());
  h.RunToCompletion();
  EXPECT_EQ(static_cast<int>(h.streams["a"].tokens[0].size()), before);
  EXPECT_FALSE(h.streams["a"].finished);  // the abort's caller ends its stream
  EXPECT_GE(h.scheduler.stats().num_samples_discarded, 1);
  ExpectStreams(h, "b", Prompt(9, 50), Params(10));
  h.ExpectAllBlocksFree();
}

}  // namespace
}  // namespace llm
