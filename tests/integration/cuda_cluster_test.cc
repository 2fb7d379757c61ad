// End-to-end tests of `device: cuda` clusters on a machine without a GPU: llm-cluster starts
// its workers from llm-worker-emu (--worker-binary), the worker built against the CUDA
// emulation (kernels/cuda/emu). Each rank is a process with its own emulated devices; at
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

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
// processes (one per rank).
void ExpectEmulatedCudaCluster(LocalCluster& c, int tp) {
  absl::StatusOr<v1::GetModelInfoResponse> info = GetModelInfo(c.stub());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->tensor_parallel_size(), static_cast<uint32_t>(tp));
  EXPECT_GT(info->num_gpu_blocks(), 0u);
  int emu_workers = 0;
  for (const auto& [pid, comm] : ChildrenOf(c.pid())) emu_workers += comm == "llm-worker-emu";
  EXPECT_EQ(emu_workers, tp);
}

// Greedy runs of each prompt, one after another; every one must finish at kMaxTokens.
std::vector<GenerateResult> GreedyRuns(LocalCluster& c, int logprobs = -1) {
  std::vector<GenerateResult> out;
  for (const std::string& p : Prompts()) {
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
    EXPECT_EQ(TokenIds(GreedyRuns(*c)), *reference);
    absl::StatusOr<int> stopped = c->Stop();
    EXPECT_TRUE(stopped.ok()) << stopped.status();
  }
}

// bfloat16 at tensor parallelism 2 against the CPU engine's float32: a greedy pick may flip
// where the reference's top-2 logprobs are closer than bfloat16's error, and after a flip the
// sequences go apart. So each prompt's tokens must equal the reference's up to (not including)
// its first step with a top-2 margin below kMinMargin; and the sampled tokens' logprobs, on the
// steps compared, must be within kMinMargin / 2 of the reference's, which is what makes
// kMinMargin enough (a flip moves the top-2 difference by more than the margin, i.e. one of
// the two logprobs by more than half of it).
TEST_F(CudaClusterTest, Bfloat16AtTp2FollowsTheCpuEngineWhereTheMarginExceedsTheError) {
  constexpr float kMinMargin = 0.03f;
  absl::StatusOr<std::vector<ReferenceOutput>> reference =
      ReferenceGreedyWithMargins(DefaultModel(), Prompts(), kMaxTokens);
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::unique_ptr<LocalCluster> c = StartCluster(CudaEmu(2, "bfloat16"));
  ASSERT_NE(c, nullptr);
  ExpectEmulatedCudaCluster(*c, 2);
  const std::vector<GenerateResult> runs = GreedyRuns(*c, /*logprobs=*/1);
  ASSERT_EQ(runs.size(), Prompts().size());
  int compared = 0, total = 0, prompts_whole = 0;
  float max_error = 0;
  for (size_t i = 0; i < Prompts().size(); ++i) {
    SCOPED_TRACE(Prompts()[i]);
    const ReferenceOutput& ref = (*reference)[i];
    const std::vector<int32_t>& got = runs[i].token_ids.at(0);
    ASSERT_EQ(ref.token_ids.size(), static_cast<size_t>(kMaxTokens));
    ASSERT_EQ(got.size(), static_cast<size_t>(kMaxTokens));
    ASSERT_EQ(runs[i].logprobs.at(0).size(), got.size());
    const size_t close = std::find_if(ref.margins.begin(), ref.margins.end(),
                                      [&](float m) { return m < kMinMargin; }) -
                         ref.margins.begin();
    for (size_t t = 0; t < close; ++t) {
      ASSERT_EQ(got[t], ref.token_ids[t])
          << "token " << t << ", reference margin " << ref.margins[t];
      max_error = std::max(max_error, std::fabs(runs[i].logprobs.at(0)[t] - ref.logprobs[t]));
    }
    compared += static_cast<int>(close);
    total += kMaxTokens;
    prompts_whole += close == ref.margins.size();
    std::printf("bf16 tp2: \"%s\": %zu of %d tokens compared, min margin %.3f%s\n",
                Prompts()[i].c_str(), close, kMaxTokens,
                *std::min_element(ref.margins.begin(), ref.margins.end()),
                got == ref.token_ids ? ", all equal" : "");
  }
  std::printf("bf16 tp2: %d of %d tokens compared; max |logprob - reference| %.4f\n", compared,
              total, max_error);
  EXPECT_LT(max_error, kMinMargin / 2);
  // Not vacuous: most of the output is compared, and some prompts in full.
  EXPECT_GE(compared, total / 2);
  EXPECT_GE(prompts_whole, 2);
  absl::StatusOr<int> stopped = c->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped.status();
}

}  // namespace
}  // namespace llm::testing
