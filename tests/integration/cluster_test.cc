// End-to-end tests of the distributed system: real llm-cluster, llm-scheduler and llm-worker
// processes on free loopback ports, called through gRPC as a user would. Every test stops its
// cluster and checks that no process is left behind (LocalCluster::Stop).
//
// Deadlines here are hang guards only; no assertion depends on timing.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/blas_setup.h"
#include "tests/integration/cluster_harness.h"
#include "tools/health_check.h"

namespace llm::testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

const std::vector<std::string>& Prompts() {
  static const auto* p = new std::vector<std::string>{
      "Once upon a time",
      "The best programmers write code that",
      "A fortune: you will travel far, and",
  };
  return *p;
}

std::unique_ptr<LocalCluster> StartCluster(const ClusterOptions& options) {
  absl::StatusOr<std::unique_ptr<LocalCluster>> c = LocalCluster::Start(options);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

void ExpectCleanStop(LocalCluster& c) {
  absl::StatusOr<int> s = c.Stop();
  EXPECT_TRUE(s.ok()) << s.status();
}

// Greedy outputs of each prompt, requested one after another.
std::vector<std::vector<int32_t>> GreedyOutputs(LocalCluster& c,
                                                const std::vector<std::string>& prompts,
                                                int max_tokens) {
  std::vector<std::vector<int32_t>> out;
  for (const std::string& p : prompts) {
    GenerateResult r = Generate(c.stub(), GreedyRequest(p, max_tokens));
    EXPECT_TRUE(r.status.ok()) << p << ": " << r.status.error_message();
    EXPECT_EQ(r.finish_reason[0], v1::FINISH_REASON_LENGTH) << p;
    EXPECT_TRUE(r.has_usage);
    EXPECT_EQ(r.usage.completion_tokens(), static_cast<uint32_t>(max_tokens));
    out.push_back(r.token_ids[0]);
  }
  return out;
}

// Greedy outputs of each prompt, all requested at once (they share steps and the KV pool).
std::vector<std::vector<int32_t>> ConcurrentGreedyOutputs(LocalCluster& c,
                                                          const std::vector<std::string>& prompts,
                                                          int max_tokens) {
  std::vector<GenerateResult> results(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back(
        [&, i] { results[i] = Generate(c.stub(), GreedyRequest(prompts[i], max_tokens)); });
  }
  for (std::thread& t : threads) t.join();
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_TRUE(results[i].status.ok()) << prompts[i] << ": " << results[i].status.error_message();
    out.push_back(results[i].token_ids[0]);
  }
  return out;
}

std::vector<std::string> VariedPrompts(int count) {
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) {
    std::string p = Prompts()[i % Prompts().size()];
    for (int k = 0; k < i % 4; ++k) absl::StrAppend(&p, " and then the story went on");
    out.push_back(absl::StrCat(p, " (", i, ")"));
  }
  return out;
}

TEST(ClusterTest, GreedyOutputIsTheSameAtTp1AndTp2AndInProcess) {
  constexpr int kMaxTokens = 24;
  absl::StatusOr<std::vector<std::vector<int32_t>>> reference =
      ReferenceGreedy(DefaultModel(), Prompts(), kMaxTokens);
  ASSERT_TRUE(reference.ok()) << reference.status();
  // Asynchronous scheduling is the default; TP 2 runs without it too.
  for (const auto& [tp, async] : {std::pair{1, true}, {2, true}, {2, false}}) {
    SCOPED_TRACE(absl::StrCat("tensor_parallel_size ", tp, ", async scheduling ", async));
    std::unique_ptr<LocalCluster> c = StartCluster(
        {.tensor_parallel_size = tp, .engine = {{"async_scheduling", async ? "true" : "false"}}});
    ASSERT_NE(c, nullptr);
    absl::StatusOr<v1::GetModelInfoResponse> info = GetModelInfo(c->stub());
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->tensor_parallel_size(), static_cast<uint32_t>(tp));
    EXPECT_EQ(GreedyOutputs(*c, Prompts(), kMaxTokens), *reference);
    // The scheduler's own count: each decode step was planned while the one before ran.
    absl::StatusOr<v1::GetStatsResponse> stats = GetStats(c->stub());
    ASSERT_TRUE(stats.ok()) << stats.status();
    if (async) {
      EXPECT_GE(stats->num_steps_planned_ahead(), Prompts().size() * (kMaxTokens - 2));
    } else {
      EXPECT_EQ(stats->num_steps_planned_ahead(), 0u);
    }
    EXPECT_EQ(stats->num_samples_discarded(), 0u) << "max_tokens is known: nothing to drop";
    ExpectCleanStop(*c);
  }
}

// kv_cache_dtype bfloat16 with float32 weights, on whatever CPU runs the tests: the workers'
// blocks take half the bytes, so the same cpu_kv_cache_space holds twice the blocks, and the
// greedy tokens are the same at tensor-parallel sizes 1 and 2 (each rank stores its heads
// rounded as one rank would). Against the f32 cache the tokens may differ where two logits are
// close: bf16 keys and values keep the logits within 3e-2 of their range, not equal
// (llama_test's LogitsWithABf16KvCacheAreTransformersWithinBf16Tolerance).
TEST(ClusterTest, Bf16KvCacheOfAFloat32ModelHoldsTwiceTheBlocksAndAgreesAcrossTpSizes) {
  constexpr int kMaxTokens = 16;
  uint32_t f32_blocks = 0;
  {
    std::unique_ptr<LocalCluster> c = StartCluster({.engine = {{"dtype", "float32"}}});
    ASSERT_NE(c, nullptr);
    absl::StatusOr<v1::GetModelInfoResponse> info = GetModelInfo(c->stub());
    ASSERT_TRUE(info.ok()) << info.status();
    f32_blocks = info->num_gpu_blocks();
    ExpectCleanStop(*c);
  }
  ASSERT_GT(f32_blocks, 0u);
  std::vector<std::vector<int32_t>> outputs[2];
  for (int tp : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("tensor_parallel_size ", tp));
    std::unique_ptr<LocalCluster> c =
        StartCluster({.tensor_parallel_size = tp,
                      .engine = {{"dtype", "float32"}, {"kv_cache_dtype", "bfloat16"}}});
    ASSERT_NE(c, nullptr);
    if (tp == 1) {
      absl::StatusOr<v1::GetModelInfoResponse> info = GetModelInfo(c->stub());
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_NEAR(info->num_gpu_blocks(), 2.0 * f32_blocks, 1.0);
    }
    outputs[tp - 1] = GreedyOutputs(*c, Prompts(), kMaxTokens);
    ASSERT_EQ(outputs[tp - 1].size(), Prompts().size());
    for (const std::vector<int32_t>& out : outputs[tp - 1]) EXPECT_EQ(out.size(), kMaxTokens);
    ExpectCleanStop(*c);
  }
  EXPECT_EQ(outputs[0], outputs[1]);
}

