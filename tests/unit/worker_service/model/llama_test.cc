// The model's logits equal Hugging Face transformers' on the same weights (golden fixtures
// from tools/models/make_golden.py), however the sequence is fed: one prefill, chunks of
// random sizes mixed with other sequences' decode tokens in one batch, over KV blocks
// scattered through a cache poisoned with NaN (a read of an unwritten slot would show).
// LlamaGoldenTest runs the model in float32 (explicitly: the CPU's default dtype is bf16 where
// the CPU has AVX512_BF16), within 1e-4 of transformers' fp32 logits, greedy tokens equal.
// LlamaBf16GoldenTest runs it with bf16 GEMM weights (fp32 elsewhere) against the same fp32
// goldens, at the tolerances stated there.
#include "worker_service/model/llama.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/packed_linear.h"
#include "tests/testing/model_test_util.h"

namespace llm {
namespace {

class LlamaGoldenTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    // The demo model lives in models/, the tiny test models in tests/data/models/; a GGUF
    // conversion (tools/models/make_tiny_gguf.py --families) beside its directory is checked
    // against that directory's goldens.
    const std::string name = GetParam();
    dir_ = name == "fortune-llama" ? std::string(LLM_TEST_DATA_DIR) + "/../../models/fortune-llama"
                                   : std::string(LLM_TEST_DATA_DIR) + "/models/" + name;
    const std::string golden_dir = name.ends_with(".gguf") ? dir_.substr(0, dir_.size() - 5) : dir_;
    ModelOptions options;
    options.dtype = DType::kF32;
    ASSERT_NO_FATAL_FAILURE(LoadTestModel(dir_, &model_, options));
    golden_ = LoadGolden(golden_dir, model_->vocab_size());
    ASSERT_EQ(golden_.ids.size(), 4u);
  }
  std::string dir_;
  std::unique_ptr<LlamaModel> model_;
  Golden golden_;
};

std::string ModelDir(const std::string& name) {
  return name == "fortune-llama" ? std::string(LLM_TEST_DATA_DIR) + "/../../models/fortune-llama"
                                 : std::string(LLM_TEST_DATA_DIR) + "/models/" + name;
}

// A test's name for a model: its directory or file name, '-' and '.' as '_'.
std::string ModelTestName(const ::testing::TestParamInfo<const char*>& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  std::replace(n.begin(), n.end(), '.', '_');
  return n;
}

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
                         ::testing::Values("tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma2",
                                           "tiny-gemma3", "tiny-phi3", "fortune-llama",
                                           "tiny-llama.gguf", "tiny-qwen2.gguf", "tiny-qwen3.gguf",
                                           "tiny-gemma3.gguf", "tiny-phi3.gguf", "tiny-mixtral",
                                           "tiny-qwen2-moe", "tiny-qwen3-moe", "tiny-mixtral.gguf",
                                           "tiny-qwen2-moe.gguf", "tiny-qwen3-moe.gguf",
                                           "tiny-olmoe", "tiny-olmoe.gguf"),
                         ModelTestName);

// bf16 GEMM weights on the CPU (x rounded to bf16 at each GEMM, fp32 accumulation; norms,
// rotary, softmax and attention fp32, the KV cache fp32 or bf16) against transformers' fp32
// logits. bf16
// keeps 8 significant bits (relative rounding error up to 2^-9 per weight and input), so logits
// move by about 1% of their scale: each row's RowError (max |diff| / max |golden|) must stay
// under kBf16RowTolerance, and greedy tokens must be transformers' wherever its top-1 leads its
// top-2 by more than kSafeMargin of the row's scale (at least a quarter of the positions here).
constexpr double kBf16RowTolerance = 3e-2;
constexpr double kSafeMargin = 0.1;

// RunAndCompare over a bf16 KV cache, chunks of 1 to 7 tokens mixed with decode tokens, at the
// bf16 tolerance; the worst row error.
double ChunksOverABf16Cache(LlamaModel& model, const Golden& golden) {
  std::vector<float> logits;
  return RunAndCompare(
      model, golden, 16,
      [](std::mt19937& rng) { return std::uniform_int_distribution<int>(1, 7)(rng); }, &logits,
      kBf16RowTolerance, DType::kBF16);
}

