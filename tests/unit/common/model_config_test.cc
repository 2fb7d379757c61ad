#include "common/model_config.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/gguf.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/gguf_builder.h"

namespace llm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

// The shape of Meta-Llama-3-8B-Instruct's config.json (real field names and values).
json Llama3() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "vocab_size": 128256})");
}

absl::Status Parse(const json& j) { return ModelConfig::FromJson(j.dump()).status(); }

TEST(ModelConfig, ParsesALlama3Config) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(Llama3().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 8.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(128001, 128008, 128009));
  EXPECT_EQ(c->torch_dtype, "bfloat16");
}

TEST(ModelConfig, Qwen2HasQkvBiasAndTiedEmbeddings) {
  const json j = json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864,
    "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2",
    "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
    "tie_word_embeddings": true, "use_sliding_window": false, "vocab_size": 151936,
    "eos_token_id": 151643, "hidden_act": "silu"})");
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->attention_bias);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(151643));
  EXPECT_EQ(c->rope_scaling.type, "");
}

TEST(ModelConfig, DefaultsFollowTransformers) {
  json j = Llama3();
  j.erase("num_key_value_heads");
  j.erase("rope_scaling");
  j.erase("rms_norm_eps");
  j["head_dim"] = 64;  // an explicit head_dim wins over hidden_size / heads
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 32);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
}

TEST(ModelConfig, ErrorsNameTheFieldOrTheUnsupportedFeature) {
  json j = Llama3();
  j.erase("hidden_size");
  EXPECT_THAT(Parse(j).message(), HasSubstr("missing \"hidden_size\""));

  j = Llama3();
  j["num_hidden_layers"] = -1;
  EXPECT_THAT(Parse(j).message(), HasSubstr("\"num_hidden_layers\" must be a positive integer"));

  j = Llama3();
  j["architectures"] = {"GPT2LMHeadModel"};
  absl::Status s = Parse(j);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("architecture GPT2LMHeadModel is not supported"));

  j = Llama3();
  j.erase("architectures");
  EXPECT_THAT(Parse(j).message(), HasSubstr("missing \"architectures\""));

  j = Llama3();
  j["rope_scaling"]["rope_type"] = "yarn";
  EXPECT_THAT(Parse(j).message(), HasSubstr("rope_scaling type \"yarn\" is not supported"));

  j = Llama3();
  j["rope_scaling"].erase("low_freq_factor");
  EXPECT_THAT(Parse(j).message(), HasSubstr("needs \"low_freq_factor\""));

  j = Llama3();
  j["hidden_act"] = "gelu";
  EXPECT_THAT(Parse(j).message(), HasSubstr("hidden_act \"gelu\" is not supported"));

  j = Llama3();
  j["num_key_value_heads"] = 5;
  EXPECT_THAT(Parse(j).message(), HasSubstr("multiple of num_key_value_heads (5)"));

  j = Llama3();
  j["eos_token_id"] = "</s>";
  EXPECT_THAT(Parse(j).message(), HasSubstr("\"eos_token_id\" must be an integer or a list"));

  EXPECT_THAT(ModelConfig::FromJson("{not json").status().message(),
              HasSubstr("not a JSON object"));
  EXPECT_EQ(ModelConfig::FromModelDir("/nonexistent").status().code(), absl::StatusCode::kNotFound);
}

// The config.json files transformers 5 wrote for our tiny models (tools/models): the newer
// format, with rope_theta and the scaling inside "rope_parameters" and "dtype".
TEST(ModelConfig, ReadsConfigsWrittenByTransformers) {
  absl::StatusOr<ModelConfig> llama =
      ModelConfig::FromModelDir(LLM_TEST_DATA_DIR "/models/tiny-llama");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->architecture, "LlamaForCausalLM");
  EXPECT_DOUBLE_EQ(llama->rope_theta, 500000.0);
  EXPECT_EQ(llama->rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(llama->rope_scaling.factor, 8.0);
  EXPECT_EQ(llama->rope_scaling.original_max_position_embeddings, 64);
  EXPECT_EQ(llama->num_key_value_heads, 2);
  EXPECT_EQ(llama->torch_dtype, "bfloat16");

  absl::StatusOr<ModelConfig> qwen =
      ModelConfig::FromModelDir(LLM_TEST_DATA_DIR "/models/tiny-qwen2");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_DOUBLE_EQ(qwen->rope_theta, 1000000.0);
  EXPECT_EQ(qwen->rope_scaling.type, "");
  EXPECT_TRUE(qwen->attention_bias);
  EXPECT_TRUE(qwen->tie_word_embeddings);
  EXPECT_EQ(qwen->num_key_value_heads, 1);
}