// The mixtures of experts served by llm-cluster at tensor-parallel size 2 (each rank holds its
// slice of every expert, one all-reduce per layer) give the greedy tokens of the in-process
// engine on the same directory, whose logits are transformers' within 1e-4 (LlamaGoldenTest).
TEST(ClusterTest, MixturesOfExpertsServeTheirGreedyTokensAtTp2) {
  constexpr int kMaxTokens = 12;
  for (const char* name : {"tiny-mixtral", "tiny-qwen2-moe", "tiny-qwen3-moe"}) {
    SCOPED_TRACE(name);
    const std::string dir = std::string(LLM_TEST_DATA_DIR) + "/models/" + name;
    absl::StatusOr<std::vector<std::vector<int32_t>>> reference =
        ReferenceGreedy(dir, Prompts(), kMaxTokens);
    ASSERT_TRUE(reference.ok()) << reference.status();
    std::unique_ptr<LocalCluster> c =
        StartCluster({.model = dir, .tensor_parallel_size = 2, .engine = {{"dtype", "float32"}}});
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(GreedyOutputs(*c, Prompts(), kMaxTokens), *reference);
    ExpectCleanStop(*c);
  }
}

// OLMoE (q/k norm over each token's whole projections: at tensor-parallel size 2 each rank sums
// its heads' squares and the ranks all-reduce them) served by llm-cluster at TP 2 from its
// directory and from its GGUF conversion gives the in-process engine's greedy tokens, whose
// logits are transformers' within 1e-4 (LlamaGoldenTest).
TEST(ClusterTest, OlmoeServesItsGreedyTokens) {
  constexpr int kMaxTokens = 12;
  const std::string dir = std::string(LLM_TEST_DATA_DIR) + "/models/tiny-olmoe";
  absl::StatusOr<std::vector<std::vector<int32_t>>> reference =
      ReferenceGreedy(dir, Prompts(), kMaxTokens);
  ASSERT_TRUE(reference.ok()) << reference.status();
  for (const std::string& model : {dir, dir + ".gguf"}) {
    SCOPED_TRACE(model);
    std::unique_ptr<LocalCluster> c =
        StartCluster({.model = model, .tensor_parallel_size = 2, .engine = {{"dtype", "float32"}}});
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(GreedyOutputs(*c, Prompts(), kMaxTokens), *reference);
    ExpectCleanStop(*c);
  }
}

// A model whose every layer attends through a sliding window (tiny-phi3: 24 positions, as
// Phi-3-mini's 2047): the scheduler gives back each sequence's blocks before its window as it
// grows, and other sequences write into them, in a pool too small to hold every sequence whole
// (8 streams of about 76 tokens need 40 blocks of 16 without the release; the pool has 20).
// Without prefix caching a released block is the next one handed out; with it (the chain of
// block hashes continues past released blocks) released blocks wait in the cache. With chunked
// prefill, at tensor-parallel size 2, every stream is the in-process engine's greedy output,
// which holds every block to the end; the scheduler's own counter says blocks went back.
TEST(ClusterTest, SlidingWindowModelGivesBackTheBlocksBeforeItsWindow) {
  constexpr int kMaxTokens = 64;
  const std::string dir = std::string(LLM_TEST_DATA_DIR) + "/models/tiny-phi3";
  const std::vector<std::string> prompts = VariedPrompts(8);
  absl::StatusOr<std::vector<std::vector<int32_t>>> reference =
      ReferenceGreedy(dir, prompts, kMaxTokens);
  ASSERT_TRUE(reference.ok()) << reference.status();
  for (const char* caching : {"false", "true"}) {
    SCOPED_TRACE(absl::StrCat("enable_prefix_caching ", caching));
    std::unique_ptr<LocalCluster> c = StartCluster({.model = dir,
                                                    .tensor_parallel_size = 2,
                                                    .engine = {{"dtype", "float32"},
                                                               {"num_gpu_blocks_override", "20"},
                                                               {"max_num_seqs", "8"},
                                                               {"watermark", "0"},
                                                               {"enable_prefix_caching", caching},
                                                               {"enable_chunked_prefill", "true"},
                                                               {"max_num_batched_tokens", "32"}}});
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(ConcurrentGreedyOutputs(*c, prompts, kMaxTokens), *reference);
    absl::StatusOr<v1::GetStatsResponse> stats =
        WaitUntilAllBlocksFree(c->stub(), absl::Seconds(30));
    ASSERT_TRUE(stats.ok()) << stats.status();
    // Each stream passes position 24 + 16 = 40 and gives back at least its first two blocks.
    EXPECT_GE(stats->num_window_released_blocks(), 16u);
    EXPECT_EQ(stats->num_free_gpu_blocks(), 20u);
    ExpectCleanStop(*c);
  }
}

