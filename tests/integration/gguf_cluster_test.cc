// llm-cluster / llm-scheduler / llm-worker serving GGUF files (--model file.gguf): the tiny
// F16 GGUF of fortune-llama gives the greedy tokens of its safetensors directory; the real
// SmolLM2-135M-Instruct (Q4_1, tools/models/fetch_smollm2.sh; skipped when not in the cache)
// completes "The capital of France is" with Paris; the real Gemma 3 270M (Q4_K_M, fetch_model.sh
// gemma3-270m) gives transformers' greedy tokens on the same file, at tensor-parallel size 2
// (both with their weights kept as the file's blocks, the default); SmolLM2 served kept quantized
// holds the file's bytes and gives the greedy tokens of the same file served dequantized; the
// tiny mixtures of experts serve from GGUF as from their directories, and from Q8_0 blocks.
//
// Deadlines here are hang guards only; no assertion depends on timing.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/gguf.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_harness.h"
#include "tests/testing/test_data.h"

namespace llm::testing {
namespace {

const std::string kSource = LLM_SOURCE_DIR;

std::string SmolLm2Path() { return CachedModelPath("SmolLM2-135M-Instruct.Q4_1.gguf"); }

class GgufClusterTest : public ::testing::TestWithParam<int> {};

// At tensor-parallel sizes 1 and 2 (each rank dequantizes only its slices).
TEST_P(GgufClusterTest, TinyGgufServesTheSafetensorsTokens) {
  ClusterOptions o;
  o.model = kSource + "/tests/data/models/fortune-llama-f16.gguf";
  o.tensor_parallel_size = GetParam();
  absl::StatusOr<std::unique_ptr<LocalCluster>> c = LocalCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<v1::GetModelInfoResponse> info = GetModelInfo((*c)->stub());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->model_name(), "fortune-llama-f16");

  const std::vector<std::string> prompts = {"Once upon a time", "A fortune: you will"};
  absl::StatusOr<std::vector<std::vector<int32_t>>> want =
      ReferenceGreedy(kSource + "/models/fortune-llama", prompts, 12);
  ASSERT_TRUE(want.ok()) << want.status();
  // The in-process engine (llm-generate's) takes the GGUF too.
  absl::StatusOr<std::vector<std::vector<int32_t>>> local = ReferenceGreedy(o.model, prompts, 12);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*local, *want);
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateResult r = Generate((*c)->stub(), GreedyRequest(prompts[i], 12));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.token_ids[0], (*want)[i]) << prompts[i];
  }
  absl::StatusOr<int> s = (*c)->Stop();
  EXPECT_TRUE(s.ok()) << s.status();
}

INSTANTIATE_TEST_SUITE_P(Tp, GgufClusterTest, ::testing::Values(1, 2));

// The served path runs each family's features: the GGUF conversion of each tiny family model
// (tools/models/make_tiny_gguf.py --families), served at tensor-parallel size 2, gives the greedy
// tokens of the in-process engine on the model's Hugging Face directory (whose logits are
// transformers' within 1e-4: LlamaGoldenTest).
class GgufFamilyClusterTest : public ::testing::TestWithParam<const char*> {};

TEST_P(GgufFamilyClusterTest, ServesTheDirectorysGreedyTokensAtTp2) {
  const std::string dir = kSource + "/tests/data/models/" + GetParam();
  ClusterOptions o;
  o.model = dir + ".gguf";
  o.tensor_parallel_size = 2;
  o.engine = {{"dtype", "float32"}};
  absl::StatusOr<std::unique_ptr<LocalCluster>> c = LocalCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<std::string> prompts = {"Once upon a time",
                                            "A fortune: you will find a long and winding road"};
  absl::StatusOr<std::vector<std::vector<int32_t>>> want = ReferenceGreedy(dir, prompts, 12);
  ASSERT_TRUE(want.ok()) << want.status();
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateResult r = Generate((*c)->stub(), GreedyRequest(prompts[i], 12));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.token_ids[0], (*want)[i]) << prompts[i];
  }
  absl::StatusOr<int> s = (*c)->Stop();
  EXPECT_TRUE(s.ok()) << s.status();
}