TEST(ModelConfig, MistralSlidingWindowAppliesToEveryLayerUnlessItCoversTheContext) {
  json j = Llama3();
  j["architectures"] = {"MistralForCausalLM"};
  j.erase("rope_scaling");
  j["max_position_embeddings"] = 32768;
  j["sliding_window"] = 4096;  // Mistral-7B-v0.1
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_TRUE(c->IsSlidingLayer(0));
  EXPECT_TRUE(c->IsSlidingLayer(31));
  j["sliding_window"] = nullptr;  // Mistral-7B-v0.2 and later
  c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_FALSE(c->IsSlidingLayer(0));
  j["sliding_window"] = 32768;  // covers the context: no window
  EXPECT_EQ(ModelConfig::FromJson(j.dump())->sliding_window, 0);
}

// The shape of google/gemma-3-1b-it's config.json as transformers 4 wrote it (real field names
// and values): the local rope base beside rope_theta, and the layer pattern as a number.
json Gemma3() {
  return json::parse(R"({
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": false,
    "attn_logit_softcapping": null, "bos_token_id": 2, "eos_token_id": [1, 106],
    "final_logit_softcapping": null, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 1152, "intermediate_size": 6912, "max_position_embeddings": 32768,
    "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26,
    "num_key_value_heads": 1, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000,
    "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
    "vocab_size": 262144})");
}

TEST(ModelConfig, Gemma3FromTransformers4) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(Gemma3().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qk_norm);
  EXPECT_TRUE(c->sandwich_norms);
  EXPECT_TRUE(c->scale_embeddings);
  EXPECT_TRUE(c->tie_word_embeddings);  // Gemma's default
  EXPECT_EQ(c->norm_weight_offset, 1.0f);
  EXPECT_EQ(c->hidden_act, "gelu_pytorch_tanh");
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_DOUBLE_EQ(c->query_pre_attn_scalar, 256);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c->rope_local_theta, 1e4);
  EXPECT_EQ(c->sliding_window, 512);
  ASSERT_EQ(c->sliding_layers.size(), 26u);
  for (int l = 0; l < 26; ++l) EXPECT_EQ(c->IsSlidingLayer(l), (l + 1) % 6 != 0) << l;
  EXPECT_THAT(c->eos_token_ids, ElementsAre(1, 106));

  json j = Gemma3();
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};  // gemma-3-4b and larger
  c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, "linear");
  j["hidden_activation"] = "relu";
  EXPECT_THAT(Parse(j).message(), HasSubstr("hidden_act \"relu\""));
  j = Gemma3();
  j["layer_types"] = {"sliding_attention"};
  EXPECT_THAT(Parse(j).message(), HasSubstr("layer_types"));
  j = Gemma3();
  j["architectures"] = {"Gemma3ForConditionalGeneration"};  // the multimodal checkpoints
  EXPECT_EQ(Parse(j).code(), absl::StatusCode::kUnimplemented);
}

TEST(ModelConfig, GeluIsRefusedOutsideGemma) {
  json j = Llama3();
  j["hidden_act"] = "gelu_pytorch_tanh";
  EXPECT_THAT(Parse(j).message(), HasSubstr("hidden_act \"gelu_pytorch_tanh\""));
}

// The tiny models of the new families, as transformers 5 wrote their config.json.
// The shape of Mixtral-8x7B-Instruct-v0.1's config.json (real field names and values).
json Mixtral() {
  return json::parse(R"({
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "output_router_logits": false, "rms_norm_eps": 1e-05,
    "rope_theta": 1e6, "router_aux_loss_coef": 0.02, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 32000})");
}