class LlamaBf16GoldenTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!cpu::CpuHasNativeBf16()) GTEST_SKIP() << "this CPU has neither AVX512_BF16 nor AMX";
    dir_ = ModelDir(GetParam());
    ModelOptions options;
    options.dtype = DType::kBF16;
    ASSERT_NO_FATAL_FAILURE(LoadTestModel(dir_, &model_, options));
    ASSERT_EQ(model_->dtype(), DType::kBF16);
    golden_ = LoadGolden(dir_, model_->vocab_size());
    ASSERT_EQ(golden_.ids.size(), 4u);
  }
  std::string dir_;
  std::unique_ptr<LlamaModel> model_;
  Golden golden_;
};

TEST_P(LlamaBf16GoldenTest, LogitsAreTransformersWithinBf16Tolerance) {
  std::vector<float> bf16_logits;
  const double worst = RunAndCompare(
      *model_, golden_, 16,
      [](std::mt19937& rng) { return std::uniform_int_distribution<int>(1, 7)(rng); }, &bf16_logits,
      kBf16RowTolerance);
  RecordProperty("max_relative_error", std::to_string(worst));
  // And bf16 differs from f32 (the weights really are bf16): the same feed in f32.
  ModelOptions f32;
  f32.dtype = DType::kF32;
  std::unique_ptr<LlamaModel> reference;
  ASSERT_NO_FATAL_FAILURE(LoadTestModel(dir_, &reference, f32));
  std::vector<float> f32_logits;
  RunAndCompare(
      *reference, golden_, 16,
      [](std::mt19937& rng) { return std::uniform_int_distribution<int>(1, 7)(rng); }, &f32_logits);
  ASSERT_EQ(bf16_logits.size(), f32_logits.size());
  // Row by row, bf16 against f32 within the same tolerance.
  const int vocab = model_->vocab_size();
  for (size_t r = 0; r * vocab < f32_logits.size(); ++r) {
    EXPECT_LT(RowError(bf16_logits.data() + r * vocab, f32_logits.data() + r * vocab, vocab),
              kBf16RowTolerance)
        << "row " << r;
  }
  double max_diff = 0;
  for (size_t i = 0; i < f32_logits.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(bf16_logits[i] - f32_logits[i])));
  }
  EXPECT_GT(max_diff, 1e-4);
}

// Decode steps only (every sequence one token per step: 1 to 4 rows), so that the GEMMs whose K
// is a multiple of 64 run on the 12-bit coded weights (kernels/cpu/coded_gemv.h): within the
// bf16 tolerance of transformers, and within 1e-2 of the same model with the coding off (oneDNN
// alone: the same bf16 products summed in another order, which can flip the bf16 rounding of a
// later GEMM's input by 2^-9 relative: rows differ by up to 1.4e-3 on fortune-llama).
TEST_P(LlamaBf16GoldenTest, DecodeStepsOnCodedWeightsMatchOneDnnAndTransformers) {
  auto one_token = [](std::mt19937&) { return 1; };
  std::vector<float> coded_logits, plain_logits;
  const double worst =
      RunAndCompare(*model_, golden_, 16, one_token, &coded_logits, kBf16RowTolerance);
  RecordProperty("max_relative_error", std::to_string(worst));
  cpu::SetCodedWeights(false);
  ModelOptions options;
  options.dtype = DType::kBF16;
  std::unique_ptr<LlamaModel> plain;
  LoadTestModel(dir_, &plain, options);
  cpu::SetCodedWeights(true);
  ASSERT_NE(plain, nullptr);
  RunAndCompare(*plain, golden_, 16, one_token, &plain_logits, kBf16RowTolerance);
  ASSERT_EQ(coded_logits.size(), plain_logits.size());
  const int vocab = model_->vocab_size();
  for (size_t r = 0; r * vocab < plain_logits.size(); ++r) {
    EXPECT_LT(RowError(coded_logits.data() + r * vocab, plain_logits.data() + r * vocab, vocab),
              1e-2)
        << "row " << r;
  }
}

