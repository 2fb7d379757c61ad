// End-to-end tests of `device: cuda` clusters on a machine without a GPU: llm-cluster starts
// its workers from llm-worker-emu (--worker-binary), the worker built against the CUDA
// emulation (cuda_emu). Each rank is a process with its own emulated devices; at
// tensor parallelism 2 the ranks form an NCCL group (the emulated NCCL, through /dev/shm) from
// rank 0's unique id passed through the scheduler's rendezvous store. The workers profile
// memory and size the KV cache from gpu_memory_utilization as on a GPU.
//
// The emulated device has LLM_CUDA_EMU_MEMORY_BYTES = 128 MiB (set before any cluster starts;
// the workers inherit it): the default (80 GiB) would make a KV cache of gigabytes, and the
// emulation's per-launch cost grows with the device memory in use.
//
// Deadlines are hang guards only; no assertion depends on timing.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/cluster_harness.h"

namespace llm::testing {
namespace {

constexpr int kMaxTokens = 8;  // the emulated kernels are slow: short generations

const std::vector<std::string>& Prompts() {
  static const auto* p = new std::vector<std::string>{
      "Once upon a time",
      "The best programmers write code that",
      "A fortune: you will travel far, and",
      "In a land far away there lived",
      "The weather today is",
      "My favourite number is",
      "She opened the door and saw",
      "Tomorrow we will",
      "The cat sat on the",
      "Every morning the old man",
  };
  return *p;
}

class CudaClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { setenv("LLM_CUDA_EMU_MEMORY_BYTES", "134217728", 1); }
};

ClusterOptions CudaEmu(int tp, const std::string& dtype) {
  return {.tensor_parallel_size = tp,
          .device = "cuda",
          .worker_binary = "llm-worker-emu",
          .engine = {{"dtype", dtype},
                     {"gpu_memory_utilization", "0.5"},
                     {"max_model_len", "128"},
                     {"max_num_batched_tokens", "128"},
                     {"max_num_seqs", "4"}}};
}

std::unique_ptr<LocalCluster> StartCluster(const ClusterOptions& options) {
  absl::StatusOr<std::unique_ptr<LocalCluster>> c = LocalCluster::Start(options);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

// The cluster serves the model at `tp` ranks with a profiled KV cache, from llm-worker-emu
// processes (one per rank, rank r on emulated GPU r).
void ExpectEmulatedCudaCluster(LocalCluster& c, int tp) {
  absl::StatusOr<v1::GetModelInfoResponse> info = GetModelInfo(c.stub());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->tensor_parallel_size(), static_cast<uint32_t>(tp));
  EXPECT_GT(info->num_gpu_blocks(), 0u);
  // One llm-worker-emu per rank, rank r with --device=cuda:r.
  std::vector<std::string> devices;
  for (const auto& [pid, comm] : ChildrenOf(c.pid())) {
    if (comm != "llm-worker-emu") continue;
    std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"));
    std::string arg;
    while (std::getline(in, arg, '\0')) {
      if (arg.rfind("--device=", 0) == 0) devices.push_back(arg.substr(9));
    }
  }
  std::sort(devices.begin(), devices.end());
  std::vector<std::string> expected;
  for (int r = 0; r < tp; ++r) expected.push_back(absl::StrCat("cuda:", r));
  EXPECT_EQ(devices, expected);
}

// What the workers served with, from rank 0's own counters (GetStats' worker, which the
// scheduler keeps from the step results): every step sampled on the device, and with `graphs`
// decode steps replayed captured CUDA graphs; without, none did. The scheduler planned its
// steps with the one before in flight (asynchronous scheduling, llm-scheduler's default).
void ExpectServedOnTheDevice(LocalCluster& c, bool graphs) {
  absl::StatusOr<v1::GetStatsResponse> stats = GetStats(c.stub());
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->num_steps_planned_ahead(), stats->num_steps() / 2);
  ASSERT_TRUE(stats->has_worker());
  const v1::WorkerStats& w = stats->worker();
  std::printf("worker stats: %s\n", w.ShortDebugString().c_str());
  EXPECT_EQ(w.sampler(), v1::WorkerStats::SAMPLER_KIND_DEVICE);
  EXPECT_GT(w.steps(), 0u);
  EXPECT_GT(w.device_sampled_steps(), 0u);
  EXPECT_EQ(w.host_sampled_steps(), 0u);
  EXPECT_EQ(w.cuda_graphs_enabled(), graphs);
  if (graphs) {
    // kMaxTokens - 1 decode steps per greedy run replay a graph; the prefills run eagerly.
    EXPECT_GT(w.graphs_captured(), 0u);
    EXPECT_GT(w.graph_steps(), 0u);
    EXPECT_LT(w.graph_steps(), w.steps());
  } else {
    EXPECT_EQ(w.graphs_captured(), 0u);
    EXPECT_EQ(w.graph_steps(), 0u);
  }
  // cuBLASLt plans made once per shape, then found (a graph replay calls no Linear: its
  // launches were recorded at capture).
  EXPECT_GT(w.linear_plans(), 0u);
  EXPECT_GT(w.linear_plan_hits(), w.linear_plan_misses());
}