// Qwen1.5-MoE-A2.7B's.
json Qwen2Moe() {
  return json::parse(R"({
    "architectures": ["Qwen2MoeForCausalLM"], "bos_token_id": 151643, "eos_token_id": 151643,
    "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5632,
    "max_position_embeddings": 8192, "max_window_layers": 21, "model_type": "qwen2_moe",
    "num_attention_heads": 16, "num_hidden_layers": 24, "num_key_value_heads": 16,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_sliding_window": false,
    "vocab_size": 151936, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60,
    "norm_topk_prob": false, "router_aux_loss_coef": 0.001})");
}

// Qwen3-30B-A3B's.
json Qwen3Moe() {
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "bos_token_id": 151643,
    "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
    "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32,
    "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_scaling": null,
    "rope_theta": 1000000.0, "sliding_window": null, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936})");
}

TEST(ModelConfig, MixtralHasExpertsInEveryLayerWithRenormalizedWeights) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(Mixtral().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_experts, 8);
  EXPECT_EQ(c->num_experts_per_tok, 2);
  EXPECT_EQ(c->moe_intermediate_size, 14336);  // the experts are intermediate_size wide
  EXPECT_EQ(c->shared_expert_intermediate_size, 0);
  EXPECT_TRUE(c->norm_topk_prob);
  for (int l = 0; l < 32; ++l) EXPECT_TRUE(c->IsMoeLayer(l)) << l;
  EXPECT_FALSE(c->IsMoeLayer(32));
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->sliding_window, 0);  // null
  EXPECT_EQ(c->MaxIntermediateSize(), 14336);
  // A window, when set, applies to every layer as Mistral's.
  json j = Mixtral();
  j["sliding_window"] = 4096;
  c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->IsSlidingLayer(0));
  EXPECT_TRUE(c->IsSlidingLayer(31));
}

TEST(ModelConfig, Qwen2MoeHasASharedExpertAndQkvBias) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(Qwen2Moe().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_experts, 60);
  EXPECT_EQ(c->num_experts_per_tok, 4);
  EXPECT_EQ(c->moe_intermediate_size, 1408);
  EXPECT_EQ(c->shared_expert_intermediate_size, 5632);
  EXPECT_FALSE(c->norm_topk_prob);
  EXPECT_TRUE(c->attention_bias);  // Qwen2-MoE's default
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->sliding_window, 0);
  for (int l = 0; l < 24; ++l) EXPECT_TRUE(c->IsMoeLayer(l)) << l;
  EXPECT_EQ(c->MaxIntermediateSize(), 5632);
  // transformers >= 5 writes qkv_bias.
  json j = Qwen2Moe();
  j["qkv_bias"] = false;
  c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->attention_bias);
}

TEST(ModelConfig, Qwen3MoeHasQkNormAndNormalizedTopK) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(Qwen3Moe().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_experts, 128);
  EXPECT_EQ(c->num_experts_per_tok, 8);
  EXPECT_EQ(c->moe_intermediate_size, 768);
  EXPECT_EQ(c->shared_expert_intermediate_size, 0);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->head_dim, 128);
  for (int l = 0; l < 48; ++l) EXPECT_TRUE(c->IsMoeLayer(l)) << l;
  // transformers >= 5 spells the expert count num_local_experts (an alias of num_experts).
  json j = Qwen3Moe();
  j.erase("num_experts");
  j["num_local_experts"] = 16;
  c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_experts, 16);
}

TEST(ModelConfig, SparseStepAndMlpOnlyLayersLeaveDenseLayers) {
  json j = Qwen2Moe();
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;  // layers 1, 3, 5 sparse ...
  j["mlp_only_layers"] = {3};    // ... but 3 dense
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->moe_layers, ElementsAre(false, true, false, false, false, true));
  EXPECT_EQ(c->MaxIntermediateSize(), 5632);
  j["intermediate_size"] = 10000;  // the dense layers' MLP is now the widest
  c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->MaxIntermediateSize(), 10000);
  // Dense families have no experts.
  c = ModelConfig::FromJson(Llama3().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_experts, 0);
  EXPECT_FALSE(c->IsMoeLayer(0));
  EXPECT_EQ(c->MaxIntermediateSize(), 14336);
}

