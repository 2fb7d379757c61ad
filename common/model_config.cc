#include "common/model_config.h"

#include <algorithm>
#include <cmath>
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

constexpr const char* kArchitectures[] = {
    "LlamaForCausalLM",    "MistralForCausalLM",  "Qwen2ForCausalLM", "Qwen3ForCausalLM",
    "Gemma2ForCausalLM",   "Gemma3ForCausalLM",   "Phi3ForCausalLM",  "MixtralForCausalLM",
    "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "OlmoeForCausalLM"};

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

// A list of positive numbers (longrope's short_factor / long_factor).
absl::Status GetFactors(const json& j, const char* field, std::vector<double>* out) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_array() || it->empty()) {
    return Invalid(absl::StrCat("longrope rope_scaling needs \"", field, "\" (a list of numbers)"));
  }
  out->clear();
  for (const json& v : *it) {
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>())) {
      return Invalid(
          absl::StrCat("rope_scaling \"", field, "\" must hold numbers > 0, not ", v.dump()));
    }
    out->push_back(v.get<double>());
  }
  return absl::OkStatus();
}

// One rope description: transformers < 5's "rope_scaling" object, or one of transformers >= 5's
// "rope_parameters" (which holds rope_theta too, read by the caller). Null or absent: none.
// Phi-3's older spellings of longrope, "su" and "yarn", are read as longrope (as Phi3Config
// does).
absl::Status ParseRopeScaling(const json* obj, bool phi3, RopeScaling* out) {
  if (obj == nullptr || obj->is_null()) return absl::OkStatus();
  if (!obj->is_object()) return Invalid("\"rope_scaling\" must be an object or null");
  const json& rs = *obj;
  std::string type;
  // transformers accepts both spellings.
  RETURN_IF_ERROR(GetOptional(rs, "type", &type));
  RETURN_IF_ERROR(GetOptional(rs, "rope_type", &type));
  if (type.empty() || type == "default") return absl::OkStatus();
  if (phi3 && (type == "su" || type == "yarn")) type = "longrope";
  if (type != "linear" && type != "llama3" && type != "longrope") {
    return absl::UnimplementedError(absl::StrCat("config.json: rope_scaling type \"", type,
                                                 "\" is not supported (linear, llama3, longrope)"));
  }
  out->type = type;
  if (type == "longrope") {
    RETURN_IF_ERROR(GetFactors(rs, "short_factor", &out->short_factor));
    RETURN_IF_ERROR(GetFactors(rs, "long_factor", &out->long_factor));
    // factor, attention_factor and original_max_position_embeddings are optional: resolved
    // by the caller (0: absent).
    out->factor = 0.0;
    out->attention_factor = 0.0;
    out->original_max_position_embeddings = 0;
    RETURN_IF_ERROR(GetOptional(rs, "factor", &out->factor));
    RETURN_IF_ERROR(GetOptional(rs, "attention_factor", &out->attention_factor));
    RETURN_IF_ERROR(GetOptional(rs, "original_max_position_embeddings",
                                &out->original_max_position_embeddings));
    if (out->factor < 0 || out->attention_factor < 0 || out->original_max_position_embeddings < 0) {
      return Invalid(
          "longrope rope_scaling: factor, attention_factor and "
          "original_max_position_embeddings must be > 0");
    }
    return absl::OkStatus();
  }
  if (!rs.contains("factor")) return Invalid("rope_scaling needs \"factor\"");
  RETURN_IF_ERROR(GetOptional(rs, "factor", &out->factor));
  if (!(out->factor >= 1.0)) return Invalid("rope_scaling \"factor\" must be >= 1");
  if (type == "llama3") {
    for (const char* f :
         {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      if (!rs.contains(f)) return Invalid(absl::StrCat("llama3 rope_scaling needs \"", f, "\""));
    }
    RETURN_IF_ERROR(GetOptional(rs, "low_freq_factor", &out->low_freq_factor));
    RETURN_IF_ERROR(GetOptional(rs, "high_freq_factor", &out->high_freq_factor));
    RETURN_IF_ERROR(GetOptional(rs, "original_max_position_embeddings",
                                &out->original_max_position_embeddings));
    if (!(out->high_freq_factor > out->low_freq_factor)) {
      return Invalid("llama3 rope_scaling needs high_freq_factor > low_freq_factor");
    }
  }
  return absl::OkStatus();
}

const json* Member(const json& j, const char* field) {
  auto it = j.find(field);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

// rope_theta, rope_scaling and Gemma 3's local rope base, from either spelling.
absl::Status ParseRope(const json& j, ModelConfig* c) {
  RETURN_IF_ERROR(GetOptional(j, "rope_theta", &c->rope_theta));
  RETURN_IF_ERROR(GetOptional(j, "rope_local_base_freq", &c->rope_local_theta));
  const json* rp = Member(j, "rope_parameters");
  const json* global = Member(j, "rope_scaling");
  if (rp != nullptr && rp->is_object()) {
    if (const json* full = Member(*rp, "full_attention"); full != nullptr) {
      // Gemma 3 in transformers >= 5: one description per layer type.
      global = full;
      const json* local = Member(*rp, "sliding_attention");
      if (local != nullptr && local->is_object()) {
        RETURN_IF_ERROR(GetOptional(*local, "rope_theta", &c->rope_local_theta));
        RopeScaling local_scaling;
        RETURN_IF_ERROR(ParseRopeScaling(local, /*phi3=*/false, &local_scaling));
        if (!local_scaling.type.empty()) {
          return absl::UnimplementedError(
              "config.json: rope scaling of the sliding-window layers is not supported");
        }
      }
    } else if (global == nullptr) {
      global = rp;
    }
    if (global != nullptr && global->is_object()) {
      RETURN_IF_ERROR(GetOptional(*global, "rope_theta", &c->rope_theta));
    }
  }
  if (!(c->rope_theta > 0)) return Invalid("\"rope_theta\" must be > 0");
  if (c->rope_local_theta < 0) return Invalid("\"rope_local_base_freq\" must be > 0");
  const bool phi3 = c->architecture == "Phi3ForCausalLM";
  // partial_rotary_factor: top level (transformers < 5) or in rope_parameters (>= 5, which
  // wins). Phi-3 only: transformers' other families here rotate the whole head.
  double partial = 1.0;
  RETURN_IF_ERROR(GetOptional(j, "partial_rotary_factor", &partial));
  if (rp != nullptr && rp->is_object()) {
    RETURN_IF_ERROR(GetOptional(*rp, "partial_rotary_factor", &partial));
  }
  if (partial != 1.0) {
    if (!phi3) {
      return absl::UnimplementedError(
          "config.json: partial_rotary_factor is not supported (Phi3ForCausalLM only)");
    }
    // transformers: int(head_dim * partial_rotary_factor).
    const int dim = static_cast<int>(c->head_dim * partial);
    if (!(partial > 0 && partial <= 1) || dim < 2 || dim % 2 != 0) {
      return Invalid(absl::StrCat("\"partial_rotary_factor\" ", partial,
                                  " must give an even rotary dim in [2, head_dim ", c->head_dim,
                                  "], not ", dim));
    }
    c->rotary_dim = dim;
  }
  RETURN_IF_ERROR(ParseRopeScaling(global, phi3, &c->rope_scaling));
  RopeScaling& rs = c->rope_scaling;
  if (rs.type != "longrope") return absl::OkStatus();
  const size_t half = static_cast<size_t>(c->RotaryDim() / 2);
  if (rs.short_factor.size() != half || rs.long_factor.size() != half) {
    return Invalid(
        absl::StrCat("longrope short_factor and long_factor must hold rotary_dim / 2 = ", half,
                     " numbers, not ", rs.short_factor.size(), " and ", rs.long_factor.size()));
  }
  // The original (pretraining) length: the top-level field (Phi-3 keeps it there and
  // transformers prefers it), else rope_scaling's, else Phi3Config's default 4096 (the
  // maximum length for other families).
  int original = 0;
  RETURN_IF_ERROR(GetOptional(j, "original_max_position_embeddings", &original));
  if (original <= 0) original = rs.original_max_position_embeddings;
  if (original <= 0) original = phi3 ? 4096 : c->max_position_embeddings;
  rs.original_max_position_embeddings = original;
  // transformers' _compute_longrope_parameters: the attention factor, unless given, from
  // factor (unless given: max_position_embeddings / original).
  const double factor =
      rs.factor > 0 ? rs.factor : static_cast<double>(c->max_position_embeddings) / original;
  if (rs.attention_factor <= 0) {
    rs.attention_factor =
        factor <= 1.0 || original <= 1
            ? 1.0
            : std::sqrt(1.0 + std::log(factor) / std::log(static_cast<double>(original)));
  }
  rs.factor = factor;
  return absl::OkStatus();
}

// Which layers attend through a window, and how wide it is.
absl::Status ParseSlidingWindow(const json& j, ModelConfig* c) {
  const std::string& arch = c->architecture;
  const bool gemma = arch == "Gemma2ForCausalLM" || arch == "Gemma3ForCausalLM";
  // Phi-3: transformers masks with the window whenever sliding_window is set (2047 for
  // Phi-3-mini-4k and Phi-3-medium-4k: a query sees itself and the 2046 positions before it).
  const bool qwen = arch == "Qwen2ForCausalLM" || arch == "Qwen3ForCausalLM" ||
                    arch == "Qwen2MoeForCausalLM" || arch == "Qwen3MoeForCausalLM";
  bool use = arch == "MistralForCausalLM" || arch == "MixtralForCausalLM" ||
             arch == "Phi3ForCausalLM" || gemma;
  if (qwen) {
    RETURN_IF_ERROR(GetOptional(j, "use_sliding_window", &use));
  }
  int64_t window = 0;
  RETURN_IF_ERROR(GetOptional(j, "sliding_window", &window));
  if (!use || window <= 0 || window >= c->max_position_embeddings) return absl::OkStatus();
  if (window > (1 << 30)) return Invalid("\"sliding_window\" is too large");
  c->sliding_window = static_cast<int>(window);
  if (const json* types = Member(j, "layer_types"); types != nullptr) {
    if (!types->is_array() || static_cast<int>(types->size()) != c->num_hidden_layers) {
      return Invalid(absl::StrCat("\"layer_types\" must list num_hidden_layers (",
                                  c->num_hidden_layers, ") layer types"));
    }
    for (const json& t : *types) {
      if (!t.is_string() || (t != "sliding_attention" && t != "full_attention")) {
        return absl::UnimplementedError(absl::StrCat("config.json: layer type ", t.dump(),
                                                     " is not supported (sliding_attention, "
                                                     "full_attention)"));
      }
      c->sliding_layers.push_back(t == "sliding_attention");
    }
  } else if (gemma) {
    // transformers < 5: Gemma 2 alternates from a sliding first layer; Gemma 3 has
    // sliding_window_pattern - 1 sliding layers to one global one.
    int pattern = arch == "Gemma2ForCausalLM" ? 2 : 6;
    RETURN_IF_ERROR(GetOptional(j, "sliding_window_pattern", &pattern));
    RETURN_IF_ERROR(GetOptional(j, "_sliding_window_pattern", &pattern));
    if (pattern < 1) return Invalid("\"sliding_window_pattern\" must be >= 1");
    for (int l = 0; l < c->num_hidden_layers; ++l) c->sliding_layers.push_back((l + 1) % pattern);
  } else if (qwen) {
    int max_window_layers = c->num_hidden_layers;
    RETURN_IF_ERROR(GetOptional(j, "max_window_layers", &max_window_layers));
    for (int l = 0; l < c->num_hidden_layers; ++l) {
      c->sliding_layers.push_back(l >= max_window_layers);
    }
  }
  if (std::none_of(c->sliding_layers.begin(), c->sliding_layers.end(), [](bool b) { return b; }) &&
      !c->sliding_layers.empty()) {
    c->sliding_window = 0;
    c->sliding_layers.clear();
  }
  return absl::OkStatus();
}

// The features of the Gemma 2 / 3 and Qwen3 families (ModelConfig's second block).
absl::Status ParseFamilyFeatures(const json& j, ModelConfig* c) {
  const std::string& arch = c->architecture;
  const bool gemma = arch == "Gemma2ForCausalLM" || arch == "Gemma3ForCausalLM";
  c->qk_norm = arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM" ||
               arch == "Gemma3ForCausalLM" || arch == "OlmoeForCausalLM";
  if (arch == "OlmoeForCausalLM") {
    // OLMoE normalizes the whole q and k projections, and may clamp q, k and v after it.
    c->qk_norm_whole = true;
    if (const json* clip = Member(j, "clip_qkv"); clip != nullptr && !clip->is_null()) {
      return absl::UnimplementedError(
          absl::StrCat("config.json: clip_qkv ", clip->dump(), " is not supported (only null)"));
    }
  }
  if (arch == "Phi3ForCausalLM") {
    // Fused q/k/v and gate/up weights; transformers' Phi3Attention has no biases whatever
    // attention_bias says (Phi-4-mini's config.json has it, false).
    c->fused_qkv = true;
    c->fused_gate_up = true;
    c->attention_bias = false;
  }
  if (gemma) {
    c->scale_embeddings = true;
    c->norm_weight_offset = 1.0f;
    c->sandwich_norms = true;
    c->tie_word_embeddings = true;  // transformers' default for Gemma
    RETURN_IF_ERROR(GetOptional(j, "tie_word_embeddings", &c->tie_word_embeddings));
    c->query_pre_attn_scalar = c->head_dim;
    RETURN_IF_ERROR(GetOptional(j, "query_pre_attn_scalar", &c->query_pre_attn_scalar));
    if (!(c->query_pre_attn_scalar > 0)) return Invalid("\"query_pre_attn_scalar\" must be > 0");
    RETURN_IF_ERROR(GetOptional(j, "attn_logit_softcapping", &c->attn_logit_softcapping));
    RETURN_IF_ERROR(GetOptional(j, "final_logit_softcapping", &c->final_logit_softcapping));
    if (c->attn_logit_softcapping < 0 || c->final_logit_softcapping < 0) {
      return Invalid("soft-capping values must be >= 0");
    }
  }
  // Gemma names the activation hidden_activation (and may keep a stale hidden_act beside it).
  std::string act = "silu";
  RETURN_IF_ERROR(GetOptional(j, "hidden_act", &act));
  if (gemma) RETURN_IF_ERROR(GetOptional(j, "hidden_activation", &act));
  if (act != "silu" && !(gemma && act == "gelu_pytorch_tanh")) {
    return absl::UnimplementedError(absl::StrCat("config.json: hidden_act \"", act,
                                                 "\" is not supported (silu; "
                                                 "gelu_pytorch_tanh for Gemma)"));
  }
  c->hidden_act = act;
  return ParseSlidingWindow(j, c);
}

// The mixture-of-experts fields (ModelConfig::num_experts and after): Mixtral's
// num_local_experts (every layer, experts intermediate_size wide, weights always renormalized),
// OLMoE's num_experts (every layer, experts intermediate_size wide, norm_topk_prob),
// Qwen2-MoE's and Qwen3-MoE's num_experts (also spelled num_local_experts, as transformers >= 5
// writes Qwen3-MoE's), moe_intermediate_size, norm_topk_prob, decoder_sparse_step and
// mlp_only_layers (a layer is sparse unless listed there or (l + 1) % step != 0), and Qwen2-MoE's
// shared expert.
absl::Status ParseExperts(const json& j, ModelConfig* c) {
  const std::string& arch = c->architecture;
  const bool mixtral = arch == "MixtralForCausalLM";
  const bool olmoe = arch == "OlmoeForCausalLM";
  if (!mixtral && !olmoe && arch != "Qwen2MoeForCausalLM" && arch != "Qwen3MoeForCausalLM") {
    return absl::OkStatus();
  }
  const char* experts_field = j.contains("num_local_experts") ? "num_local_experts" : "num_experts";
  RETURN_IF_ERROR(GetPositiveInt(j, experts_field, &c->num_experts));
  RETURN_IF_ERROR(GetPositiveInt(j, "num_experts_per_tok", &c->num_experts_per_tok));
  if (c->num_experts_per_tok > c->num_experts) {
    return Invalid(absl::StrCat("\"num_experts_per_tok\" (", c->num_experts_per_tok,
                                ") exceeds the number of experts (", c->num_experts, ")"));
  }
  c->moe_layers.assign(static_cast<size_t>(c->num_hidden_layers), true);
  if (mixtral || olmoe) {
    c->moe_intermediate_size = c->intermediate_size;
    c->norm_topk_prob = mixtral;
    if (olmoe) RETURN_IF_ERROR(GetOptional(j, "norm_topk_prob", &c->norm_topk_prob));
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(GetPositiveInt(j, "moe_intermediate_size", &c->moe_intermediate_size));
  RETURN_IF_ERROR(GetOptional(j, "norm_topk_prob", &c->norm_topk_prob));
  if (arch == "Qwen2MoeForCausalLM") {
    RETURN_IF_ERROR(
        GetOptional(j, "shared_expert_intermediate_size", &c->shared_expert_intermediate_size));
    if (c->shared_expert_intermediate_size < 0) {
      return Invalid("\"shared_expert_intermediate_size\" must be >= 0");
    }
  }
  int step = 1;
  RETURN_IF_ERROR(GetOptional(j, "decoder_sparse_step", &step));
  if (step < 1) return Invalid("\"decoder_sparse_step\" must be >= 1");
  for (int l = 0; l < c->num_hidden_layers; ++l) c->moe_layers[l] = (l + 1) % step == 0;
  if (const json* dense = Member(j, "mlp_only_layers"); dense != nullptr) {
    if (!dense->is_array()) return Invalid("\"mlp_only_layers\" must be a list of layer indices");
    for (const json& l : *dense) {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 ||
          l.get<int64_t>() >= c->num_hidden_layers) {
        return Invalid(absl::StrCat("\"mlp_only_layers\" holds ", l.dump(),
                                    ", not a layer index below num_hidden_layers (",
                                    c->num_hidden_layers, ")"));
      }
      c->moe_layers[l.get<size_t>()] = false;
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
  RETURN_IF_ERROR(ParseRope(j, &c));
  RETURN_IF_ERROR(GetOptional(j, "tie_word_embeddings", &c.tie_word_embeddings));
  RETURN_IF_ERROR(GetOptional(j, "torch_dtype", &c.torch_dtype));
  RETURN_IF_ERROR(GetOptional(j, "dtype", &c.torch_dtype));  // transformers >= 5
  // Qwen2 and Qwen2-MoE have q/k/v biases (Qwen2-MoE's config says so as qkv_bias in
  // transformers >= 5).
  c.attention_bias =
      c.architecture == "Qwen2ForCausalLM" || c.architecture == "Qwen2MoeForCausalLM";
  RETURN_IF_ERROR(GetOptional(j, "attention_bias", &c.attention_bias));
  if (c.architecture == "Qwen2MoeForCausalLM") {
    RETURN_IF_ERROR(GetOptional(j, "qkv_bias", &c.attention_bias));
  }
  bool mlp_bias = false;
  RETURN_IF_ERROR(GetOptional(j, "mlp_bias", &mlp_bias));
  if (mlp_bias) return absl::UnimplementedError("config.json: mlp_bias is not supported");
  RETURN_IF_ERROR(ParseFamilyFeatures(j, &c));
  RETURN_IF_ERROR(ParseExperts(j, &c));
  RETURN_IF_ERROR(ParseTokenIds(j, &c));
  return c;
}

int ModelConfig::MaxIntermediateSize() const {
  int widest = 0;
  for (int l = 0; l < num_hidden_layers; ++l) {
    widest = std::max(widest, IsMoeLayer(l)
                                  ? std::max(moe_intermediate_size, shared_expert_intermediate_size)
                                  : intermediate_size);
  }
  return std::max(widest, num_hidden_layers == 0 ? intermediate_size : 0);
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
