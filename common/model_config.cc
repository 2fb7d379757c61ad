#include "common/model_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/gguf.h"
#include "common/gguf_model.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace llm {
namespace {

using json = nlohmann::json;

constexpr const char* kArchitectures[] = {"LlamaForCausalLM", "MistralForCausalLM",
                                          "Qwen2ForCausalLM"};

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", what));
}

// A required positive integer field.
absl::Status GetPositiveInt(const json& j, const char* field, int* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return Invalid(absl::StrCat("missing \"", field, "\""));
  if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > (1 << 30)) {
    return Invalid(absl::StrCat("\"", field, "\" must be a positive integer, not ", it->dump()));
  }
  *out = it->get<int>();
  return absl::OkStatus();
}

// An optional field: left as is when absent or null.
template <typename T>
absl::Status GetOptional(const json& j, const char* field, T* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) return Invalid(absl::StrCat("\"", field, "\" must be a boolean"));
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) return Invalid(absl::StrCat("\"", field, "\" must be a string"));
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) {
      return Invalid(absl::StrCat("\"", field, "\" must be an integer, not ", it->dump()));
    }
  } else {
    if (!it->is_number()) {
      return Invalid(absl::StrCat("\"", field, "\" must be a number, not ", it->dump()));
    }
  }
  *out = it->get<T>();
  return absl::OkStatus();
}

// transformers < 5 writes "rope_scaling" (and "rope_theta" beside it); transformers >= 5
// writes "rope_parameters", which holds rope_theta too. Both are read.
absl::Status ParseRopeScaling(const json& j, RopeScaling* out) {
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) it = j.find("rope_parameters");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) return Invalid("\"rope_scaling\" must be an object or null");
  std::string type;
  // transformers accepts both spellings.
  RETURN_IF_ERROR(GetOptional(*it, "type", &type));
  RETURN_IF_ERROR(GetOptional(*it, "rope_type", &type));
  if (type.empty() || type == "default") return absl::OkStatus();
  if (type != "linear" && type != "llama3") {
    return absl::UnimplementedError(absl::StrCat("config.json: rope_scaling type \"", type,
                                                 "\" is not supported (linear, llama3)"));
  }
  out->type = type;
  if (!it->contains("factor")) return Invalid("rope_scaling needs \"factor\"");
  RETURN_IF_ERROR(GetOptional(*it, "factor", &out->factor));
  if (!(out->factor >= 1.0)) return Invalid("rope_scaling \"factor\" must be >= 1");
  if (type == "llama3") {
    for (const char* f :
         {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      if (!it->contains(f)) return Invalid(absl::StrCat("llama3 rope_scaling needs \"", f, "\""));
    }
    RETURN_IF_ERROR(GetOptional(*it, "low_freq_factor", &out->low_freq_factor));
    RETURN_IF_ERROR(GetOptional(*it, "high_freq_factor", &out->high_freq_factor));
    RETURN_IF_ERROR(GetOptional(*it, "original_max_position_embeddings",
                                &out->original_max_position_embeddings));
    if (!(out->high_freq_factor > out->low_freq_factor)) {
      return Invalid("llama3 rope_scaling needs high_freq_factor > low_freq_factor");
    }
  }
  return absl::OkStatus();
}