TEST(ModelConfig, ExpertErrorsNameTheField) {
  json j = Mixtral();
  j.erase("num_local_experts");
  EXPECT_THAT(Parse(j).message(), HasSubstr("missing \"num_experts\""));
  j = Mixtral();
  j.erase("num_experts_per_tok");
  EXPECT_THAT(Parse(j).message(), HasSubstr("missing \"num_experts_per_tok\""));
  j = Mixtral();
  j["num_experts_per_tok"] = 9;
  EXPECT_THAT(Parse(j).message(), HasSubstr("\"num_experts_per_tok\" (9) exceeds"));
  j = Qwen3Moe();
  j.erase("moe_intermediate_size");
  EXPECT_THAT(Parse(j).message(), HasSubstr("missing \"moe_intermediate_size\""));
  j = Qwen2Moe();
  j["decoder_sparse_step"] = 0;
  EXPECT_THAT(Parse(j).message(), HasSubstr("\"decoder_sparse_step\" must be >= 1"));
  j = Qwen2Moe();
  j["mlp_only_layers"] = {24};
  EXPECT_THAT(Parse(j).message(), HasSubstr("\"mlp_only_layers\" holds 24"));
  j = Qwen2Moe();
  j["norm_topk_prob"] = 1;
  EXPECT_THAT(Parse(j).message(), HasSubstr("\"norm_topk_prob\" must be a boolean"));
  // Phi-3.5-MoE (sparsemixer routing) is not one of them.
  j = Qwen3Moe();
  j["architectures"] = {"PhimoeForCausalLM"};
  EXPECT_EQ(Parse(j).code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Parse(j).message(), HasSubstr("PhimoeForCausalLM"));
}

// The config.json files transformers 5 wrote for the tiny mixtures of experts (tools/models).
TEST(ModelConfig, ReadsMoeConfigsWrittenByTransformers5) {
  absl::StatusOr<ModelConfig> mixtral =
      ModelConfig::FromModelDir(LLM_TEST_DATA_DIR "/models/tiny-mixtral");
  ASSERT_TRUE(mixtral.ok()) << mixtral.status();
  EXPECT_EQ(mixtral->num_experts, 8);
  EXPECT_EQ(mixtral->moe_intermediate_size, 32);
  EXPECT_TRUE(mixtral->norm_topk_prob);

  absl::StatusOr<ModelConfig> qwen2 =
      ModelConfig::FromModelDir(LLM_TEST_DATA_DIR "/models/tiny-qwen2-moe");
  ASSERT_TRUE(qwen2.ok()) << qwen2.status();
  EXPECT_EQ(qwen2->num_experts, 6);
  EXPECT_EQ(qwen2->shared_expert_intermediate_size, 48);
  EXPECT_FALSE(qwen2->norm_topk_prob);
  EXPECT_TRUE(qwen2->attention_bias);
  EXPECT_THAT(qwen2->moe_layers, ElementsAre(true, false, true));

  absl::StatusOr<ModelConfig> qwen3 =
      ModelConfig::FromModelDir(LLM_TEST_DATA_DIR "/models/tiny-qwen3-moe");
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  EXPECT_EQ(qwen3->num_experts, 8);  // written as num_local_experts
  EXPECT_EQ(qwen3->moe_intermediate_size, 16);
  EXPECT_TRUE(qwen3->norm_topk_prob);
  EXPECT_TRUE(qwen3->qk_norm);
  EXPECT_EQ(qwen3->head_dim, 16);
}

// OLMoE: experts intermediate_size wide in every layer, norm_topk_prob as written, q/k norms
// over the whole projections; a clip_qkv other than null is refused by name.
TEST(ModelConfig, ReadsOlmoe) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromModelDir(LLM_TEST_DATA_DIR "/models/tiny-olmoe");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "OlmoeForCausalLM");
  EXPECT_EQ(c->num_experts, 8);
  EXPECT_EQ(c->num_experts_per_tok, 2);
  EXPECT_EQ(c->moe_intermediate_size, 32);
  EXPECT_FALSE(c->norm_topk_prob);
  EXPECT_TRUE(c->qk_norm && c->qk_norm_whole);
  EXPECT_THAT(c->moe_layers, ElementsAre(true, true));
  json j = json::parse(R"({"architectures": ["OlmoeForCausalLM"], "hidden_size": 64,
      "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 4, "vocab_size": 100, "max_position_embeddings": 64,
      "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": true, "clip_qkv": null})");
  c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->norm_topk_prob);
  j["clip_qkv"] = 8.0;
  const absl::Status s = ModelConfig::FromJson(j.dump()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("clip_qkv 8.0 is not supported"));
}

