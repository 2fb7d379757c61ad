// The model's logits equal Hugging Face transformers' on the same weights (golden fixtures
// from tools/models/make_golden.py), however the sequence is fed: one prefill, chunks of
// random sizes mixed with other sequences' decode tokens in one batch, over KV blocks
// scattered through a cache poisoned with NaN (a read of an unwritten slot would show).
#include "worker_service/model/llama.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/worker_service/model/model_test_util.h"

namespace llm {
namespace {

class LlamaGoldenTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    // The demo model lives in models/, the tiny test models in tests/data/models/.
    dir_ = std::string(GetParam()) == "fortune-llama"
               ? std::string(LLM_TEST_DATA_DIR) + "/../../models/fortune-llama"
               : std::string(LLM_TEST_DATA_DIR) + "/models/" + GetParam();
    ASSERT_NO_FATAL_FAILURE(LoadTestModel(dir_, &model_));
    golden_ = LoadGolden(dir_, model_->vocab_size());
    ASSERT_EQ(golden_.ids.size(), 4u);
  }
  std::string dir_;
  std::unique_ptr<LlamaModel> model_;
  Golden golden_;
};

TEST_P(LlamaGoldenTest, OnePrefillMatchesTransformers) {
  const double worst = RunAndCompare(*model_, golden_, 16, [](std::mt19937&) { return 1 << 20; });
  RecordProperty("max_relative_error", std::to_string(worst));
}

TEST_P(LlamaGoldenTest, ChunksMixedWithDecodeMatchTransformers) {
  const double worst = RunAndCompare(*model_, golden_, 16, [](std::mt19937& rng) {
    return std::uniform_int_distribution<int>(1, 7)(rng);
  });
  RecordProperty("max_relative_error", std::to_string(worst));
}

TEST_P(LlamaGoldenTest, BlockSizeOneMatchesTransformers) {
  RunAndCompare(*model_, golden_, 1,
                [](std::mt19937& rng) { return std::uniform_int_distribution<int>(1, 3)(rng); });
}

TEST_P(LlamaGoldenTest, GreedyTokensAreTransformers) {
  // The argmax of our logits at each prompt's end and after each greedy token is the token
  // transformers chose.
  const int vocab = model_->vocab_size();
  for (size_t p = 0; p < golden_.ids.size(); ++p) {
    const std::vector<int32_t>& ids = golden_.ids[p];
    Cache cache(*model_, 64, 16);
    std::vector<int32_t> blocks(cache.free.end() - 8, cache.free.end());
    const int n = static_cast<int>(ids.size());
    std::vector<int32_t> positions(n), rows(n);
    std::vector<int64_t> slots(n);
    for (int i = 0; i < n; ++i) {
      positions[i] = rows[i] = i;
      slots[i] = static_cast<int64_t>(blocks[i / 16]) * 16 + i % 16;
    }
    std::vector<int32_t> seq_lens{n}, qsl{0, n};
    ForwardInput in{ids, positions, slots, blocks, 8, seq_lens, qsl, rows};
    HostTensor logits;
    ASSERT_TRUE(model_->Forward(in, cache.layers, &logits).ok());
    for (int i = golden_.prompt_lens[p] - 1; i + 1 < n; ++i) {
      const float* row = logits.data<float>() + static_cast<size_t>(i) * vocab;
      EXPECT_EQ(std::max_element(row, row + vocab) - row, ids[i + 1]) << "prompt " << p;
    }
  }
}

TEST_P(LlamaGoldenTest, BadInputIsAnErrorNotACrash) {
  Cache cache(*model_, 4, 16);
  std::vector<int32_t> ids{model_->vocab_size()}, pos{0}, tables{0}, lens{1}, qsl{0, 1}, rows{0};
  std::vector<int64_t> slots{0};
  HostTensor logits;
  absl::Status s =
      model_->Forward({ids, pos, slots, tables, 1, lens, qsl, rows}, cache.layers, &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("outside the vocabulary"), std::string::npos) << s;
  ids[0] = 1;
  s = model_->Forward({ids, pos, slots, tables, 1, lens, qsl, rows},
                      std::span<const LayerKvCache>(cache.layers).first(1), &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Models, LlamaGoldenTest,
                         ::testing::Values("tiny-llama", "tiny-qwen2", "fortune-llama"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace llm