// Greedy streams that end at a stop token, so that the step after the one that samples it is
// already on its way for them (asynchronous scheduling): each stream ends exactly at its stop,
// as the undisturbed greedy output says, and the scheduler dropped what it sampled past it.
TEST(ClusterTest, StreamsEndExactlyAtTheirStopWhileTheNextStepIsInFlight) {
  constexpr int kMaxTokens = 24;
  const std::vector<std::string> prompts = VariedPrompts(6);
  absl::StatusOr<std::vector<std::vector<int32_t>>> reference =
      ReferenceGreedy(DefaultModel(), prompts, kMaxTokens);
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::unique_ptr<LocalCluster> c = StartCluster({.tensor_parallel_size = 2});
  ASSERT_NE(c, nullptr);
  std::vector<GenerateResult> results(prompts.size());
  std::vector<std::vector<int32_t>> want(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    // Stop at the token at position 3 + i: the stream is the reference up to its first
    // occurrence.
    const std::vector<int32_t>& ref = (*reference)[i];
    const int32_t stop = ref[3 + i];
    want[i].assign(ref.begin(), std::find(ref.begin(), ref.end(), stop) + 1);
    v1::GenerateRequest req = GreedyRequest(prompts[i], kMaxTokens);
    req.mutable_sampling_params()->add_stop_token_ids(stop);
    threads.emplace_back([&, i, req] { results[i] = Generate(c->stub(), req); });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(prompts[i]);
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_EQ(results[i].token_ids[0], want[i]);
    EXPECT_EQ(results[i].finish_reason[0], v1::FINISH_REASON_STOP);
  }
  absl::StatusOr<v1::GetStatsResponse> stats = WaitUntilAllBlocksFree(c->stub(), absl::Seconds(30));
  ASSERT_TRUE(stats.ok()) << stats.status();
  // A sequence's blocks are freed when the step that stopped it is applied; what the next step
  // sampled for it is dropped (and counted) when that one is, a step later.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (stats->num_samples_discarded() < prompts.size() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    stats = GetStats(c->stub());
    ASSERT_TRUE(stats.ok()) << stats.status();
  }
  EXPECT_GE(stats->num_samples_discarded(), prompts.size());
  absl::StatusOr<v1::GetModelInfoResponse> info = GetModelInfo(c->stub());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(stats->num_free_gpu_blocks(), info->num_gpu_blocks());
  ExpectCleanStop(*c);
}

TEST(ClusterTest, ThirtyTwoConcurrentStreamsFinishAndFreeEveryBlock) {
  std::unique_ptr<LocalCluster> c =
      StartCluster({.tensor_parallel_size = 2, .engine = {{"enable_prefix_caching", "true"}}});
  ASSERT_NE(c, nullptr);
  constexpr int kClients = 32;
  const std::vector<std::string> prompts = VariedPrompts(kClients);
  std::vector<GenerateResult> results(kClients);
  std::vector<int> max_tokens(kClients), n(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    max_tokens[i] = 4 + (i * 7) % 29;
    n[i] = i % 4 == 0 ? 2 : 1;
    v1::GenerateRequest req;
    req.set_text(prompts[i]);
    req.set_add_special_tokens(true);
    req.set_stream(i % 5 != 0);  // a few ask for one response at the end
    v1::SamplingParams* p = req.mutable_sampling_params();
    p->set_max_tokens(max_tokens[i]);
    p->set_n(n[i]);
    p->set_temperature(0.8);
    // Half without a seed: each rank appends the tokens it samples, so the ranks must draw
    // alike; the API draws a seed for such a request (without it, the ranks' own random seeds
    // differ and the scheduler fails the step: the sampled digests disagree).
    if (i % 2 == 0) p->set_seed(i);
    p->set_ignore_eos(true);
    threads.emplace_back([&, i, req] { results[i] = Generate(c->stub(), req); });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    SCOPED_TRACE(absl::StrCat("client ", i));
    const GenerateResult& r = results[i];
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ASSERT_EQ(r.token_ids.size(), static_cast<size_t>(n[i]));
    for (int s = 0; s < n[i]; ++s) {
      EXPECT_EQ(r.token_ids.at(s).size(), static_cast<size_t>(max_tokens[i]));
      EXPECT_EQ(r.finish_reason.at(s), v1::FINISH_REASON_LENGTH);
    }
    EXPECT_EQ(r.usage.completion_tokens(), static_cast<uint32_t>(n[i] * max_tokens[i]));
    EXPECT_GT(r.usage.prompt_tokens(), 0u);
  }
  absl::StatusOr<v1::GetStatsResponse> stats = WaitUntilAllBlocksFree(c->stub(), absl::Seconds(30));
  ASSERT_TRUE(stats.ok()) << stats.status();
  absl::StatusOr<v1::GetModelInfoResponse> info = GetModelInfo(c->stub());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(stats->num_running(), 0u);
  EXPECT_EQ(stats->num_waiting(), 0u);
  EXPECT_EQ(stats->num_free_gpu_blocks(), info->num_gpu_blocks());
  ExpectCleanStop(*c);
}

// Enough long requests at once for a 24-block pool to run out: preemption happens, and the
// greedy outputs are those of the in-process engine, in both preemption modes.
TEST(ClusterTest, PreemptionInRecomputeAndSwapModeKeepsGreedyOutputs) {
  constexpr int kMaxTokens = 48;
  const std::vector<std::string> prompts = VariedPrompts(8);
  absl::StatusOr<std::vector<std::vector<int32_t>>> reference =
      ReferenceGreedy(DefaultModel(), prompts, kMaxTokens);
  ASSERT_TRUE(reference.ok()) << reference.status();
  for (const char* mode : {"recompute", "swap"}) {
    SCOPED_TRACE(mode);
    std::unique_ptr<LocalCluster> c = StartCluster({.tensor_parallel_size = 2,
                                                    .engine = {{"num_gpu_blocks_override", "24"},
                                                               {"preemption_mode", mode},
                                                               {"max_num_seqs", "8"},
                                                               {"watermark", "0"}}});
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(ConcurrentGreedyOutputs(*c, prompts, kMaxTokens), *reference);
    absl::StatusOr<v1::GetStatsResponse> stats =
        WaitUntilAllBlocksFree(c->stub(), absl::Seconds(30));
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_GT(stats->num_preemptions(), 0u) << "the pool was meant to run out";
    EXPECT_EQ(stats->num_free_gpu_blocks(), 24u);
    ExpectCleanStop(*c);
  }
}

