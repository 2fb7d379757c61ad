// Real GGUF files served with their linear weights kept as the file's blocks (ModelOptions::
// quantized_weights, the default for GGUF on cpu) against the same files dequantized at load
// (quantized_weights = false, which RealModelGoldenTest holds to transformers):
//   - the weights held are the file's bytes, not a dequantized copy;
//   - greedy decoding of 12 tokens after each prompt (prefill in chunks of up to 200 tokens,
//     which take both the integer and the dequantized-tile paths, then one token per step) gives
//     the dequantized model's tokens, and the logits stay within a bound of its logits. The only
//     difference is the activations' rounding to 8 bits per 32 values inside each quantized
//     GEMM; the bound is the largest error observed with margin (docs/performance/results.md,
//     "Quantized GEMMs"). A token may differ only where the dequantized model's top two logits
//     are closer than the two models' logits differ.
// The model files come from tools/models/fetch_model.sh; a missing file skips its test.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "common/model_config.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/model_test_util.h"
#include "tests/testing/real_model_file_test.h"
#include "worker_service/model/llama.h"

namespace llm {
namespace {

struct RealModel {
  const char* fetch_name;  // tools/models/fetch_model.sh's name
  const char* file;
  // The largest relative logit error (max |quantized - dequantized| / max |dequantized| per
  // row) allowed.
  double bound;
};

int Argmax(const std::vector<float>& row) {
  return static_cast<int>(std::max_element(row.begin(), row.end()) - row.begin());
}

class QuantizedGgufTest : public testing::RealModelFileTest<RealModel> {
 protected:
  void SetUp() override {
    RealModelFileTest::SetUp();
    if (IsSkipped()) return;
    ModelOptions dequantized;
    dequantized.dtype = DType::kF32;
    dequantized.quantized_weights = false;
    ASSERT_NO_FATAL_FAILURE(LoadTestModel(path_, &dequantized_, dequantized));
    ModelOptions quantized = dequantized;
    quantized.quantized_weights = true;
    ASSERT_NO_FATAL_FAILURE(LoadTestModel(path_, &quantized_, quantized));
  }
  std::unique_ptr<LlamaModel> dequantized_, quantized_;
};

TEST_P(QuantizedGgufTest, HoldsTheFilesBlocks) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path_);
  ASSERT_TRUE(file.ok()) << file.status();
  size_t file_bytes = 0;
  for (const GgufTensorInfo& t : (*file)->tensors()) file_bytes += (*file)->Bytes(t).size();
  const double held = static_cast<double>(quantized_->weight_bytes());
  std::printf(
      "%s: tensors %.1f MB in the file; held %.1f MB (%.1f MB as blocks), dequantized "
      "%.1f MB\n",
      GetParam().file, file_bytes / 1e6, held / 1e6, quantized_->quantized_weight_bytes() / 1e6,
      dequantized_->weight_bytes() / 1e6);
  EXPECT_EQ(dequantized_->quantized_weight_bytes(), 0u);
  // Every GEMM and the embedding table are blocks: the weights held are the file's tensors (the
  // norms, and zero rows padding the vocabulary, aside).
  EXPECT_GT(static_cast<double>(quantized_->quantized_weight_bytes()), 0.95 * file_bytes);
  EXPECT_LT(held, 1.05 * file_bytes);
  EXPECT_LT(held * 4, static_cast<double>(dequantized_->weight_bytes()));
}

TEST_P(QuantizedGgufTest, GreedyTokensAreTheDequantizedModels) {
  const nlohmann::json golden = testing::ReadRealGolden("gemma-3-270m-q4_k_m.gguf");
  ASSERT_FALSE(golden.is_null());
  constexpr int kSteps = 12;  // per prompt: 48 greedy steps in all, each on both models
  double worst = 0;
  int differing = 0, compared = 0;
  for (const auto& p : golden["prompts"]) {
    // Gemma's token ids; within SmolLM2's vocabulary they are just other token sequences.
    std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
    for (int32_t& id : ids) id %= quantized_->vocab_size();
    const int prompt_len = static_cast<int>(ids.size());
    // The dequantized model decodes greedily; the quantized one is fed the same tokens.
    ChunkedSequence dequantized(*dequantized_, prompt_len + kSteps),
        quantized(*quantized_, prompt_len + kSteps);
    std::vector<float> w = dequantized.Feed(ids), g = quantized.Feed(ids);
    for (int step = 0; step < kSteps; ++step) {
      ASSERT_EQ(w.size(), g.size());
      ASSERT_FALSE(w.empty());
      double diff = 0, scale = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        ASSERT_FALSE(std::isnan(g[i]));
        diff = std::max(diff, static_cast<double>(std::fabs(g[i] - w[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(w[i])));
      }
      worst = std::max(worst, diff / scale);
      EXPECT_LT(diff / scale, GetParam().bound) << "prompt of " << prompt_len << " step " << step;
      ++compared;
      const int want_token = Argmax(w);
      ids.push_back(want_token);
      const int got_token = Argmax(g);
      if (got_token != want_token) {
        ++differing;
        // Only where the dequantized model's top two are within the two models' difference.
        std::vector<float> sorted = w;
        std::nth_element(sorted.begin(), sorted.begin() + 1, sorted.end(), std::greater<float>());
        EXPECT_LT(sorted[0] - sorted[1], 2 * diff)
            << "greedy step " << step << " after a prompt of " << prompt_len << ": token "
            << got_token << " instead of " << want_token;
      }
      w = dequantized.Feed({want_token});
      g = quantized.Feed({want_token});
    }
  }
  std::printf("%s: worst relative logit error %.3g; %d of %d greedy tokens differ\n",
              GetParam().file, worst, differing, compared);
  RecordProperty("max_relative_error", std::to_string(worst));
  RecordProperty("differing_tokens", std::to_string(differing));
}

INSTANTIATE_TEST_SUITE_P(
    Models, QuantizedGgufTest,
    ::testing::Values(RealModel{"smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", 0.1},
                      RealModel{"gemma3-270m", "gemma-3-270m-q4_k_m.gguf", 0.1}),
    testing::FetchNameOfParam());

}  // namespace
}  // namespace llm
