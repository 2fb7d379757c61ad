// A GGUF model (tools/models/make_tiny_gguf.py: fortune-llama's f16 checkpoint written by the
// gguf package as F16 and as Q8_0, attn_q/attn_k permuted as llama.cpp's converter does)
// loads with the config and weights of the safetensors directory: the F16 one gives the same
// logits bit for bit; the Q8_0 one the same greedy tokens within a quantization tolerance.
#include "common/gguf_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "common/half.h"
#include "gtest/gtest.h"
#include "tests/testing/gguf_builder.h"
#include "tests/testing/model_test_util.h"
#include "worker_service/model/llama.h"

namespace llm {
namespace {

const std::string kDir = std::string(LLM_TEST_DATA_DIR) + "/../../models/fortune-llama";
const std::string kF16 = std::string(LLM_TEST_DATA_DIR) + "/models/fortune-llama-f16.gguf";
const std::string kQ8 = std::string(LLM_TEST_DATA_DIR) + "/models/fortune-llama-q8_0.gguf";

TEST(GgufModelTest, ConfigEqualsConfigJson) {
  absl::StatusOr<ModelConfig> hf = ModelConfig::FromModelDir(kDir);
  absl::StatusOr<ModelConfig> g = ModelConfig::FromModelDir(kF16);
  ASSERT_TRUE(hf.ok()) << hf.status();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->architecture, hf->architecture);
  EXPECT_EQ(g->vocab_size, hf->vocab_size);
  EXPECT_EQ(g->hidden_size, hf->hidden_size);
  EXPECT_EQ(g->intermediate_size, hf->intermediate_size);
  EXPECT_EQ(g->num_hidden_layers, hf->num_hidden_layers);
  EXPECT_EQ(g->num_attention_heads, hf->num_attention_heads);
  EXPECT_EQ(g->num_key_value_heads, hf->num_key_value_heads);
  EXPECT_EQ(g->head_dim, hf->head_dim);
  EXPECT_EQ(g->max_position_embeddings, hf->max_position_embeddings);
  EXPECT_EQ(static_cast<float>(g->rms_norm_eps), static_cast<float>(hf->rms_norm_eps));
  EXPECT_EQ(g->rope_theta, hf->rope_theta);
  EXPECT_EQ(g->tie_word_embeddings, hf->tie_word_embeddings);
  EXPECT_EQ(g->bos_token_id, hf->bos_token_id);
  EXPECT_EQ(g->eos_token_ids, hf->eos_token_ids);
}

// Every weight slice a tensor-parallel rank reads (rows of q/k/v/gate/up, columns of o/down,
// in f32 and bf16) equals the safetensors one: names mapped, q/k rows un-permuted; for the
// mixtures of experts each expert's part of the merged tensors (tiny-qwen2-moe.gguf's gate and
// up experts fused in one, its shared expert's gate stored as [H]).
struct GgufPair {
  std::string dir, gguf;
};

class GgufSlicesTest : public ::testing::TestWithParam<GgufPair> {};

TEST_P(GgufSlicesTest, SlicesEqualSafetensors) {
  auto st = SafetensorsModel::Open(GetParam().dir);
  auto gg = GgufWeights::Open(GetParam().gguf);
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_TRUE(gg.ok()) << gg.status();
  int checked = 0;
  for (const std::string& name : (*st)->TensorNames()) {
    absl::StatusOr<std::vector<int64_t>> shape = (*st)->Shape(name);
    ASSERT_TRUE(shape.ok());
    absl::StatusOr<std::vector<int64_t>> gshape = (*gg)->Shape(name);
    ASSERT_TRUE(gshape.ok()) << gshape.status();
    EXPECT_EQ(*gshape, *shape) << name;
    for (int dim = 0; dim < static_cast<int>(shape->size()); ++dim) {
      for (StDType dt : {StDType::kF32, StDType::kBF16}) {
        // The second of four (or two) parts, as rank 1 of a TP group would read.
        const int parts = (*shape)[dim] % 4 == 0 ? 4 : 1;
        const int64_t len = (*shape)[dim] / parts;
        const int64_t begin = parts > 1 ? len : 0, end = begin + len;
        int64_t other = 1;
        for (int d = 0; d < static_cast<int>(shape->size()); ++d) {
          if (d != dim) other *= (*shape)[d];
        }
        const size_t bytes = static_cast<size_t>(len * other) * StDTypeSize(dt);
        std::vector<std::byte> a(bytes), b(bytes);
        ASSERT_TRUE((*st)->ReadSlice(name, dim, begin, end, dt, a).ok());
        const absl::Status s = (*gg)->ReadSlice(name, dim, begin, end, dt, b);
        ASSERT_TRUE(s.ok()) << s;
        EXPECT_TRUE(a == b) << name << " dim " << dim << " " << StDTypeName(dt);
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

const std::string kModels = std::string(LLM_TEST_DATA_DIR) + "/models/";
INSTANTIATE_TEST_SUITE_P(
    Models, GgufSlicesTest,
    ::testing::Values(GgufPair{kDir, kF16},
                      GgufPair{kModels + "tiny-mixtral", kModels + "tiny-mixtral.gguf"},
                      GgufPair{kModels + "tiny-qwen2-moe", kModels + "tiny-qwen2-moe.gguf"},
                      GgufPair{kModels + "tiny-qwen3-moe", kModels + "tiny-qwen3-moe.gguf"},
                      GgufPair{kModels + "tiny-olmoe", kModels + "tiny-olmoe.gguf"}),
    [](const auto& info) {
      std::string n = info.param.gguf.substr(kModels.size());
      for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      return n;
    });

TEST(GgufModelTest, NamesAndErrors) {
  auto gg = GgufWeights::Open(kF16);
  ASSERT_TRUE(gg.ok()) << gg.status();
  std::vector<std::byte> out(4);
  EXPECT_EQ((*gg)->ReadSlice("model.norm.weight", 0, 0, 2, StDType::kF32, out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*gg)->Shape("model.layers.99.mlp.up_proj.weight").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(GgufTensorFor("model.layers.3.mlp.up_proj.weight").name, "blk.3.ffn_up.weight");
  EXPECT_EQ(GgufTensorFor("model.layers.x.mlp.up_proj.weight").name, "");
  // The experts' names, Qwen-MoE's and Mixtral's.
  EXPECT_EQ(GgufTensorFor("model.layers.2.mlp.experts.7.down_proj.weight", "qwen3moe"),
            (GgufTensorRef{"blk.2.ffn_down_exps.weight", 7}));
  EXPECT_EQ(GgufTensorFor("model.layers.0.block_sparse_moe.experts.3.w3.weight"),
            (GgufTensorRef{"blk.0.ffn_up_exps.weight", 3}));
  EXPECT_EQ(GgufTensorFor("model.layers.0.block_sparse_moe.gate.weight"),
            (GgufTensorRef{"blk.0.ffn_gate_inp.weight"}));
  EXPECT_EQ(GgufTensorFor("model.layers.1.mlp.shared_expert_gate.weight", "qwen2moe"),
            (GgufTensorRef{"blk.1.ffn_gate_inp_shexp.weight"}));
  EXPECT_EQ(GgufTensorFor("model.layers.1.mlp.experts.x.up_proj.weight").name, "");
  EXPECT_EQ(GgufTensorFor("model.layers.1.mlp.experts.1.w4.weight").name, "");
  // An expert past the merged tensor's count: NOT_FOUND naming the count.
  auto moe = GgufWeights::Open(kModels + "tiny-qwen3-moe.gguf");
  ASSERT_TRUE(moe.ok()) << moe.status();
  const absl::Status s = (*moe)->Shape("model.layers.0.mlp.experts.8.up_proj.weight").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("blk.0.ffn_up_exps.weight expert 8: the tensor holds 8 experts"),
            std::string::npos)
      << s;
}

// The mixtures of experts' GGUF metadata (make_tiny_gguf.py --families, as llama.cpp's
// converter writes it) gives the config of their config.json: the routing, the widths, the
// shared expert and, from the routers' tensors, which layers are sparse.
TEST(GgufModelTest, MixtureOfExpertsConfigsEqualConfigJson) {
  for (const char* name : {"tiny-mixtral", "tiny-qwen2-moe", "tiny-qwen3-moe", "tiny-olmoe"}) {
    absl::StatusOr<ModelConfig> hf = ModelConfig::FromModelDir(kModels + name);
    absl::StatusOr<ModelConfig> g = ModelConfig::FromModelDir(kModels + name + ".gguf");
    ASSERT_TRUE(hf.ok()) << hf.status();
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->architecture, hf->architecture) << name;
    EXPECT_EQ(g->num_experts, hf->num_experts) << name;
    EXPECT_EQ(g->num_experts_per_tok, hf->num_experts_per_tok) << name;
    EXPECT_EQ(g->moe_intermediate_size, hf->moe_intermediate_size) << name;
    EXPECT_EQ(g->shared_expert_intermediate_size, hf->shared_expert_intermediate_size) << name;
    EXPECT_EQ(g->norm_topk_prob, hf->norm_topk_prob) << name;
    EXPECT_EQ(g->moe_layers, hf->moe_layers) << name;
    EXPECT_EQ(g->intermediate_size, hf->intermediate_size) << name;
    EXPECT_EQ(g->qk_norm, hf->qk_norm) << name;
    EXPECT_EQ(g->qk_norm_whole, hf->qk_norm_whole) << name;
    EXPECT_EQ(g->attention_bias, hf->attention_bias) << name;
  }
}

// tiny-phi3.gguf (make_tiny_gguf.py --families, as llama.cpp's Phi3MiniModel converter
// writes it): the config of tiny-phi3's config.json (partial rotary from
// rope.dimension_count, longrope from rope_factors_short / rope_factors_long, the original
// length and attention factor from rope.scaling.*, the window), and its fused attn_qkv / ffn_up
// served as qkv_proj / gate_up_proj, every row range a rank reads equal to the safetensors one.
TEST(GgufModelTest, Phi3ConfigAndFusedWeightsEqualTheDirectory) {
  const std::string dir = std::string(LLM_TEST_DATA_DIR) + "/models/tiny-phi3";
  absl::StatusOr<ModelConfig> hf = ModelConfig::FromModelDir(dir);
  absl::StatusOr<ModelConfig> g = ModelConfig::FromModelDir(dir + ".gguf");
  ASSERT_TRUE(hf.ok()) << hf.status();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->architecture, "Phi3ForCausalLM");
  EXPECT_EQ(g->head_dim, hf->head_dim);
  EXPECT_EQ(g->rotary_dim, 48);
  EXPECT_EQ(g->RotaryDim(), hf->RotaryDim());
  EXPECT_TRUE(g->fused_qkv && g->fused_gate_up);
  EXPECT_EQ(g->sliding_window, hf->sliding_window);
  EXPECT_EQ(g->tie_word_embeddings, hf->tie_word_embeddings);
  EXPECT_EQ(g->rope_scaling.type, "longrope");
  EXPECT_EQ(g->rope_scaling.original_max_position_embeddings,
            hf->rope_scaling.original_max_position_embeddings);
  ASSERT_EQ(g->rope_scaling.short_factor.size(), hf->rope_scaling.short_factor.size());
  for (size_t i = 0; i < g->rope_scaling.short_factor.size(); ++i) {
    EXPECT_EQ(static_cast<float>(g->rope_scaling.short_factor[i]),
              static_cast<float>(hf->rope_scaling.short_factor[i]));
    EXPECT_EQ(static_cast<float>(g->rope_scaling.long_factor[i]),
              static_cast<float>(hf->rope_scaling.long_factor[i]));
  }
  EXPECT_NEAR(g->rope_scaling.attention_factor, hf->rope_scaling.attention_factor, 1e-6);

  auto st = SafetensorsModel::Open(dir);
  auto gg = GgufWeights::Open(dir + ".gguf");
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_TRUE(gg.ok()) << gg.status();
  for (const char* name :
       {"model.layers.1.self_attn.qkv_proj.weight", "model.layers.1.mlp.gate_up_proj.weight"}) {
    absl::StatusOr<std::vector<int64_t>> shape = (*st)->Shape(name);
    absl::StatusOr<std::vector<int64_t>> gshape = (*gg)->Shape(name);
    ASSERT_TRUE(shape.ok() && gshape.ok()) << name;
    EXPECT_EQ(*gshape, *shape) << name;
    const int64_t cols = (*shape)[1];
    for (int64_t begin : {int64_t{0}, int64_t{64}, (*shape)[0] - 64}) {
      std::vector<std::byte> a(64 * cols * 4), b(64 * cols * 4);
      ASSERT_TRUE((*st)->ReadSlice(name, 0, begin, begin + 64, StDType::kF32, a).ok());
      ASSERT_TRUE((*gg)->ReadSlice(name, 0, begin, begin + 64, StDType::kF32, b).ok());
      EXPECT_TRUE(a == b) << name << " rows from " << begin;
    }
  }
  EXPECT_EQ(GgufTensorFor("model.layers.3.mlp.gate_up_proj.weight", "phi3").name,
            "blk.3.ffn_up.weight");
  EXPECT_EQ(GgufTensorFor("model.layers.3.mlp.gate_up_proj.weight", "llama").name, "");
  EXPECT_EQ(GgufTensorFor("model.layers.3.self_attn.qkv_proj.weight", "phi3").name,
            "blk.3.attn_qkv.weight");
}

TEST(GgufModelTest, F16LogitsEqualSafetensorsBitForBit) {
  std::unique_ptr<LlamaModel> st, gg;
  ASSERT_NO_FATAL_FAILURE(LoadTestModel(kDir, &st));
  ASSERT_NO_FATAL_FAILURE(LoadTestModel(kF16, &gg));
  const Golden golden = LoadGolden(kDir, st->vocab_size());
  std::vector<float> a, b;
  auto chunk = [](std::mt19937& rng) { return 1 + static_cast<int>(rng() % 7); };
  RunAndCompare(*st, golden, 16, chunk, &a);
  RunAndCompare(*gg, golden, 16, chunk, &b);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

TEST(GgufModelTest, Q8_0GreedyTokensAreTransformers) {
  std::unique_ptr<LlamaModel> gg;
  ASSERT_NO_FATAL_FAILURE(LoadTestModel(kQ8, &gg));
  const Golden golden = LoadGolden(kDir, gg->vocab_size());
  const int vocab = gg->vocab_size();
  // Q8_0 rounds each weight to 8 bits: logits move by about 1% of their range.
  std::vector<float> logits;
  const double worst = RunAndCompare(
      *gg, golden, 16, [](std::mt19937&) { return 1 << 20; }, &logits, 0.05);
  RecordProperty("worst_relative_error", std::to_string(worst));
  size_t row = 0;
  int agree = 0, total = 0;
  for (size_t p = 0; p < golden.ids.size(); ++p) {
    const auto& ids = golden.ids[p];
    for (size_t i = 0; i < ids.size(); ++i, ++row) {
      if (static_cast<int>(i) + 1 < golden.prompt_lens[p] || i + 1 >= ids.size()) continue;
      const float* r = logits.data() + row * vocab;
      agree += (std::max_element(r, r + vocab) - r) == ids[i + 1];
      ++total;
    }
  }
  EXPECT_EQ(agree, total);
}

// tiny-mixtral-q8_0.gguf on the cpu: its experts, like every GEMM but the routers, held as the
// file's Q8_0 blocks (ModelOptions::quantized_weights), against the same file dequantized at
// load. The quantized GEMMs round activations to 8 bits per 32 values, which moves logits by
// about 1%; where it moves a router's k-th and (k+1)-th logits past each other (tiny-mixtral's
// random router leaves gaps of 1e-3), the token's expert changes and its row moves by up to a
// quarter of its scale. So: every row finite, 90% of rows within 3% (97.7% here), and both models
// within Q8_0's 5% of transformers' f32 logits on 90% of rows (Q8_0's rounding of the weights flips
// routes as well).
TEST(GgufModelTest, MixtureOfExpertsRunsOnTheFilesQ8_0Blocks) {
  const std::string path = kModels + "tiny-mixtral-q8_0.gguf";
  ModelOptions options;
  options.dtype = DType::kF32;
  options.quantized_weights = false;
  std::unique_ptr<LlamaModel> dequantized, kept;
  ASSERT_NO_FATAL_FAILURE(LoadTestModel(path, &dequantized, options));
  options.quantized_weights = true;
  ASSERT_NO_FATAL_FAILURE(LoadTestModel(path, &kept, options));
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  size_t expert_bytes = 0;
  for (const GgufTensorInfo& t : (*file)->tensors()) {
    if (t.name.ends_with("_exps.weight")) {
      ASSERT_EQ(t.type, GgmlType::kQ8_0) << t.name;
      expert_bytes += t.nbytes;
    }
  }
  ASSERT_GT(expert_bytes, 0u);
  EXPECT_EQ(dequantized->quantized_weight_bytes(), 0u);
  EXPECT_GE(kept->quantized_weight_bytes(), expert_bytes);
  EXPECT_LT(kept->weight_bytes(), dequantized->weight_bytes() / 2);

  const Golden golden = LoadGolden(kModels + "tiny-mixtral", kept->vocab_size());
  auto chunk = [](std::mt19937& rng) { return 1 + static_cast<int>(rng() % 7); };
  std::vector<float> a, b;
  std::vector<double> golden_a, golden_b;
  constexpr double kNoBound = 1e9;  // counted below instead
  RunAndCompare(*dequantized, golden, 16, chunk, &a, kNoBound, DType::kF32, &golden_a);
  RunAndCompare(*kept, golden, 16, chunk, &b, kNoBound, DType::kF32, &golden_b);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  const int vocab = kept->vocab_size();
  std::vector<double> errors;
  for (size_t r = 0; r * vocab < a.size(); ++r) {
    errors.push_back(RowError(b.data() + r * vocab, a.data() + r * vocab, vocab));
    ASSERT_TRUE(std::isfinite(errors.back())) << "row " << r;
  }
  auto share_within = [](const std::vector<double>& e, double bound) {
    return static_cast<double>(
               std::count_if(e.begin(), e.end(), [bound](double x) { return x < bound; })) /
           static_cast<double>(e.size());
  };
  EXPECT_GE(share_within(errors, 0.03), 0.9);
  EXPECT_GT(*std::max_element(errors.begin(), errors.end()), 0.0);  // activations were rounded
  EXPECT_GE(share_within(golden_a, 0.05), 0.9);
  EXPECT_GE(share_within(golden_b, 0.05), 0.9);
  RecordProperty("rows_within_3_percent", std::to_string(share_within(errors, 0.03)));
  RecordProperty("dequantized_rows_within_5_percent", std::to_string(share_within(golden_a, 0.05)));
  RecordProperty("kept_rows_within_5_percent", std::to_string(share_within(golden_b, 0.05)));
}

// A tensor of a type the dequantizer does not take (Q8_1) is an error naming it, at load.
TEST(GgufModelTest, UnsupportedTensorTypesAreNamed) {
  testing::GgufBuilder g;
  g.Header(3, 1, 7).KeyString("general.architecture", "llama");
  for (const char* key :
       {"llama.embedding_length", "llama.feed_forward_length", "llama.block_count",
        "llama.attention.head_count", "llama.context_length", "llama.vocab_size"}) {
    g.KeyU32(key, std::string_view(key) == "llama.embedding_length" ? 32 : 2);
  }
  // token_embd.weight: 2 rows of 32, Q8_1 (type 9: blocks of 32 in 40 bytes).
  g.TensorInfo("token_embd.weight", {32, 2}, 9, 0);
  g.PadTo(32);
  std::vector<std::byte>& b = g.b;
  b.resize(b.size() + 80);
  auto f = GgufFile::FromBuffer(b, "q8_1.gguf");
  ASSERT_TRUE(f.ok()) << f.status();
  auto w = GgufWeights::FromFile(f->get());
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<std::byte> out(2 * 32 * 4);
  const absl::Status s = (*w)->ReadSlice("model.embed_tokens.weight", 0, 0, 2, StDType::kF32, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("token_embd.weight: type Q8_1 is not supported"), std::string::npos)
      << s;
}

TEST(GgufModelTest, OtherArchitecturesAreRefused) {
  // A GGUF whose general.architecture is "phi2" (qwen2, once refused, is supported now).
  testing::GgufBuilder g;
  g.Header(3, 0, 1).KeyString("general.architecture", "phi2");
  const std::vector<std::byte>& b = g.b;
  auto f = GgufFile::FromBuffer(b, "q.gguf");
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<ModelConfig> c = ModelConfig::FromGguf(**f);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(c.status().message().find("\"phi2\" is not supported"), std::string::npos)
      << c.status();
}

}  // namespace
}  // namespace llm