TEST(ClusterTest, PrefixCachingReusesASharedPrefixWithTheSameOutput) {
  constexpr int kMaxTokens = 16;
  std::string prefix = "In a land far away there lived a programmer who";
  for (int i = 0; i < 6; ++i) absl::StrAppend(&prefix, " wrote code all day and all night,");
  const std::vector<std::string> prompts = {prefix + " the first story", prefix + " another"};
  absl::StatusOr<std::vector<std::vector<int32_t>>> reference =
      ReferenceGreedy(DefaultModel(), prompts, kMaxTokens);
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::unique_ptr<LocalCluster> c =
      StartCluster({.tensor_parallel_size = 2, .engine = {{"enable_prefix_caching", "true"}}});
  ASSERT_NE(c, nullptr);
  GenerateResult first = Generate(c->stub(), GreedyRequest(prompts[0], kMaxTokens));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  GenerateResult second = Generate(c->stub(), GreedyRequest(prompts[1], kMaxTokens));
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_GT(first.usage.prompt_tokens(), 32u) << "the shared prefix must span whole blocks";
  EXPECT_GT(second.usage.cached_prompt_tokens(), 0u);
  EXPECT_EQ(first.token_ids[0], (*reference)[0]);
  EXPECT_EQ(second.token_ids[0], (*reference)[1]);
  absl::StatusOr<v1::GetStatsResponse> stats = GetStats(c->stub());
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->prefix_cache_hit_rate(), 0.0);
  ExpectCleanStop(*c);
}

TEST(ClusterTest, ChunkedPrefillGivesTheSameOutputs) {
  constexpr int kMaxTokens = 16;
  std::vector<std::string> prompts = VariedPrompts(4);
  for (std::string& p : prompts) absl::StrAppend(&p, " and the long prompt went on and on");
  absl::StatusOr<std::vector<std::vector<int32_t>>> reference =
      ReferenceGreedy(DefaultModel(), prompts, kMaxTokens);
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::unique_ptr<LocalCluster> c = StartCluster({.tensor_parallel_size = 2,
                                                  .engine = {{"enable_chunked_prefill", "true"},
                                                             {"long_prefill_token_threshold", "8"},
                                                             {"max_num_batched_tokens", "32"}}});
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(ConcurrentGreedyOutputs(*c, prompts, kMaxTokens), *reference);
  ExpectCleanStop(*c);
}

TEST(ClusterTest, CancelInMidStreamFreesBlocksAndLeavesOtherStreamsAlone) {
  constexpr int kMaxTokens = 64;
  const std::vector<std::string> prompts = {Prompts()[1], Prompts()[2]};
  absl::StatusOr<std::vector<std::vector<int32_t>>> reference =
      ReferenceGreedy(DefaultModel(), prompts, kMaxTokens);
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::unique_ptr<LocalCluster> c = StartCluster({.tensor_parallel_size = 2});
  ASSERT_NE(c, nullptr);

  // The stream to cancel asks for far more tokens than the others, so it is still running
  // when it is cancelled after its first few responses.
  grpc::ClientContext cancel_ctx;
  auto cancelled = c->stub().Generate(&cancel_ctx, GreedyRequest(Prompts()[0], 480));
  std::vector<GenerateResult> others(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back(
        [&, i] { others[i] = Generate(c->stub(), GreedyRequest(prompts[i], kMaxTokens)); });
  }
  v1::GenerateResponse resp;
  int responses = 0;
  while (responses < 3 && cancelled->Read(&resp)) ++responses;
  EXPECT_EQ(responses, 3);
  cancel_ctx.TryCancel();
  while (cancelled->Read(&resp)) {
  }
  EXPECT_EQ(cancelled->Finish().error_code(), grpc::StatusCode::CANCELLED);
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_TRUE(others[i].status.ok()) << others[i].status.error_message();
    EXPECT_EQ(others[i].token_ids[0], (*reference)[i]);
  }
  absl::StatusOr<v1::GetStatsResponse> stats = WaitUntilAllBlocksFree(c->stub(), absl::Seconds(30));
  ASSERT_TRUE(stats.ok()) << stats.status();
  absl::StatusOr<v1::GetModelInfoResponse> info = GetModelInfo(c->stub());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(stats->num_running(), 0u);
  EXPECT_EQ(stats->num_free_gpu_blocks(), info->num_gpu_blocks());
  ExpectCleanStop(*c);
}