// A GGUF of architecture `arch` with the keys every model needs (2 layers of width 32, 2 heads),
// the u32 keys `keys` and F32 tensors of [2, 32] (token_embd.weight first) named `tensors`.
std::vector<std::byte> MinimalGguf(std::string_view arch,
                                   std::vector<std::pair<std::string, uint32_t>> keys,
                                   std::vector<std::string> tensors) {
  const std::string a(arch);
  for (const char* key : {"embedding_length", "feed_forward_length", "block_count",
                          "attention.head_count", "context_length"}) {
    const std::string_view k = key;
    keys.emplace_back(a + "." + key, k == "block_count" || k == "attention.head_count" ? 2 : 32);
  }
  tensors.insert(tensors.begin(), "token_embd.weight");
  testing::GgufBuilder g;
  g.Header(3, tensors.size(), keys.size() + 1).KeyString("general.architecture", arch);
  for (const auto& [key, value] : keys) g.KeyU32(key, value);
  for (size_t i = 0; i < tensors.size(); ++i) {
    g.TensorInfo(tensors[i], {32, 2}, /*F32*/ 0, i * 256);
  }
  g.PadTo(32);
  g.b.resize(g.b.size() + 256 * tensors.size());
  return g.b;
}

absl::Status GgufConfigStatus(const std::vector<std::byte>& b) {
  absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::FromBuffer(b, "moe.gguf");
  if (!f.ok()) return f.status();
  return ModelConfig::FromGguf(**f).status();
}

