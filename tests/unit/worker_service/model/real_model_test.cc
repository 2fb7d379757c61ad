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
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "common/model_config.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "scheduler_service/tokenizer/tokenizer.h"
#include "tests/testing/model_test_util.h"
#include "tests/testing/test_data.h"
#include "worker_service/model/llama.h"

namespace llm {
namespace {

struct RealModel {
  const char* fetch_name;  // tools/models/fetch_model.sh's name
  const char* file;
};

class RealModelGoldenTest : public ::testing::TestWithParam<RealModel> {
 protected:
  void SetUp() override {
    path_ = testing::CachedModelPath(GetParam().file);
    if (!std::filesystem::exists(path_)) {
      GTEST_SKIP() << path_ << " is not there (tools/models/fetch_model.sh "
                   << GetParam().fetch_name << " fetches it)";
    }
    std::ifstream in(std::string(LLM_TEST_DATA_DIR) + "/models/real/" +
                     std::filesystem::path(GetParam().file).stem().string() + ".golden.json");
    ASSERT_TRUE(in) << "no golden file for " << GetParam().file;
    std::stringstream ss;
    ss << in.rdbuf();
    golden_ = nlohmann::json::parse(ss.str());
  }
  std::string path_;
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
  constexpr int kBlockSize = 16, kChunk = 200;
  double worst = 0;
  for (const auto& p : golden_["prompts"]) {
    const std::vector<int32_t> prompt = p["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> greedy = p["greedy"].get<std::vector<int32_t>>();
    std::vector<int32_t> ids = prompt;
    ids.insert(ids.end(), greedy.begin(), greedy.end());
    const int total = static_cast<int>(ids.size());
    const int first_checked = static_cast<int>(prompt.size()) - 1;
    Cache cache(*model, (total + kBlockSize - 1) / kBlockSize, kBlockSize);
    std::vector<int32_t> blocks(cache.free.rbegin(), cache.free.rend());
    for (int done = 0; done < total;) {
      const int n = std::min(kChunk, total - done);
      std::vector<int32_t> tokens(ids.begin() + done, ids.begin() + done + n), positions, rows;
      std::vector<int64_t> slots;
      for (int i = done; i < done + n; ++i) {
        positions.push_back(i);
        slots.push_back(static_cast<int64_t>(blocks[i / kBlockSize]) * kBlockSize + i % kBlockSize);
        if (i >= first_checked) rows.push_back(i - done);
      }
      const int max_blocks = (done + n + kBlockSize - 1) / kBlockSize;
      std::vector<int32_t> table(blocks.begin(), blocks.begin() + max_blocks);
      std::vector<int32_t> seq_lens{done + n}, qsl{0, n};
      ForwardInput in{tokens, positions, slots, table, max_blocks, seq_lens, qsl, rows};
      HostTensor logits;
      ASSERT_TRUE(model->Forward(in, cache.layers, &logits).ok());
      for (size_t r = 0; r < rows.size(); ++r) {
        const int step = done + rows[r] - first_checked;
        const float* row = logits.data<float>() + r * vocab;
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
      done += n;
    }
  }
  RecordProperty("max_relative_error", std::to_string(worst));
  std::printf("worst relative error of the top logits: %.3g\n", worst);
}

INSTANTIATE_TEST_SUITE_P(Models, RealModelGoldenTest,
                         ::testing::Values(RealModel{"gemma3-270m", "gemma-3-270m-q4_k_m.gguf"}),
                         [](const auto& info) {
                           std::string n = info.param.fetch_name;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace llm