// Every bad input the API documents, sent by a real client: INVALID_ARGUMENT with a message
// that names what is wrong; the server then still serves.
TEST(ClusterTest, BadInputsGetInvalidArgumentAndTheServerKeepsServing) {
  std::unique_ptr<LocalCluster> c = StartCluster({.tensor_parallel_size = 1});
  ASSERT_NE(c, nullptr);
  absl::StatusOr<v1::GetModelInfoResponse> info = GetModelInfo(c->stub());
  ASSERT_TRUE(info.ok()) << info.status();

  struct Case {
    std::string name;
    std::function<void(v1::GenerateRequest*)> edit;
    std::string message;  // a part of the expected message
  };
  auto sp = [](v1::GenerateRequest* r) { return r->mutable_sampling_params(); };
  const int vocab = static_cast<int>(info->vocab_size());
  const int max_len = static_cast<int>(info->max_model_len());
  const std::vector<Case> cases = {
      {"empty text", [](v1::GenerateRequest* r) { r->set_text(""); }, "empty"},
      {"no prompt", [](v1::GenerateRequest* r) { r->clear_prompt(); }, "prompt"},
      {"empty token ids", [](v1::GenerateRequest* r) { r->mutable_token_ids(); }, "empty"},
      {"token id = vocab",
       [vocab](v1::GenerateRequest* r) { r->mutable_token_ids()->add_ids(vocab); }, "vocab"},
      {"negative token id", [](v1::GenerateRequest* r) { r->mutable_token_ids()->add_ids(-1); },
       "vocab"},
      {"too long", [&](v1::GenerateRequest* r) { sp(r)->set_max_tokens(max_len); },
       "max_model_len"},
      {"max_tokens 0", [&](v1::GenerateRequest* r) { sp(r)->set_max_tokens(0); }, "max_tokens"},
      {"temperature -1", [&](v1::GenerateRequest* r) { sp(r)->set_temperature(-1); },
       "temperature"},
      {"top_p 0", [&](v1::GenerateRequest* r) { sp(r)->set_top_p(0); }, "top_p"},
      {"top_p 1.5", [&](v1::GenerateRequest* r) { sp(r)->set_top_p(1.5); }, "top_p"},
      {"top_k 0", [&](v1::GenerateRequest* r) { sp(r)->set_top_k(0); }, "top_k"},
      {"min_p 2", [&](v1::GenerateRequest* r) { sp(r)->set_min_p(2); }, "min_p"},
      {"n 0", [&](v1::GenerateRequest* r) { sp(r)->set_n(0); }, "n "},
      {"n 1000",
       [&](v1::GenerateRequest* r) {
         sp(r)->set_n(1000);
         sp(r)->set_temperature(1);
       },
       "n "},
      {"min_tokens > max_tokens",
       [&](v1::GenerateRequest* r) {
         sp(r)->set_max_tokens(4);
         sp(r)->set_min_tokens(5);
       },
       "min_tokens"},
      {"presence_penalty 3", [&](v1::GenerateRequest* r) { sp(r)->set_presence_penalty(3); },
       "presence_penalty"},
      {"frequency_penalty -3", [&](v1::GenerateRequest* r) { sp(r)->set_frequency_penalty(-3); },
       "frequency_penalty"},
      {"repetition_penalty 0", [&](v1::GenerateRequest* r) { sp(r)->set_repetition_penalty(0); },
       "repetition_penalty"},
      {"empty stop string", [&](v1::GenerateRequest* r) { sp(r)->add_stop(""); }, "stop"},
      {"too many stop strings",
       [&](v1::GenerateRequest* r) {
         for (int i = 0; i < 1000; ++i) sp(r)->add_stop(absl::StrCat("stop", i));
       },
       "stop"},
      {"logprobs over max_logprobs", [&](v1::GenerateRequest* r) { sp(r)->set_logprobs(1000); },
       "logprobs"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    v1::GenerateRequest req = GreedyRequest("Once upon a time", 8);
    k.edit(&req);
    GenerateResult r = Generate(c->stub(), req);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << r.status.error_message();
    EXPECT_THAT(r.status.error_message(), HasSubstr(k.message));
    EXPECT_TRUE(r.token_ids.empty());
  }
  GenerateResult ok = Generate(c->stub(), GreedyRequest("Once upon a time", 8));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.usage.completion_tokens(), 8u);
  EXPECT_EQ(HealthChecker(c->address()).Check("", absl::Seconds(10)), HealthChecker::kServing);
  ExpectCleanStop(*c);
}

// Runs `command` through the shell; its stdout and stderr, and its exit status.
std::pair<std::string, int> RunCommand(const std::string& command) {
  FILE* f = popen((command + " 2>&1").c_str(), "r");
  if (f == nullptr) return {"popen failed", -1};
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), f)) > 0;) out.append(buf, n);
  const int status = pclose(f);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

// The command-line client against a real cluster: streamed text with usage and timings,
// info and stats, and a gRPC error as its code and message with exit status 1.
TEST(ClusterTest, LlmClientGeneratesAndReportsErrors) {
  std::unique_ptr<LocalCluster> c = StartCluster({.tensor_parallel_size = 2});
  ASSERT_NE(c, nullptr);
  const std::string client = absl::StrCat(LLM_BIN_DIR, "/llm-client --address=", c->address(), " ");
  auto [text, rc] = RunCommand(client + "generate \"Once upon a time\" --max-tokens 12 " +
                               "--temperature=0 --ignore-eos");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_THAT(text, HasSubstr("Once upon a time"));
  EXPECT_THAT(text, HasSubstr("12 completion tokens"));
  EXPECT_THAT(text, HasSubstr("time to first token"));
  std::tie(text, rc) = RunCommand(client + "generate \"Hi\" --max-tokens=5 --n=2 --seed=3");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_THAT(text, HasSubstr("[1] Hi"));
  std::tie(text, rc) = RunCommand(client + "info");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_THAT(text, HasSubstr("tensor_parallel_size: 2"));
  std::tie(text, rc) = RunCommand(client + "stats");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_THAT(text, HasSubstr("0 running"));
  std::tie(text, rc) = RunCommand(client + "generate \"Hi\" --top-p=1.5");
  EXPECT_EQ(rc, 1) << text;
  EXPECT_THAT(text, HasSubstr("INVALID_ARGUMENT: "));
  EXPECT_THAT(text, HasSubstr("top_p"));
  std::tie(text, rc) = RunCommand(client + "frobnicate");
  EXPECT_EQ(rc, 2) << text;
  ExpectCleanStop(*c);
}

// The committed local manifests (deploy/local, what `make run` and `make serve` use) start a
// cluster that answers Generate with the in-process engine's greedy tokens (ports made free).
TEST(ClusterTest, TheCommittedLocalManifestsServeGenerate) {
  // Their model paths are relative to the repository root.
  ASSERT_EQ(chdir(LLM_SOURCE_DIR), 0);
  const absl::StatusOr<std::vector<std::vector<int32_t>>> want =
      ReferenceGreedy("models/fortune-llama", {"Once upon a time"}, 16);
  ASSERT_TRUE(want.ok()) << want.status();
  for (const char* name : {"tp1-cpu.yaml", "tp2-cpu.yaml"}) {
    std::unique_ptr<LocalCluster> c =
        StartCluster({.manifest = std::string("deploy/local/") + name});
    ASSERT_NE(c, nullptr) << name;
    const GenerateResult r = Generate(c->stub(), GreedyRequest("Once upon a time", 16));
    ASSERT_TRUE(r.status.ok()) << name << ": " << r.status.error_message();
    EXPECT_EQ(r.token_ids.at(0), want->at(0)) << name;
    const absl::StatusOr<v1::GetModelInfoResponse> info = GetModelInfo(c->stub());
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->model_name(), "fortune-llama") << name;
    ExpectCleanStop(*c);
  }
}

