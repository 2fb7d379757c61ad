// llm-cluster / llm-scheduler / llm-worker serving GGUF files (--model file.gguf): the tiny
// F16 GGUF of fortune-llama gives the greedy tokens of its safetensors directory; the real
// SmolLM2-135M-Instruct (Q4_1, tools/models/fetch_smollm2.sh; skipped when not in the cache)
// completes "The capital of France is" with Paris.
//
// Deadlines here are hang guards only; no assertion depends on timing.
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace llm::testing {
namespace {

const std::string kSource = LLM_SOURCE_DIR;

std::string SmolLm2Path() {
  const char* env = std::getenv("LLM_MODELS_CACHE");
  const char* home = std::getenv("HOME");
  const std::string dir = env != nullptr    ? env
                          : home != nullptr ? std::string(home) + "/.cache/llm-models"
                                            : "";
  return dir + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

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

}  // namespace
}  // namespace llm::testing