INSTANTIATE_TEST_SUITE_P(Families, GgufFamilyClusterTest,
                         ::testing::Values("tiny-qwen3", "tiny-gemma3", "tiny-phi3", "tiny-mixtral",
                                           "tiny-qwen2-moe", "tiny-qwen3-moe"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(GgufRealModelTest, SmolLm2AnswersTheCapitalOfFrance) {
  const std::string path = SmolLm2Path();
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << path << " is not there (tools/models/fetch_smollm2.sh fetches it)";
  }
  ClusterOptions o;
  o.model = path;
  // As `make run` serves it: dtype auto (bf16 GEMM weights and KV cache on CPUs with
  // AVX512_BF16 or AMX, else float32).
  o.engine = {{"max_model_len", "512"}, {"dtype", "auto"}};
  absl::StatusOr<std::unique_ptr<LocalCluster>> c = LocalCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  GenerateResult r = Generate((*c)->stub(), GreedyRequest("The capital of France is", 8, false),
                              absl::Seconds(300));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  RecordProperty("completion", r.text[0]);
  EXPECT_THAT(r.text[0], ::testing::HasSubstr("Paris"));
  absl::StatusOr<int> s = (*c)->Stop();
  EXPECT_TRUE(s.ok()) << s.status();
}

// Gemma 3 (sliding-window layers, q/k norm, GeGLU, sandwich norms, a 262k SentencePiece vocabulary
// with byte fallback) served at tensor-parallel size 2 in float32: the golden prompts of
// tests/data/models/real/ (transformers on the same file) all at once, so that the 711-token one
// is prefilled in chunks beside the others' decodes, twice (the second round from the prefix
// cache); every request's tokens are transformers' greedy tokens.
TEST(GgufRealModelTest, Gemma3ServesTransformersGreedyTokens) {
  const std::string path = CachedModelPath("gemma-3-270m-q4_k_m.gguf");
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << path << " is not there (tools/models/fetch_model.sh gemma3-270m fetches it)";
  }
  std::ifstream in(kSource + "/tests/data/models/real/gemma-3-270m-q4_k_m.golden.json");
  ASSERT_TRUE(in);
  const nlohmann::json golden = nlohmann::json::parse(in);
  ClusterOptions o;
  o.model = path;
  o.tensor_parallel_size = 2;
  o.engine = {{"max_model_len", "1024"},
              {"dtype", "float32"},
              {"max_num_batched_tokens", "256"},
              {"enable_chunked_prefill", "true"},
              {"enable_prefix_caching", "true"}};
  absl::StatusOr<std::unique_ptr<LocalCluster>> c = LocalCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  for (int round = 0; round < 2; ++round) {
    std::vector<GenerateResult> results(golden["prompts"].size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < results.size(); ++i) {
      threads.emplace_back([&, i] {
        const auto& p = golden["prompts"][i];
        results[i] = Generate(
            (*c)->stub(),
            GreedyRequest(p["text"].get<std::string>(), static_cast<int>(p["greedy"].size())),
            absl::Seconds(300));
      });
    }
    for (std::thread& t : threads) t.join();
    for (size_t i = 0; i < results.size(); ++i) {
      ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
      EXPECT_EQ(results[i].token_ids[0], golden["prompts"][i]["greedy"].get<std::vector<int32_t>>())
          << "round " << round << ", prompt " << i;
      EXPECT_EQ(results[i].usage.prompt_tokens(), golden["prompts"][i]["ids"].size());
    }
  }
  absl::StatusOr<v1::GetStatsResponse> stats = GetStats((*c)->stub());
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->prefix_cache_hits(), 700u);  // the second round's long prompt
  absl::StatusOr<int> s = (*c)->Stop();
  EXPECT_TRUE(s.ok()) << s.status();
}