// Chat against a cluster serving fortune-llama (its chat_template.jinja is SmolLM2's ChatML):
// the greedy answer is the one to the rendered conversation sent as text without a BOS, and
// llm-client chat streams it.
TEST(ClusterTest, ChatIsTheRenderedConversationGenerated) {
  std::unique_ptr<LocalCluster> c =
      StartCluster({.model = std::string(LLM_SOURCE_DIR) + "/models/fortune-llama"});
  ASSERT_NE(c, nullptr);
  v1::GenerateRequest chat = GreedyRequest("", 16);
  chat.clear_text();
  for (const auto& [role, content] : std::vector<std::pair<std::string, std::string>>{
           {"system", "You tell fortunes."}, {"user", "What will happen tomorrow?"}}) {
    v1::ChatMessage* m = chat.mutable_chat()->add_messages();
    m->set_role(role);
    m->set_content(content);
  }
  v1::GenerateRequest text = GreedyRequest(
      "<|im_start|>system\nYou tell fortunes.<|im_end|>\n<|im_start|>user\nWhat will happen "
      "tomorrow?<|im_end|>\n<|im_start|>assistant\n",
      16);
  text.set_add_special_tokens(false);
  const GenerateResult from_chat = Generate(c->stub(), chat);
  ASSERT_TRUE(from_chat.status.ok()) << from_chat.status.error_message();
  const GenerateResult from_text = Generate(c->stub(), text);
  ASSERT_TRUE(from_text.status.ok()) << from_text.status.error_message();
  EXPECT_EQ(from_chat.token_ids.at(0).size(), 16u);
  EXPECT_EQ(from_chat.token_ids.at(0), from_text.token_ids.at(0));
  EXPECT_EQ(from_chat.usage.prompt_tokens(), from_text.usage.prompt_tokens());

  const std::string client = absl::StrCat(LLM_BIN_DIR, "/llm-client --address=", c->address(), " ");
  auto [out, rc] = RunCommand(client + "chat \"What will happen tomorrow?\" " +
                              "--system=\"You tell fortunes.\" --max-tokens 16 --temperature=0 " +
                              "--ignore-eos");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_THAT(out, HasSubstr(from_chat.text.at(0)));
  EXPECT_THAT(out, HasSubstr("16 completion tokens"));
  ExpectCleanStop(*c);
}

// A manifest error stops llm-cluster before it starts anything: exit 2, file:line and key.
TEST(ClusterTest, LlmClusterRejectsABadManifest) {
  char dir[] = "/tmp/llm-manifest-test.XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/bad.yaml";
  {
    std::ofstream out(path);
    out << "model: " << DefaultModel() << "\nengine:\n  block_sise: 16\n";
  }
  auto [text, rc] = RunCommand(absl::StrCat(LLM_BIN_DIR, "/llm-cluster --manifest=", path));
  EXPECT_EQ(rc, 2) << text;
  EXPECT_THAT(text, HasSubstr(path + ":3: engine.block_sise: unknown key"));
  std::filesystem::remove_all(dir);
}

// --worker-binary that names no executable stops llm-cluster before it starts anything.
TEST(ClusterTest, LlmClusterRejectsAMissingWorkerBinary) {
  auto [text, rc] = RunCommand(absl::StrCat(LLM_BIN_DIR, "/llm-cluster --manifest=", LLM_SOURCE_DIR,
                                            "/deploy/local/tp1-cpu.yaml --worker-binary=no-such"));
  EXPECT_EQ(rc, 2) << text;
  EXPECT_THAT(text, HasSubstr(absl::StrCat("--worker-binary: ", LLM_BIN_DIR,
                                           "/no-such is not an executable file")));
}

// A worker that dies while the scheduler starts is fatal even with restart_workers (restarts
// begin once the cluster serves): llm-cluster names it and exits 1 at once rather than waiting
// out startup_timeout_s. Stand-ins from a --bin-dir: workers that write their port file and
// exit 3 a second later, a scheduler that writes its port file and never serves.
TEST(ClusterTest, AWorkerDyingDuringStartupFailsTheStartEvenWithRestartWorkers) {
  char dir[] = "/tmp/llm-cluster-fake.XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string write_port =
      "#!/bin/sh\nfor a in \"$@\"; do case $a in --port-file=*) echo 1 > \"${a#--port-file=}\";; "
      "esac; done\n";
  const std::pair<const char*, std::string> scripts[] = {
      {"llm-worker", write_port + "sleep 1\nexit 3\n"},
      {"llm-scheduler", write_port + "exec sleep 600\n"},
  };
  for (const auto& [name, text] : scripts) {
    const std::string path = std::string(dir) + "/" + name;
    std::ofstream(path) << text;
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  }
  const std::string manifest = std::string(dir) + "/cluster.yaml";
  std::ofstream(manifest) << "model: " << DefaultModel()
                          << "\nrestart_workers: true\nstartup_timeout_s: 600\n";
  // `timeout`: a hang guard; it would stop llm-cluster with SIGTERM (exit 0, so rc 124).
  auto [text, rc] =
      RunCommand(absl::StrCat("timeout 60 ", LLM_BIN_DIR, "/llm-cluster --manifest=", manifest,
                              " --bin-dir=", dir, " --scheduler-port=0 --worker-base-port=0"));
  EXPECT_EQ(rc, 1) << text;
  EXPECT_THAT(text, HasSubstr("worker rank 0"));
  EXPECT_THAT(text, HasSubstr("exited with status 3 while waiting for the scheduler"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("restarting it")));
  std::filesystem::remove_all(dir);
}