// Greedy runs of each prompt, one after another; every one must finish at kMaxTokens.
std::vector<GenerateResult> GreedyRuns(LocalCluster& c, const std::vector<std::string>& prompts,
                                       int logprobs = -1) {
  std::vector<GenerateResult> out;
  for (const std::string& p : prompts) {
    v1::GenerateRequest req = GreedyRequest(p, kMaxTokens);
    if (logprobs >= 0) req.mutable_sampling_params()->set_logprobs(logprobs);
    GenerateResult r = Generate(c.stub(), req);
    EXPECT_TRUE(r.status.ok()) << p << ": " << r.status.error_message();
    EXPECT_EQ(r.finish_reason[0], v1::FINISH_REASON_LENGTH) << p;
    EXPECT_EQ(r.token_ids[0].size(), static_cast<size_t>(kMaxTokens)) << p;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<std::vector<int32_t>> TokenIds(const std::vector<GenerateResult>& runs) {
  std::vector<std::vector<int32_t>> out;
  for (const GenerateResult& r : runs) out.push_back(r.token_ids.at(0));
  return out;
}

// float32 on the (emulated) GPU at tensor parallelism 1 and 2 picks exactly the CPU engine's
// greedy tokens.
TEST_F(CudaClusterTest, Float32AtTp1AndTp2EqualsTheCpuEngine) {
  absl::StatusOr<std::vector<std::vector<int32_t>>> reference =
      ReferenceGreedy(DefaultModel(), Prompts(), kMaxTokens);
  ASSERT_TRUE(reference.ok()) << reference.status();
  for (int tp : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("tensor_parallel_size ", tp));
    std::unique_ptr<LocalCluster> c = StartCluster(CudaEmu(tp, "float32"));
    ASSERT_NE(c, nullptr);
    ExpectEmulatedCudaCluster(*c, tp);
    EXPECT_EQ(TokenIds(GreedyRuns(*c, Prompts())), *reference);
    // The emulated NCCL cannot be captured: graphs at one rank only (a GPU captures both).
    ExpectServedOnTheDevice(*c, /*graphs=*/tp == 1);
    absl::StatusOr<int> stopped = c->Stop();
    EXPECT_TRUE(stopped.ok()) << stopped.status();
  }
}

// The device's attention never reads the blocks a sliding window gave back: tiny-phi3
// (every layer attends to the last 24 positions) with blocks of 8 in a pool of 16, four
// streams of 40 tokens at once, so that the blocks each sequence gives back are written by the
// others while their stale ids stay in its table on the worker (the KV cache poisoned, as in
// every test). The tokens are the CPU engine's, which holds every block to the end.
TEST_F(CudaClusterTest, BlocksASlidingWindowGaveBackAreNeverReadOnTheDevice) {
  constexpr int kLong = 40;
  const std::string dir = std::string(LLM_TEST_DATA_DIR) + "/models/tiny-phi3";
  const std::vector<std::string> prompts(Prompts().begin(), Prompts().begin() + 4);
  absl::StatusOr<std::vector<std::vector<int32_t>>> reference =
      ReferenceGreedy(dir, prompts, kLong);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ClusterOptions o = CudaEmu(1, "float32");
  o.model = dir;
  o.engine.insert(o.engine.end(),
                  {{"block_size", "8"}, {"num_gpu_blocks_override", "16"}, {"watermark", "0"}});
  std::unique_ptr<LocalCluster> c = StartCluster(o);
  ASSERT_NE(c, nullptr);
  std::vector<GenerateResult> runs(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back(
        [&, i] { runs[i] = Generate(c->stub(), GreedyRequest(prompts[i], kLong)); });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(runs[i].status.ok()) << prompts[i] << ": " << runs[i].status.error_message();
    EXPECT_EQ(runs[i].token_ids[0], (*reference)[i]) << prompts[i];
  }
  absl::StatusOr<v1::GetStatsResponse> stats = WaitUntilAllBlocksFree(c->stub(), absl::Seconds(30));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GE(stats->num_window_released_blocks(), 8u);
  absl::StatusOr<int> stopped = c->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped.status();
}

// bfloat16 against the CPU engine's float32: a greedy pick may flip where the reference's
// top-2 logprobs are closer than bfloat16's error, and after a flip the sequences go apart. So
// each prompt's tokens must equal the reference's up to (not including) its first step with a
// top-2 margin below kMinMargin; and the sampled tokens' logprobs, on the steps compared, must
// be within kMinMargin / 2 of the reference's, which is what makes kMinMargin enough (a flip
// moves the top-2 difference by more than the margin, i.e. one of the two logprobs by more
// than half of it).
constexpr float kMinMargin = 0.03f;

struct Comparison {
  int compared = 0;       // tokens compared (before each prompt's first close step)
  int total = 0;          // tokens generated
  int prompts_whole = 0;  // prompts compared in full
  float max_error = 0;    // max |logprob - reference logprob| over the tokens compared
};

Comparison CompareWhereTheMarginExceedsTheError(const std::string& label,
                                                const std::vector<std::string>& prompts,
                                                const std::vector<ReferenceOutput>& reference,
                                                const std::vector<GenerateResult>& runs) {
  Comparison c;
  EXPECT_EQ(reference.size(), prompts.size());
  EXPECT_EQ(runs.size(), prompts.size());
  for (size_t i = 0; i < prompts.size() && i < reference.size() && i < runs.size(); ++i) {
    SCOPED_TRACE(prompts[i]);
    const ReferenceOutput& ref = reference[i];
    if (runs[i].token_ids.count(0) == 0 || runs[i].logprobs.count(0) == 0) {
      ADD_FAILURE() << "no output with logprobs";
      continue;
    }
    const std::vector<int32_t>& got = runs[i].token_ids.at(0);
    const std::vector<float>& logprobs = runs[i].logprobs.at(0);
    EXPECT_EQ(got.size(), ref.token_ids.size());
    EXPECT_EQ(logprobs.size(), got.size());
    const size_t close = std::find_if(ref.margins.begin(), ref.margins.end(),
                                      [&](float m) { return m < kMinMargin; }) -
                         ref.margins.begin();
    for (size_t t = 0; t < close && t < got.size() && t < logprobs.size(); ++t) {
      EXPECT_EQ(got[t], ref.token_ids[t])
          << "token " << t << ", reference margin " << ref.margins[t];
      if (got[t] != ref.token_ids[t]) break;
      c.max_error = std::max(c.max_error, std::fabs(logprobs[t] - ref.logprobs[t]));
    }
    c.compared += static_cast<int>(close);
    c.total += static_cast<int>(ref.token_ids.size());
    c.prompts_whole += close == ref.margins.size();
    std::printf("%s: \"%s\": %zu of %zu tokens compared, min margin %.3f%s\n", label.c_str(),
                prompts[i].c_str(), close, ref.token_ids.size(),
                *std::min_element(ref.margins.begin(), ref.margins.end()),
                got == ref.token_ids ? ", all equal" : "");
  }
  std::printf("%s: %d of %d tokens compared; max |logprob - reference| %.4f\n", label.c_str(),
              c.compared, c.total, c.max_error);
  EXPECT_LT(c.max_error, kMinMargin / 2);
  return c;
}

// enforce_eager (vLLM's --enforce-eager) reaches the worker: no graph is captured or replayed,
// and the tokens are the same.
TEST_F(CudaClusterTest, EnforceEagerRunsEveryStepEagerlyWithTheSameTokens) {
  const std::vector<std::string> prompts(Prompts().begin(), Prompts().begin() + 3);
  absl::StatusOr<std::vector<std::vector<int32_t>>> reference =
      ReferenceGreedy(DefaultModel(), prompts, kMaxTokens);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ClusterOptions options = CudaEmu(1, "float32");
  options.engine.emplace_back("enforce_eager", "true");
  std::unique_ptr<LocalCluster> c = StartCluster(options);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(TokenIds(GreedyRuns(*c, prompts)), *reference);
  ExpectServedOnTheDevice(*c, /*graphs=*/false);
  absl::StatusOr<int> stopped = c->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped.status();
}

TEST_F(CudaClusterTest, Bfloat16AtTp2FollowsTheCpuEngineWhereTheMarginExceedsTheError) {
  absl::StatusOr<std::vector<ReferenceOutput>> reference =
      ReferenceGreedyWithMargins(DefaultModel(), Prompts(), kMaxTokens);
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::unique_ptr<LocalCluster> c = StartCluster(CudaEmu(2, "bfloat16"));
  ASSERT_NE(c, nullptr);
  ExpectEmulatedCudaCluster(*c, 2);
  const Comparison cmp = CompareWhereTheMarginExceedsTheError(
      "bf16 tp2", Prompts(), *reference, GreedyRuns(*c, Prompts(), /*logprobs=*/1));
  // Not vacuous: most of the output is compared, and some prompts in full (the tiny test
  // model's logits are nearly flat: several of its top-2 margins are below 0.01).
  EXPECT_GE(cmp.compared, cmp.total / 2);
  EXPECT_GE(cmp.prompts_whole, 2);
  absl::StatusOr<int> stopped = c->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped.status();
}

// deploy/local/tp1-cuda.yaml and tp2-cuda.yaml as committed (bfloat16, the demo model), with
// --worker-binary=llm-worker-emu, serve Generate.
TEST_F(CudaClusterTest, TheCommittedCudaManifestsServeGenerateOnTheEmulation) {
  // Their model paths are relative to the repository root.
  ASSERT_EQ(chdir(LLM_SOURCE_DIR), 0);
  const std::vector<std::string> prompts = {"Once upon a time"};
  absl::StatusOr<std::vector<ReferenceOutput>> reference =
      ReferenceGreedyWithMargins("models/fortune-llama", prompts, kMaxTokens);
  ASSERT_TRUE(reference.ok()) << reference.status();
  for (const char* name : {"tp1-cuda.yaml", "tp2-cuda.yaml"}) {
    SCOPED_TRACE(name);
    std::unique_ptr<LocalCluster> c = StartCluster(
        {.worker_binary = "llm-worker-emu", .manifest = std::string("deploy/local/") + name});
    ASSERT_NE(c, nullptr);
    ExpectEmulatedCudaCluster(*c, name[2] - '0');
    absl::StatusOr<v1::GetModelInfoResponse> info = GetModelInfo(c->stub());
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->model_name(), "fortune-llama");
    const Comparison cmp = CompareWhereTheMarginExceedsTheError(
        name, prompts, *reference, GreedyRuns(*c, prompts, /*logprobs=*/1));
    EXPECT_GT(cmp.compared, 0);
    absl::StatusOr<int> stopped = c->Stop();
    EXPECT_TRUE(stopped.ok()) << stopped.status();
  }
}

}  // namespace
}  // namespace llm::testing