// With a bf16 KV cache as well (what `kv_cache_dtype: auto` gives a bf16 model on the CPU):
// keys and values rounded to bf16 as they are stored, the same tolerance.
TEST_P(LlamaBf16GoldenTest, LogitsWithABf16KvCacheAreTransformersWithinBf16Tolerance) {
  RecordProperty("max_relative_error", std::to_string(ChunksOverABf16Cache(*model_, golden_)));
}

TEST_P(LlamaBf16GoldenTest, GreedyTokensAreTransformersWhereTheMarginIsSafe) {
  const int vocab = model_->vocab_size();
  int checked = 0, positions = 0;
  for (size_t p = 0; p < golden_.ids.size(); ++p) {
    const std::vector<int32_t>& ids = golden_.ids[p];
    Cache cache(*model_, 64, 16, DType::kBF16);  // as served: kv_cache_dtype auto
    std::vector<int32_t> blocks(cache.free.end() - 8, cache.free.end());
    const int n = static_cast<int>(ids.size());
    std::vector<int32_t> pos(n), rows(n);
    std::vector<int64_t> slots(n);
    for (int i = 0; i < n; ++i) {
      pos[i] = rows[i] = i;
      slots[i] = static_cast<int64_t>(blocks[i / 16]) * 16 + i % 16;
    }
    std::vector<int32_t> seq_lens{n}, qsl{0, n};
    HostTensor logits;
    ASSERT_TRUE(
        model_->Forward({ids, pos, slots, blocks, 8, seq_lens, qsl, rows}, cache.layers, &logits)
            .ok());
    for (int i = golden_.prompt_lens[p] - 1; i + 1 < n; ++i) {
      ++positions;
      const float* want = golden_.logits[p].data() + static_cast<size_t>(i) * vocab;
      std::vector<float> sorted(want, want + vocab);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      double scale = 0;
      for (int v = 0; v < vocab; ++v) scale = std::max(scale, std::fabs(double(want[v])));
      if (sorted[0] - sorted[1] <= kSafeMargin * scale) continue;
      ++checked;
      const float* row = logits.data<float>() + static_cast<size_t>(i) * vocab;
      EXPECT_EQ(std::max_element(row, row + vocab) - row, ids[i + 1])
          << "prompt " << p << " position " << i;
    }
  }
  EXPECT_GE(checked * 4, positions) << checked << " of " << positions << " positions checked";
  RecordProperty("positions_checked", std::to_string(checked) + "/" + std::to_string(positions));
}

INSTANTIATE_TEST_SUITE_P(Models, LlamaBf16GoldenTest,
                         ::testing::Values("tiny-llama", "tiny-qwen2", "fortune-llama"),
                         ModelTestName);

// An f32 model over a bf16 KV cache (`kv_cache_dtype: bfloat16`, on any CPU): the keys and
// values rounded to bf16 as they are stored, the rest f32; chunks mixed with decode tokens.
// Dense models only: tiny-mixtral and tiny-olmoe (random routers) went past 0.03 at isolated
// positions (0.04-0.16 at 2 and 5 of them, their neighbours within), the mark of a top-k
// expert choice that the rounding flips, a jump no tolerance bounds.
class LlamaBf16KvCacheTest : public LlamaGoldenTest {};

TEST_P(LlamaBf16KvCacheTest, LogitsWithABf16KvCacheAreTransformersWithinBf16Tolerance) {
  RecordProperty("max_relative_error", std::to_string(ChunksOverABf16Cache(*model_, golden_)));
}

INSTANTIATE_TEST_SUITE_P(DenseModels, LlamaBf16KvCacheTest,
                         ::testing::Values("tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma2",
                                           "tiny-gemma3", "tiny-phi3", "fortune-llama",
                                           "tiny-llama.gguf", "tiny-qwen2.gguf", "tiny-qwen3.gguf",
                                           "tiny-gemma3.gguf", "tiny-phi3.gguf"),
                         ModelTestName);