// Ctrl-C (SIGINT) to llm-cluster stops every child and exits 0.
TEST(ClusterTest, SigintStopsTheWholeCluster) {
  std::unique_ptr<LocalCluster> c = StartCluster({.tensor_parallel_size = 2});
  ASSERT_NE(c, nullptr);
  const std::vector<pid_t> children = c->Children();
  ASSERT_EQ(children.size(), 3u);
  c->process().Signal(SIGINT);
  std::optional<int> status = c->process().Wait(absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << ChildProcess::DescribeStatus(*status);
  EXPECT_THAT(WaitUntilGone(children, absl::Seconds(30)), ::testing::IsEmpty());
}

// SIGTERM to llm-cluster while streams run: the scheduler drains (health NOT_SERVING, a new
// request gets UNAVAILABLE "draining"), the streams finish complete with the undisturbed greedy
// tokens, then the workers stop and llm-cluster exits 0. The workers are SIGSTOPped from the
// first tokens until the refusal has been seen, so that no stream can end before the signal
// whatever the machine's speed.
TEST(ClusterTest, SigtermDrainsTheStreamsInFlightThenStopsTheCluster) {
  // The harness's worker_timeout (30 s) bounds how long the workers may stay stopped.
  std::unique_ptr<LocalCluster> c = StartCluster({.tensor_parallel_size = 2});
  ASSERT_NE(c, nullptr);
  constexpr int kMaxTokens = 32;
  const std::vector<std::string> prompts = VariedPrompts(4);
  const std::vector<std::vector<int32_t>> want = ConcurrentGreedyOutputs(*c, prompts, kMaxTokens);

  struct Stream {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
    std::atomic<int> num_tokens{0};
    std::vector<int32_t> tokens;
    grpc::Status status;
    std::thread thread;
  };
  std::vector<std::unique_ptr<Stream>> streams;
  for (const std::string& p : prompts) {
    auto s = std::make_unique<Stream>();
    s->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(300));
    s->reader = c->stub().Generate(&s->ctx, GreedyRequest(p, kMaxTokens));
    s->thread = std::thread([st = s.get()] {
      v1::GenerateResponse resp;
      while (st->reader->Read(&resp)) {
        for (const auto& o : resp.outputs()) {
          st->tokens.insert(st->tokens.end(), o.token_ids().begin(), o.token_ids().end());
          st->num_tokens += o.token_ids_size();
        }
      }
      st->status = st->reader->Finish();
    });
    streams.push_back(std::move(s));
  }
  const std::vector<pid_t> workers = c->WorkerPids();
  ASSERT_EQ(workers.size(), 2u);
  const absl::Time guard = absl::Now() + absl::Seconds(120);
  auto all_started = [&] {
    for (auto& s : streams) {
      if (s->num_tokens == 0) return false;
    }
    return true;
  };
  while (!all_started() && absl::Now() < guard) absl::SleepFor(absl::Milliseconds(1));
  for (pid_t w : workers) kill(w, SIGSTOP);
  ASSERT_TRUE(all_started());
  for (auto& s : streams) EXPECT_LT(s->num_tokens, kMaxTokens);
  const std::vector<pid_t> children = c->Children();

  c->process().Signal(SIGTERM);
  HealthChecker health(c->address());
  while (health.Check("", absl::Seconds(5)) != HealthChecker::kNotServing && absl::Now() < guard) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const GenerateResult refused = Generate(c->stub(), GreedyRequest("Hello", 4));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("draining"));
  for (pid_t w : workers) kill(w, SIGCONT);

  for (size_t i = 0; i < streams.size(); ++i) {
    streams[i]->thread.join();
    EXPECT_TRUE(streams[i]->status.ok()) << streams[i]->status.error_message();
    EXPECT_EQ(streams[i]->tokens, want[i]) << prompts[i];
  }
  std::optional<int> status = c->process().Wait(absl::Seconds(120));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << ChildProcess::DescribeStatus(*status);
  EXPECT_THAT(WaitUntilGone(children, absl::Seconds(30)), ::testing::IsEmpty());
}

// TLS and an API key through llm-cluster (engine ssl_certfile / ssl_keyfile; LLM_API_KEY in its
// environment) at TP=2 (the ranks meet with the cluster secret llm-cluster made): llm-client
// generates over TLS with the key; without the key it gets UNAUTHENTICATED, without TLS it
// cannot connect.
TEST(ClusterTest, TlsAndApiKeyThroughLlmClusterAndLlmClient) {
  if (std::system("command -v openssl > /dev/null") != 0) GTEST_SKIP() << "no openssl CLI";
  const std::string dir = ::testing::TempDir() + "/tls_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string cert = dir + "/cert.pem";
  const std::string key = dir + "/key.pem";
  ASSERT_EQ(std::system(("openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
                         "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " +
                         key + " -out " + cert + " 2> /dev/null")
                            .c_str()),
            0);
  setenv("LLM_API_KEY", "integration-key", 1);
  std::unique_ptr<LocalCluster> c = StartCluster(
      {.tensor_parallel_size = 2, .engine = {{"ssl_certfile", cert}, {"ssl_keyfile", key}}});
  unsetenv("LLM_API_KEY");
  ASSERT_NE(c, nullptr);
  const std::string client = absl::StrCat(LLM_BIN_DIR, "/llm-client --address=", c->address(), " ");
  const std::string generate = "generate \"Once upon a time\" --max-tokens=8 --temperature=0 ";
  auto [text, rc] =
      RunCommand(client + "--tls-ca=" + cert + " --api-key=integration-key " + generate);
  EXPECT_EQ(rc, 0) << text;
  EXPECT_THAT(text, HasSubstr("8 completion tokens"));
  std::tie(text, rc) = RunCommand(client + "--tls-ca=" + cert + " " + generate);
  EXPECT_EQ(rc, 1) << text;
  EXPECT_THAT(text, HasSubstr("UNAUTHENTICATED: missing or invalid API key"));
  std::tie(text, rc) = RunCommand(client + "--api-key=integration-key --timeout=10 " + generate);
  EXPECT_EQ(rc, 1) << text;
  EXPECT_THAT(text, HasSubstr("UNAVAILABLE"));
  ExpectCleanStop(*c);
  std::filesystem::remove_all(dir);
}

