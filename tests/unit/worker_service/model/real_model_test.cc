// Real GGUF files against Hugging Face transformers on the same file: transformers loads the
// GGUF itself (dequantized to float32, eager attention; tools/models/make_real_golden.py wrote
// what it answered into tests/data/models/real/). Our tokenizer must give its token ids; our
// float32 logits its top logits at the last prompt position and at every greedy step, and
// argmax its greedy tokens, with the prompts fed in chunks over a NaN-poisoned paged cache.
// One prompt is longer than Gemma 3's sliding window (512), so that the local layers' window
// is crossed inside a chunk and across chunks.
//
// The model files come from tools/models/fetch_model.sh, which `make test` runs first; a file
// that is not in the cache skips its test, naming the path and the command.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "common/model_config.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "scheduler_service/tokenizer/tokenizer.h"
#include "tests/testing/model_test_util.h"
#include "tests/testing/real_model_file_test.h"
#include "worker_service/model/llama.h"

namespace llm {
namespace {

struct RealModel {
  const char* fetch_name;  // tools/models/fetch_model.sh's name
  const char* file;
};

class RealModelGoldenTest : public testing::RealModelFileTest<RealModel> {
 protected:
  void SetUp() override {
    RealModelFileTest::SetUp();
    if (IsSkipped()) return;
    golden_ = testing::ReadRealGolden(GetParam().file);
    ASSERT_FALSE(golden_.is_null());
  }
  nlohmann::json golden_;
};

TEST_P(RealModelGoldenTest, TokenizerGivesTransformersIds) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path_);
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  for (const auto& p : golden_["prompts"]) {
    const std::vector<int32_t> want = p["ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> got;
    for (TokenId id : (*tok)->Encode(p["text"].get<std::string>())) got.push_back(id);
    EXPECT_EQ(got, want) << p["text"];
  }
}

TEST_P(RealModelGoldenTest, LogitsAndGreedyTokensAreTransformers) {
  std::unique_ptr<LlamaModel> model;
  ModelOptions options;
  options.dtype = DType::kF32;
  // Dequantized at load, as transformers reads the file (the blocks kept as they are are held to
  // this model by llama_quantized_test).
  options.quantized_weights = false;
  ASSERT_NO_FATAL_FAILURE(LoadTestModel(path_, &model, options));
  const int vocab = model->vocab_size();
  double worst = 0;
  for (const auto& p : golden_["prompts"]) {
    const std::vector<int32_t> prompt = p["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> greedy = p["greedy"].get<std::vector<int32_t>>();
    std::vector<int32_t> ids = prompt;
    ids.insert(ids.end(), greedy.begin(), greedy.end());
    // The logits of the last prompt position and of each greedy step: one row a step.
    const int first_checked = static_cast<int>(prompt.size()) - 1;
    const std::vector<float> logits =
        ChunkedSequence(*model, static_cast<int>(ids.size())).Feed(ids, first_checked);
    ASSERT_EQ(logits.size(), (ids.size() - first_checked) * vocab);
    for (int step = 0; step < static_cast<int>(ids.size()) - first_checked; ++step) {
      const float* row = logits.data() + static_cast<size_t>(step) * vocab;
      const auto& top = p["top"][step];
      double scale = 0;
      for (const auto& e : top) scale = std::max(scale, std::fabs(e[1].get<double>()));
      for (const auto& e : top) {
        const double err = std::fabs(row[e[0].get<int>()] - e[1].get<double>()) / scale;
        worst = std::max(worst, err);
        EXPECT_LT(err, 2e-3) << "position " << first_checked + step << " token " << e[0];
      }
      const int argmax = static_cast<int>(std::max_element(row, row + vocab) - row);
      if (step < static_cast<int>(greedy.size())) {
        EXPECT_EQ(argmax, greedy[step]) << "greedy step " << step << " of " << p["text"];
      }
    }
  }
  RecordProperty("max_relative_error", std::to_string(worst));
  std::printf("worst relative error of the top logits: %.3g\n", worst);
}

INSTANTIATE_TEST_SUITE_P(Models, RealModelGoldenTest,
                         ::testing::Values(RealModel{"gemma3-270m", "gemma-3-270m-q4_k_m.gguf"}),
                         testing::FetchNameOfParam());

}  // namespace
}  // namespace llm