// Mixtures of experts from GGUF: Mixtral's files say general.architecture llama with
// llama.expert_count; qwen2moe and qwen3moe need it. Sparse layers are those with a router
// tensor. What these architectures' llama.cpp graphs do not do is refused by name.
TEST(ModelConfig, MixtureOfExpertsFromGguf) {
  const std::vector<std::pair<std::string, uint32_t>> mixtral = {{"llama.expert_count", 8},
                                                                 {"llama.expert_used_count", 2}};
  {
    const std::vector<std::byte> b = MinimalGguf("llama", mixtral, {"blk.1.ffn_gate_inp.weight"});
    auto f = GgufFile::FromBuffer(b);
    ASSERT_TRUE(f.ok()) << f.status();
    absl::StatusOr<ModelConfig> c = ModelConfig::FromGguf(**f);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->architecture, "MixtralForCausalLM");
    EXPECT_EQ(c->num_experts, 8);
    EXPECT_EQ(c->num_experts_per_tok, 2);
    EXPECT_EQ(c->moe_intermediate_size, 32);
    EXPECT_TRUE(c->norm_topk_prob);
    EXPECT_THAT(c->moe_layers, ElementsAre(false, true));
  }
  {  // llama.expert_count = 0, as some converters write it for dense models: dense.
    const std::vector<std::byte> b = MinimalGguf("llama", {{"llama.expert_count", 0}}, {});
    auto f = GgufFile::FromBuffer(b);
    ASSERT_TRUE(f.ok()) << f.status();
    absl::StatusOr<ModelConfig> c = ModelConfig::FromGguf(**f);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->architecture, "LlamaForCausalLM");
    EXPECT_EQ(c->num_experts, 0);
  }
  absl::Status s = GgufConfigStatus(MinimalGguf("llama", mixtral, {"blk.0.ffn_gate.0.weight"}));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("experts stored one tensor each"));

  auto gating = mixtral;
  gating.emplace_back("llama.expert_gating_func", 2);  // sigmoid
  s = GgufConfigStatus(MinimalGguf("llama", gating, {}));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("llama.expert_gating_func = 2"));

  auto too_many = mixtral;
  too_many[1].second = 9;
  s = GgufConfigStatus(MinimalGguf("llama", too_many, {}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("llama.expert_used_count (9) exceeds"));

  s = GgufConfigStatus(MinimalGguf("qwen3moe", {}, {}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("qwen3moe.expert_count is required"));

  s = GgufConfigStatus(MinimalGguf(
      "qwen3moe", {{"qwen3moe.expert_count", 8}, {"qwen3moe.expert_used_count", 2}}, {}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("qwen3moe.expert_feed_forward_length"));

  s = GgufConfigStatus(MinimalGguf("qwen2", {{"qwen2.expert_count", 4}}, {}));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("qwen2.expert_count = 4"));
}

TEST(ModelConfig, ReadsQwen3AndGemmaConfigsWrittenByTransformers5) {
  absl::StatusOr<ModelConfig> qwen3 =
      ModelConfig::FromModelDir(LLM_TEST_DATA_DIR "/models/tiny-qwen3");
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  EXPECT_TRUE(qwen3->qk_norm);
  EXPECT_FALSE(qwen3->sandwich_norms);
  EXPECT_FALSE(qwen3->attention_bias);
  EXPECT_EQ(qwen3->head_dim, 64);
  EXPECT_EQ(qwen3->sliding_window, 0);

  absl::StatusOr<ModelConfig> gemma2 =
      ModelConfig::FromModelDir(LLM_TEST_DATA_DIR "/models/tiny-gemma2");
  ASSERT_TRUE(gemma2.ok()) << gemma2.status();
  EXPECT_FALSE(gemma2->qk_norm);
  EXPECT_TRUE(gemma2->sandwich_norms);
  EXPECT_DOUBLE_EQ(gemma2->attn_logit_softcapping, 2.0);
  EXPECT_DOUBLE_EQ(gemma2->final_logit_softcapping, 3.0);
  EXPECT_DOUBLE_EQ(gemma2->query_pre_attn_scalar, 48);
  EXPECT_EQ(gemma2->sliding_window, 8);
  EXPECT_THAT(gemma2->sliding_layers, ElementsAre(true, false, true, false));
  EXPECT_DOUBLE_EQ(gemma2->rope_local_theta, 0);

  absl::StatusOr<ModelConfig> gemma3 =
      ModelConfig::FromModelDir(LLM_TEST_DATA_DIR "/models/tiny-gemma3");
  ASSERT_TRUE(gemma3.ok()) << gemma3.status();
  EXPECT_TRUE(gemma3->qk_norm);
  EXPECT_DOUBLE_EQ(gemma3->query_pre_attn_scalar, 64);
  EXPECT_DOUBLE_EQ(gemma3->rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(gemma3->rope_local_theta, 1e4);
  EXPECT_EQ(gemma3->rope_scaling.type, "linear");
  EXPECT_DOUBLE_EQ(gemma3->rope_scaling.factor, 8.0);
  EXPECT_THAT(gemma3->sliding_layers, ElementsAre(true, true, true, true, true, false));
}

// microsoft/Phi-3-mini-4k-instruct's config.json (the fields that matter, real values):
// fused projections, no rope scaling, a sliding window of 2047 under 4096 positions.
json Phi3Mini4k() {
  return json::parse(R"({
    "architectures": ["Phi3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
    "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
    "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": null,
    "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.2", "use_cache": true,
    "vocab_size": 32064})");
}

// microsoft/Phi-4-mini-instruct's config.json: GQA, partial_rotary_factor 0.75 (96 of 128
// dims), longrope to 131072 from 4096, tied embeddings, a window past the context. The 48
// factors are of the shape of the real ones (the real lists are not reproduced digit for
// digit here).
json Phi4Mini() {
  json j = json::parse(R"({
    "architectures": ["Phi3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 199999, "embd_pdrop": 0.0, "eos_token_id": 199999, "full_attn_mod": 1,
    "hidden_act": "silu", "hidden_size": 3072, "initializer_range": 0.02,
    "intermediate_size": 8192, "interpolate_factor": 1, "lm_head_bias": false,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "phi3",
    "num_attention_heads": 24, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "original_max_position_embeddings": 4096, "pad_token_id": 199999,
    "partial_rotary_factor": 0.75, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
    "rope_scaling": {"type": "longrope"}, "rope_theta": 10000.0, "sliding_window": 262144,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.45.0",
    "use_cache": true, "vocab_size": 200064})");
  std::vector<double> factors;
  for (int i = 0; i < 48; ++i) factors.push_back(i < 31 ? std::pow(1.1183, i) : 32.0 + i - 31);
  j["rope_scaling"]["long_factor"] = factors;
  j["rope_scaling"]["short_factor"] = factors;
  return j;
}

TEST(ModelConfig, Phi3Mini4kHasFusedProjectionsAndASlidingWindow) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(Phi3Mini4k().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "Phi3ForCausalLM");
  EXPECT_EQ(c->head_dim, 96);
  EXPECT_EQ(c->RotaryDim(), 96);
  EXPECT_TRUE(c->fused_qkv);
  EXPECT_TRUE(c->fused_gate_up);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->hidden_act, "silu");
  EXPECT_EQ(c->rope_scaling.type, "");
  // Every layer sees the last 2047 positions, its own included (transformers' mask:
  // kv > q - sliding_window).
  EXPECT_EQ(c->sliding_window, 2047);
  EXPECT_TRUE(c->sliding_layers.empty());
  EXPECT_TRUE(c->IsSlidingLayer(0) && c->IsSlidingLayer(31));
  EXPECT_THAT(c->eos_token_ids, ElementsAre(32000));

  json j = Phi3Mini4k();
  j["sliding_window"] = nullptr;  // Phi-3-mini-128k, Phi-3.5: 262144 or null
  c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 0);
}