// A worker SIGKILLed in mid-generation: health goes NOT_SERVING and new calls get UNAVAILABLE
// "the worker group is recovering"; llm-cluster (restart_workers) starts the worker again, the
// scheduler rebuilds the group, and the stream in flight continues on it to its end with the
// same greedy output (recovery_test.cc tests this under load).
TEST(ClusterTest, AKilledWorkerPausesItsRequestsAndTheGroupRecovers) {
  constexpr int kMaxTokens = 16, kLong = 400;
  absl::StatusOr<std::vector<std::vector<int32_t>>> reference =
      ReferenceGreedy(DefaultModel(), {Prompts()[0]}, kLong);
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::unique_ptr<LocalCluster> c =
      StartCluster({.tensor_parallel_size = 2, .restart_workers = true, .restart_delay_s = 3});
  ASSERT_NE(c, nullptr);
  const std::vector<pid_t> workers = c->WorkerPids();
  ASSERT_EQ(workers.size(), 2u);
  HealthChecker health(c->address());

  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto stream = c->stub().Generate(&ctx, GreedyRequest(Prompts()[0], kLong));
  v1::GenerateResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  std::vector<int32_t> tokens(resp.outputs(0).token_ids().begin(),
                              resp.outputs(0).token_ids().end());
  ASSERT_EQ(kill(workers[1], SIGKILL), 0);

  // Down: NOT_SERVING and UNAVAILABLE for new calls until the worker is back (restart_delay_s
  // 3).
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  HealthChecker::Answer h;
  while ((h = health.Check("", absl::Seconds(5))) == HealthChecker::kServing &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(h, HealthChecker::kNotServing);
  GenerateResult refused = Generate(c->stub(), GreedyRequest(Prompts()[0], kMaxTokens));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << refused.status.error_message();
  EXPECT_THAT(refused.status.error_message(), HasSubstr("the worker group is recovering: "));
  EXPECT_THAT(refused.status.error_message(), HasSubstr("worker rank 1 at "));

  // The stream in flight goes on once the group is back: every token once.
  while (stream->Read(&resp)) {
    tokens.insert(tokens.end(), resp.outputs(0).token_ids().begin(),
                  resp.outputs(0).token_ids().end());
  }
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(tokens, (*reference)[0]);

  // Back: SERVING again and the same output as before.
  while (health.Check("", absl::Seconds(5)) != HealthChecker::kServing && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(health.Check("", absl::Seconds(5)), HealthChecker::kServing);
  std::vector<std::vector<int32_t>> want = {
      std::vector<int32_t>((*reference)[0].begin(), (*reference)[0].begin() + kMaxTokens)};
  EXPECT_EQ(GreedyOutputs(*c, {Prompts()[0]}, kMaxTokens), want);
  EXPECT_EQ(c->WorkerPids().size(), 2u);
  ExpectCleanStop(*c);
}

// The scheduler SIGKILLed in mid-generation with restart_scheduler: its client's stream ends
// UNAVAILABLE at once (its connection is gone: a scheduler's requests die with it); llm-cluster
// starts the scheduler again on the same port, it initializes the same worker processes anew,
// and serves the same greedy output.
TEST(ClusterTest, AKilledSchedulerIsRestartedOnItsPortOverTheSameWorkers) {
  constexpr int kMaxTokens = 16, kLong = 400;
  absl::StatusOr<std::vector<std::vector<int32_t>>> reference =
      ReferenceGreedy(DefaultModel(), {Prompts()[0]}, kMaxTokens);
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::unique_ptr<LocalCluster> c = StartCluster({.tensor_parallel_size = 2,
                                                  .restart_workers = true,
                                                  .restart_scheduler = true,
                                                  .restart_delay_s = 0.5});
  ASSERT_NE(c, nullptr);
  const std::vector<pid_t> workers = c->WorkerPids();
  ASSERT_EQ(workers.size(), 2u);
  const pid_t scheduler = c->SchedulerPid();

  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto stream = c->stub().Generate(&ctx, GreedyRequest(Prompts()[0], kLong));
  v1::GenerateResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_EQ(kill(scheduler, SIGKILL), 0);
  while (stream->Read(&resp)) {
  }
  const grpc::Status lost = stream->Finish();
  EXPECT_EQ(lost.error_code(), grpc::StatusCode::UNAVAILABLE) << lost.error_message();

  HealthChecker health(c->address());
  EXPECT_TRUE(WaitUntilServing(health, absl::Seconds(60)));
  EXPECT_NE(c->SchedulerPid(), scheduler);
  EXPECT_EQ(c->WorkerPids(), workers);  // the workers took the new scheduler's Init
  EXPECT_EQ(GreedyOutputs(*c, {Prompts()[0]}, kMaxTokens), *reference);
  ExpectCleanStop(*c);
}

// Without restart_workers a dead worker is fatal: llm-cluster names it, stops the rest and
// exits 1, leaving nothing behind.
TEST(ClusterTest, ADeadWorkerStopsTheClusterByDefault) {
  std::unique_ptr<LocalCluster> c = StartCluster({.tensor_parallel_size = 2});
  ASSERT_NE(c, nullptr);
  std::vector<pid_t> children = c->Children();
  ASSERT_EQ(children.size(), 3u);
  const std::vector<pid_t> workers = c->WorkerPids();
  ASSERT_EQ(workers.size(), 2u);
  ASSERT_EQ(kill(workers[0], SIGKILL), 0);
  std::optional<int> status = c->process().Wait(absl::Seconds(60));
  ASSERT_TRUE(status.has_value()) << "llm-cluster did not exit after a worker died";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1)
      << ChildProcess::DescribeStatus(*status);
  EXPECT_THAT(WaitUntilGone(children, absl::Seconds(30)), ::testing::IsEmpty());
}

// llm-cluster SIGKILLed: its children get SIGTERM from the kernel (PR_SET_PDEATHSIG) and exit.
TEST(ClusterTest, NoProcessOutlivesAKilledLlmCluster) {
  std::unique_ptr<LocalCluster> c = StartCluster({.tensor_parallel_size = 2});
  ASSERT_NE(c, nullptr);
  std::vector<pid_t> children = c->Children();
  ASSERT_EQ(children.size(), 3u);
  c->process().Signal(SIGKILL);
  std::optional<int> status = c->process().Wait(absl::Seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_THAT(WaitUntilGone(children, absl::Seconds(30)), ::testing::IsEmpty());
}

}  // namespace
}  // namespace llm::testing

int main(int argc, char** argv) {
  // The same OpenBLAS kernels as the workers, so the in-process reference matches them.
  llm::cpu::ReexecWithMatchingBlasKernels(argv);
  // Orphans of a killed llm-cluster are adopted (and reaped) here rather than by init, which
  // in a container may never reap them.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