// longrope (Phi-3's long-context models), per position: rows below the original length are
// the short factors' angles, the rest the long factors', every value times the attention
// factor; the directly computed formula of transformers' _compute_longrope_parameters
// (inv_freq[i] = 1 / (factor[i] * theta^(2i / r))), on a partial rotary of 48 dims.
TEST(RopeCosSinTableTest, LongropeUsesShortFactorsBelowTheOriginalLengthAndLongOnesFromIt) {
  ops::RopeConfig rope;
  rope.theta = 10000.0;
  rope.rotary_dim = 48;
  RopeScaling scaling;
  scaling.type = "longrope";
  for (int i = 0; i < 24; ++i) {
    scaling.short_factor.push_back(1.0 + 0.15 * i);
    scaling.long_factor.push_back(1.0 + 0.9 * i);
  }
  scaling.original_max_position_embeddings = 64;
  scaling.attention_factor = std::sqrt(1.0 + std::log(512.0 / 64) / std::log(64.0));
  const int64_t positions = 512;
  absl::StatusOr<std::vector<float>> table = RopeCosSinTable(rope, scaling, positions);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->size(), static_cast<size_t>(positions * 48));
  for (int64_t p : {0, 1, 31, 63, 64, 65, 200, 511}) {
    const std::vector<double>& f = p < 64 ? scaling.short_factor : scaling.long_factor;
    for (int i = 0; i < 24; ++i) {
      const double inv_freq = 1.0 / (f[i] * std::pow(10000.0, 2.0 * i / 48.0));
      const double a = static_cast<double>(p) * inv_freq;
      EXPECT_NEAR((*table)[p * 48 + i], std::cos(a) * scaling.attention_factor, 1e-6)
          << "p " << p << " i " << i;
      EXPECT_NEAR((*table)[p * 48 + 24 + i], std::sin(a) * scaling.attention_factor, 1e-6)
          << "p " << p << " i " << i;
    }
  }
  // The long factors matter: row 64 is not what the short ones would give.
  const double short_angle = 64.0 / (scaling.short_factor[5] * std::pow(10000.0, 10.0 / 48));
  EXPECT_GT(std::abs((*table)[64 * 48 + 5] - std::cos(short_angle) * scaling.attention_factor),
            0.1);

  scaling.long_factor.pop_back();
  EXPECT_FALSE(RopeCosSinTable(rope, scaling, positions).ok());
}

// The tiny Phi-3 model's table is built from its config.json this way (rotary dims 48 of its
// 64, attention factor sqrt(1 + ln(512 / 64) / ln(64))).
TEST(RopeCosSinTableTest, TinyPhi3ConfigGivesTheLongropeTable) {
  absl::StatusOr<ModelConfig> c =
      ModelConfig::FromModelDir(std::string(LLM_TEST_DATA_DIR) + "/models/tiny-phi3");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->RotaryDim(), 48);
  EXPECT_EQ(c->rope_scaling.type, "longrope");
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 64);
  EXPECT_NEAR(c->rope_scaling.attention_factor, std::sqrt(1.5), 1e-12);
}

// A mixture of experts whose shapes the model cannot run is refused at load, naming the field.
TEST(LlamaMoeTest, ExpertShapeErrorsAreInvalidArgument) {
  absl::StatusOr<ModelConfig> config =
      ModelConfig::FromModelDir(std::string(LLM_TEST_DATA_DIR) + "/models/tiny-qwen2-moe");
  ASSERT_TRUE(config.ok()) << config.status();
  ModelConfig c = *config;
  c.num_experts_per_tok = c.num_experts + 1;
  absl::Status s = LlamaModel::CreateRandom(c, 1, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("num_experts_per_tok"), std::string::npos) << s;
  c = *config;
  c.moe_intermediate_size = 0;
  s = LlamaModel::CreateRandom(c, 1, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("moe_intermediate_size"), std::string::npos) << s;
  // Random weights of the same shapes run (benchmarks' CreateRandom).
  ASSERT_TRUE(LlamaModel::CreateRandom(*config, 1, nullptr).ok());
}

}  // namespace
}  // namespace llm