// The worker's rank-0 memory as of a step run now: stats are sampled at most once a second, so
// after a pause one tiny request's step samples them afresh.
v1::WorkerStats::Memory FreshMemory(LocalCluster& c) {
  absl::SleepFor(absl::Milliseconds(1100));
  GenerateResult r = Generate(c.stub(), GreedyRequest("Hi", 1));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  absl::StatusOr<v1::GetStatsResponse> stats = GetStats(c.stub());
  EXPECT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats.ok() && stats->has_worker());
  return stats.ok() ? stats->worker().memory() : v1::WorkerStats::Memory();
}

int64_t VmRssBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// Resident memory is the weights plus the KV blocks in use (issue 36): an idle worker holds
// almost none of its 1 GiB of KV cache; the first round of requests makes resident about the
// blocks it writes; later rounds of the same size reuse those blocks (BlockPool hands freed,
// uncached blocks out first), so memory comes back to the same level after every round; and
// the process stays within 1.1 x (weights + KV resident + activations) + 100 MiB, measured
// from outside (/proc) as well as reported (GetStats). With the cache poisoned (as every other
// test runs) or touched at start the idle and growth checks fail; with freed blocks reused
// last (least recently freed first) the same-level check fails. Served with the weights kept
// as the file's Q4_1 blocks (the default) and dequantized at load.
//
// Which requests share a step depends on when they reach the scheduler, so a round's largest
// step, and with it the activation rows written (reported resident, on cpu), may differ from
// round to round: the same-level check leaves the reported activations out. What it bounds is
// memory no kind accounts for, such as buffers reallocated for a larger step with the old ones
// left resident in malloc's heap (the worker reserves its activations and scratch at Init).
class GgufWorkerMemoryTest : public ::testing::TestWithParam<bool> {};

TEST_P(GgufWorkerMemoryTest, IsItsWeightsPlusTheKvBlocksWritten) {
  const bool quantized = GetParam();
  const std::string path = SmolLm2Path();
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << path << " is not there (tools/models/fetch_smollm2.sh fetches it)";
  }
  // Inherited by llm-cluster's workers; restored for the tests after this one in this process.
  const char* poison = std::getenv("LLM_POISON_KV_CACHE");
  const std::string saved_poison = poison != nullptr ? poison : "";
  setenv("LLM_POISON_KV_CACHE", "0", 1);
  absl::Cleanup restore = [&] {
    if (saved_poison.empty()) {
      unsetenv("LLM_POISON_KV_CACHE");
    } else {
      setenv("LLM_POISON_KV_CACHE", saved_poison.c_str(), 1);
    }
  };
  ClusterOptions o;
  o.model = path;
  // Without prefix caching every round writes new blocks.
  o.engine = {{"max_model_len", "1024"},
              {"dtype", "auto"},
              {"cpu_kv_cache_space", "1"},
              {"enable_prefix_caching", "false"}};
  o.worker = {{"quantized_weights", quantized ? "true" : "false"}};
  absl::StatusOr<std::unique_ptr<LocalCluster>> made = LocalCluster::Start(o);
  ASSERT_TRUE(made.ok()) << made.status();
  LocalCluster& c = **made;
  const std::vector<pid_t> workers = c.WorkerPids();
  ASSERT_EQ(workers.size(), 1u);
  absl::StatusOr<v1::GetModelInfoResponse> info = GetModelInfo(c.stub());
  ASSERT_TRUE(info.ok()) << info.status();

  const int64_t kMiB = 1 << 20;
  auto within_bound = [&](const v1::WorkerStats::Memory& m, const std::string& when) {
    const double bound =
        1.1 * static_cast<double>(m.weights() + m.kv_cache_resident() + m.activations()) +
        100.0 * kMiB;
    const int64_t rss = VmRssBytes(workers[0]);
    EXPECT_LE(static_cast<double>(rss), bound) << when << ": VmRSS " << rss / kMiB << " MiB";
    EXPECT_LE(static_cast<double>(m.resident()), bound) << when;
  };

  const v1::WorkerStats::Memory idle = FreshMemory(c);
  ASSERT_GT(idle.kv_cache_reserved(), 1000 * kMiB);
  // Kept quantized: the file's Q4_1 blocks (96.6 MB); dequantized: 538 MB in f32.
  ASSERT_GT(idle.weights(), (quantized ? 80 : 400) * kMiB);
  ASSERT_LT(idle.weights(), (quantized ? 120 : 600) * kMiB);
  EXPECT_LT(idle.kv_cache_resident(), idle.kv_cache_reserved() / 20);
  EXPECT_EQ(idle.swap_resident(), 0u);  // the harness's swap space, reserved, never used
  within_bound(idle, "idle");
  const double bytes_per_token = static_cast<double>(idle.kv_cache_reserved()) /
                                 (static_cast<double>(info->num_gpu_blocks()) * 16);

  v1::WorkerStats::Memory first;
  for (int round = 0; round < 3; ++round) {
    std::vector<GenerateResult> results(4);
    std::vector<std::thread> threads;
    for (int j = 0; j < 4; ++j) {
      std::string prompt;
      for (int w = 0; w < 30; ++w) absl::StrAppend(&prompt, "r", round, "j", j, "w", w, " ");
      threads.emplace_back([&, j, prompt] {
        results[j] = Generate(c.stub(), GreedyRequest(prompt, 16), absl::Seconds(300));
      });
    }
    for (std::thread& t : threads) t.join();
    int64_t tokens = 0;
    for (const GenerateResult& r : results) {
      ASSERT_TRUE(r.status.ok()) << r.status.error_message();
      tokens += r.usage.prompt_tokens() + r.usage.completion_tokens();
    }
    const v1::WorkerStats::Memory after = FreshMemory(c);
    const std::string when = absl::StrCat("after round ", round, " (", tokens, " tokens)");
    within_bound(after, when);
    if (round == 0) {
      // The blocks written became resident (at least half of their bytes: the last block of a
      // sequence is partly written).
      EXPECT_GE(static_cast<double>(after.kv_cache_resident() - idle.kv_cache_resident()),
                0.5 * bytes_per_token * static_cast<double>(tokens))
          << when;
      first = after;
      continue;
    }
    // The same load again: the same blocks, the same memory (a block of slack per request).
    EXPECT_LE(after.kv_cache_resident(),
              first.kv_cache_resident() + static_cast<uint64_t>(4 * 16 * bytes_per_token))
        << when;
    EXPECT_LE(after.resident() - after.activations(),
              first.resident() - first.activations() + 16 * kMiB)
        << when << ": activations " << first.activations() / kMiB << " -> "
        << after.activations() / kMiB << " MiB";
  }
  absl::StatusOr<int> s = c.Stop();
  EXPECT_TRUE(s.ok()) << s.status();
}