TEST(ModelConfig, Phi4MiniHasPartialRotaryAndLongrope) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(Phi4Mini().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->rotary_dim, 96);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->sliding_window, 0);  // 262144 covers the context
  const RopeScaling& rs = c->rope_scaling;
  EXPECT_EQ(rs.type, "longrope");
  EXPECT_EQ(rs.short_factor.size(), 48u);
  EXPECT_EQ(rs.long_factor.size(), 48u);
  EXPECT_DOUBLE_EQ(rs.long_factor[1], 1.1183);
  EXPECT_EQ(rs.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(rs.factor, 32.0);
  // sqrt(1 + ln(131072 / 4096) / ln(4096)) = sqrt(1 + 5 / 12).
  EXPECT_NEAR(rs.attention_factor, std::sqrt(17.0 / 12.0), 1e-12);

  json j = Phi4Mini();
  j["rope_scaling"]["attention_factor"] = 1.5;  // given: used as is
  c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope_scaling.attention_factor, 1.5);

  j = Phi4Mini();
  j["rope_scaling"]["type"] = "su";  // Phi-3-*-128k's first configs
  c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, "longrope");

  j = Phi4Mini();
  j.erase("partial_rotary_factor");  // 48 factors for 64 frequencies
  EXPECT_THAT(Parse(j).message(), HasSubstr("rotary_dim / 2 = 64 numbers, not 48 and 48"));

  j = Phi4Mini();
  j["rope_scaling"].erase("long_factor");
  EXPECT_THAT(Parse(j).message(), HasSubstr("needs \"long_factor\""));

  j = Llama3();
  j["partial_rotary_factor"] = 0.5;
  EXPECT_EQ(Parse(j).code(), absl::StatusCode::kUnimplemented);
  j = Llama3();
  j["rope_scaling"] = Phi4Mini()["rope_scaling"];
  EXPECT_THAT(Parse(j).message(), HasSubstr("rotary_dim / 2 = 64"));
}

// tiny-phi3 (tools/models/make_models.py): transformers 5's spelling, partial_rotary_factor
// and the longrope description inside rope_parameters, original length at the top as well.
TEST(ModelConfig, ReadsAPhi3ConfigWrittenByTransformers5) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromModelDir(LLM_TEST_DATA_DIR "/models/tiny-phi3");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->rotary_dim, 48);
  EXPECT_TRUE(c->fused_qkv && c->fused_gate_up);
  EXPECT_EQ(c->sliding_window, 24);
  EXPECT_EQ(c->rope_scaling.type, "longrope");
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 64);
  EXPECT_DOUBLE_EQ(c->rope_scaling.short_factor[1], 1.15);
  EXPECT_DOUBLE_EQ(c->rope_scaling.long_factor[1], 1.9);
  EXPECT_NEAR(c->rope_scaling.attention_factor, std::sqrt(1.5), 1e-12);
}

}  // namespace
}  // namespace llm