absl::Status ParseTokenIds(const json& j, ModelConfig* c) {
  RETURN_IF_ERROR(GetOptional(j, "bos_token_id", &c->bos_token_id));
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (it->is_number_integer()) {
    c->eos_token_ids = {it->get<int>()};
  } else if (it->is_array() && std::all_of(it->begin(), it->end(),
                                           [](const json& v) { return v.is_number_integer(); })) {
    c->eos_token_ids = it->get<std::vector<int>>();
  } else {
    return Invalid("\"eos_token_id\" must be an integer or a list of integers");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromJson(std::string_view json_text) {
  const json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Invalid("not a JSON object");
  ModelConfig c;
  auto archs = j.find("architectures");
  if (archs == j.end() || !archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
    return Invalid("missing \"architectures\" (a list naming the model class)");
  }
  c.architecture = (*archs)[0].get<std::string>();
  if (std::find(std::begin(kArchitectures), std::end(kArchitectures), c.architecture) ==
      std::end(kArchitectures)) {
    return absl::UnimplementedError(absl::StrCat("config.json: architecture ", c.architecture,
                                                 " is not supported (",
                                                 absl::StrJoin(kArchitectures, ", "), ")"));
  }
  RETURN_IF_ERROR(GetOptional(j, "model_type", &c.model_type));
  RETURN_IF_ERROR(GetPositiveInt(j, "vocab_size", &c.vocab_size));
  RETURN_IF_ERROR(GetPositiveInt(j, "hidden_size", &c.hidden_size));
  RETURN_IF_ERROR(GetPositiveInt(j, "intermediate_size", &c.intermediate_size));
  RETURN_IF_ERROR(GetPositiveInt(j, "num_hidden_layers", &c.num_hidden_layers));
  RETURN_IF_ERROR(GetPositiveInt(j, "num_attention_heads", &c.num_attention_heads));
  RETURN_IF_ERROR(GetPositiveInt(j, "max_position_embeddings", &c.max_position_embeddings));
  c.num_key_value_heads = c.num_attention_heads;
  if (j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()) {
    RETURN_IF_ERROR(GetPositiveInt(j, "num_key_value_heads", &c.num_key_value_heads));
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return Invalid(absl::StrCat("num_attention_heads (", c.num_attention_heads,
                                ") must be a multiple of num_key_value_heads (",
                                c.num_key_value_heads, ")"));
  }
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    RETURN_IF_ERROR(GetPositiveInt(j, "head_dim", &c.head_dim));
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return Invalid(absl::StrCat("hidden_size (", c.hidden_size,
                                  ") is not a multiple of num_attention_heads (",
                                  c.num_attention_heads, ") and head_dim is absent"));
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) return Invalid(absl::StrCat("head_dim ", c.head_dim, " must be even"));
  RETURN_IF_ERROR(GetOptional(j, "rms_norm_eps", &c.rms_norm_eps));
  if (!(c.rms_norm_eps > 0)) return Invalid("\"rms_norm_eps\" must be > 0");
  RETURN_IF_ERROR(GetOptional(j, "rope_theta", &c.rope_theta));
  if (auto rp = j.find("rope_parameters"); rp != j.end() && rp->is_object()) {
    RETURN_IF_ERROR(GetOptional(*rp, "rope_theta", &c.rope_theta));
  }
  if (!(c.rope_theta > 0)) return Invalid("\"rope_theta\" must be > 0");
  RETURN_IF_ERROR(ParseRopeScaling(j, &c.rope_scaling));
  RETURN_IF_ERROR(GetOptional(j, "tie_word_embeddings", &c.tie_word_embeddings));
  RETURN_IF_ERROR(GetOptional(j, "torch_dtype", &c.torch_dtype));
  RETURN_IF_ERROR(GetOptional(j, "dtype", &c.torch_dtype));  // transformers >= 5
  std::string act = "silu";
  RETURN_IF_ERROR(GetOptional(j, "hidden_act", &act));
  if (act != "silu") {
    return absl::UnimplementedError(
        absl::StrCat("config.json: hidden_act \"", act, "\" is not supported (silu)"));
  }
  c.attention_bias = c.architecture == "Qwen2ForCausalLM";
  RETURN_IF_ERROR(GetOptional(j, "attention_bias", &c.attention_bias));
  bool mlp_bias = false;
  RETURN_IF_ERROR(GetOptional(j, "mlp_bias", &mlp_bias));
  if (mlp_bias) return absl::UnimplementedError("config.json: mlp_bias is not supported");
  // Sliding-window attention changes which keys a token sees; refuse rather than ignore it.
  bool use_sliding_window = c.architecture == "MistralForCausalLM";
  if (c.architecture == "Qwen2ForCausalLM") {
    RETURN_IF_ERROR(GetOptional(j, "use_sliding_window", &use_sliding_window));
  }
  int64_t sliding_window = 0;
  if (use_sliding_window) RETURN_IF_ERROR(GetOptional(j, "sliding_window", &sliding_window));
  if (use_sliding_window && sliding_window > 0 && sliding_window < c.max_position_embeddings) {
    return absl::UnimplementedError(
        absl::StrCat("config.json: sliding_window ", sliding_window,
                     " (< max_position_embeddings) is not supported; only full attention is"));
  }
  RETURN_IF_ERROR(ParseTokenIds(j, &c));
  return c;
}

absl::StatusOr<ModelConfig> ModelConfig::FromModelDir(const std::string& dir) {
  if (IsGgufPath(dir)) {
    ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> f, GgufFile::Open(dir));
    return FromGguf(*f);
  }
  const std::filesystem::path path = std::filesystem::path(dir) / "config.json";
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<ModelConfig> c = FromJson(ss.str());
  if (!c.ok()) {
    return absl::Status(c.status().code(), absl::StrCat(path.string(), ": ", c.status().message()));
  }
  return c;
}

}  // namespace llm