INSTANTIATE_TEST_SUITE_P(Weights, GgufWorkerMemoryTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "KeptQuantized" : "Dequantized";
                         });

// SmolLM2 served with its weights kept as the file's Q4_1 blocks (the default) and dequantized
// (worker quantized_weights: false), float32 otherwise: the worker reports (GetStats) weights of
// the file's tensor bytes kept quantized, over 4x that dequantized, and its resident memory
// (VmRSS) follows. Both complete the prompt greedily with the same tokens up to the first step
// where the dequantized model's top two are closer than the activations' rounding moves the
// logits (kMaxMargin, in logprob, from llama_quantized_test's worst logit error on this model),
// and never diverge before the answer (" Paris." and the line breaks).
TEST(GgufRealModelTest, SmolLm2KeptQuantizedHoldsTheFilesBytes) {
  const std::string path = SmolLm2Path();
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << path << " is not there (tools/models/fetch_smollm2.sh fetches it)";
  }
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  double file_bytes = 0;
  for (const GgufTensorInfo& t : (*file)->tensors()) file_bytes += (*file)->Bytes(t).size();
  struct Served {
    std::vector<int32_t> tokens;
    std::vector<float> margins;
    double weights = 0, rss = 0;
  };
  auto serve = [&](bool quantized) -> Served {
    ClusterOptions o;
    o.model = path;
    o.engine = {{"max_model_len", "512"}, {"dtype", "float32"}};
    o.worker = {{"quantized_weights", quantized ? "true" : "false"}};
    absl::StatusOr<std::unique_ptr<LocalCluster>> c = LocalCluster::Start(o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return {};
    Served out;
    v1::GenerateRequest request = GreedyRequest("The capital of France is", 24);
    request.mutable_sampling_params()->set_logprobs(2);
    GenerateResult r = Generate((*c)->stub(), request, absl::Seconds(300));
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    if (r.status.ok()) out.tokens = r.token_ids[0], out.margins = r.margins[0];
    out.weights = static_cast<double>(FreshMemory(**c).weights());
    out.rss = static_cast<double>(VmRssBytes((*c)->WorkerPids().at(0)));
    absl::StatusOr<int> s = (*c)->Stop();
    EXPECT_TRUE(s.ok()) << s.status();
    return out;
  };
  const Served kept = serve(true), dequantized = serve(false);
  std::printf(
      "file tensors %.1f MB; kept quantized: weights %.1f MB, RSS %.1f MB; dequantized: "
      "weights %.1f MB, RSS %.1f MB\n",
      file_bytes / 1e6, kept.weights / 1e6, kept.rss / 1e6, dequantized.weights / 1e6,
      dequantized.rss / 1e6);
  RecordProperty("rss_kept_quantized_mb", std::to_string(kept.rss / 1e6));
  RecordProperty("rss_dequantized_mb", std::to_string(dequantized.rss / 1e6));
  EXPECT_GT(kept.weights, 0.95 * file_bytes);
  EXPECT_LT(kept.weights, 1.05 * file_bytes);
  EXPECT_GT(dequantized.weights, 4 * kept.weights);
  // The dequantized copy's bytes are not resident either.
  EXPECT_LT(kept.rss + 0.8 * (dequantized.weights - kept.weights), dequantized.rss);
  ASSERT_EQ(kept.tokens.size(), 24u);
  ASSERT_EQ(dequantized.tokens.size(), 24u);
  ASSERT_EQ(dequantized.margins.size(), 24u);
  constexpr float kMaxMargin = 1.0f;
  size_t same = 0;
  while (same < 24 && kept.tokens[same] == dequantized.tokens[same]) ++same;
  std::printf("greedy tokens equal for %zu of 24; the dequantized model's top-2 margin there: %g\n",
              same, same < 24 ? dequantized.margins[same] : 0.0f);
  RecordProperty("equal_greedy_tokens", std::to_string(same));
  EXPECT_GE(same, 5u);  // " Paris.\n\n" and the next word
  if (same < 24) EXPECT_LT(dequantized.margins[same], kMaxMargin);
}

