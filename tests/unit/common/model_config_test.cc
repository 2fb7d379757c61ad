#include "common/model_config.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

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

TEST(ModelConfig, MistralSlidingWindowIsRefusedUnlessItCoversTheContext) {
  json j = Llama3();
  j["architectures"] = {"MistralForCausalLM"};
  j.erase("rope_scaling");
  j["max_position_embeddings"] = 32768;
  j["sliding_window"] = 4096;
  EXPECT_THAT(Parse(j).message(), HasSubstr("sliding_window 4096"));
  j["sliding_window"] = nullptr;  // Mistral-7B-v0.2 and later
  EXPECT_TRUE(Parse(j).ok());
}

}  // namespace
}  // namespace llm