// A mixture of experts served from its GGUF's Q8_0 blocks (tiny-mixtral-q8_0.gguf, the worker's
// default): the worker reports weights of less than half the same model's F32 file (the experts
// are held as blocks, not dequantized), and the greedy tokens are the in-process engine's on the
// same file, whose kept-quantized logits gguf_model_test holds to the dequantized model's.
TEST(GgufClusterTest, MixtureOfExpertsServedFromTheFilesBlocks) {
  const std::string models = kSource + "/tests/data/models/";
  ClusterOptions o;
  o.model = models + "tiny-mixtral-q8_0.gguf";
  o.engine = {{"dtype", "float32"}};
  absl::StatusOr<std::unique_ptr<LocalCluster>> c = LocalCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<std::string> prompts = {"Once upon a time",
                                            "A fortune: you will find a long and winding road"};
  absl::StatusOr<std::vector<std::vector<int32_t>>> want = ReferenceGreedy(o.model, prompts, 12);
  ASSERT_TRUE(want.ok()) << want.status();
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateResult r = Generate((*c)->stub(), GreedyRequest(prompts[i], 12));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.token_ids[0], (*want)[i]) << prompts[i];
  }
  const double f32_file =
      static_cast<double>(std::filesystem::file_size(models + "tiny-mixtral.gguf"));
  const double weights = static_cast<double>(FreshMemory(**c).weights());
  EXPECT_GT(weights, 0);
  EXPECT_LT(weights, f32_file / 2);
  absl::StatusOr<int> s = (*c)->Stop();
  EXPECT_TRUE(s.ok()) << s.status();
}

}  // namespace
}  // namespace llm::testing
