#include "common/gguf_model.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <span>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/gguf_dequant.h"
#include "common/half.h"
#include "common/status_macros.h"

namespace llm {
namespace {

absl::Status Invalid(const GgufFile& f, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("gguf ", f.path(), ": ", std::string(what)));
}

// A positive integer key; `def` (when >= 0) when absent.
absl::Status GetPositive(const GgufFile& f, const std::string& key, int* out, int def = -1) {
  absl::StatusOr<int64_t> v = f.GetInt(key);
  if (absl::IsNotFound(v.status()) && def >= 0) {
    *out = def;
    return absl::OkStatus();
  }
  if (!v.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(v.status().message(), " (a positive integer is required)"));
  }
  if (*v <= 0 || *v > (1 << 30)) {
    return Invalid(f, absl::StrCat(key, ": expected a positive integer, got ", *v));
  }
  *out = static_cast<int>(*v);
  return absl::OkStatus();
}

// HF row r of a q/k projection whose heads have `head_dim` rows -> the GGUF row holding it.
inline int64_t PermutedRow(int64_t r, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  const int64_t head = r / head_dim, w = r % head_dim;
  return head * head_dim + 2 * (w % half) + w / half;
}

void Store(const float* src, int64_t n, StDType dtype, std::byte* dst) {
  switch (dtype) {
    case StDType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      break;
    case StDType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t b = FloatToBf16(src[i]);
        std::memcpy(dst + 2 * i, &b, 2);
      }
      break;
    default:  // kF16
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t b = FloatToHalf(src[i]);
        std::memcpy(dst + 2 * i, &b, 2);
      }
      break;
  }
}

}  // namespace

bool IsGgufPath(std::string_view path) { return path.ends_with(".gguf"); }

GgufTensorRef GgufTensorFor(std::string_view hf, std::string_view arch) {
  if (hf == "model.embed_tokens.weight") return {"token_embd.weight"};
  if (hf == "lm_head.weight") return {"output.weight"};
  if (hf == "model.norm.weight") return {"output_norm.weight"};
  static constexpr std::pair<std::string_view, std::string_view> kLayer[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      // Mixtures of experts: the router and Qwen2-MoE's shared expert.
      {"mlp.gate.weight", "ffn_gate_inp.weight"},
      {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
      {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
      {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
      {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
      {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
  };
  // An expert's projection (Qwen-MoE's names, then Mixtral's) -> the merged tensor.
  static constexpr std::pair<std::string_view, std::string_view> kExperts[] = {
      {"gate_proj.weight", "ffn_gate_exps.weight"}, {"up_proj.weight", "ffn_up_exps.weight"},
      {"down_proj.weight", "ffn_down_exps.weight"}, {"w1.weight", "ffn_gate_exps.weight"},
      {"w3.weight", "ffn_up_exps.weight"},          {"w2.weight", "ffn_down_exps.weight"},
  };
  // Llama's post_attention_layernorm is the MLP's input norm; Gemma's normalizes the
  // attention's output, and pre_feedforward_layernorm is the MLP's input norm.
  static constexpr std::pair<std::string_view, std::string_view> kLlamaNorms[] = {
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
  };
  static constexpr std::pair<std::string_view, std::string_view> kGemmaNorms[] = {
      {"post_attention_layernorm.weight", "post_attention_norm.weight"},
      {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
      {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
  };
  // The number that `s` starts with, up to the next dot, and what follows the dot.
  auto leading_index = [](std::string_view s, int* index, std::string_view* rest) {
    const size_t dot = s.find('.');
    if (dot == std::string_view::npos || dot == 0) return false;
    const auto [ptr, ec] = std::from_chars(s.data(), s.data() + dot, *index);
    if (ec != std::errc() || ptr != s.data() + dot) return false;
    *rest = s.substr(dot + 1);
    return true;
  };
  constexpr std::string_view kPrefix = "model.layers.";
  if (!hf.starts_with(kPrefix)) return {};
  int layer = 0;
  std::string_view rest;
  if (!leading_index(hf.substr(kPrefix.size()), &layer, &rest)) return {};
  auto in_layer = [layer](std::string_view name) {
    return absl::StrCat("blk.", layer, ".", std::string(name));
  };
  for (const auto& [from, to] : kLayer) {
    if (rest == from) return {in_layer(to)};
  }
  for (std::string_view experts : {"mlp.experts.", "block_sparse_moe.experts."}) {
    int expert = 0;
    std::string_view proj;
    if (!rest.starts_with(experts) || !leading_index(rest.substr(experts.size()), &expert, &proj)) {
      continue;
    }
    for (const auto& [from, to] : kExperts) {
      if (proj == from) return {in_layer(to), expert};
    }
  }
  // phi3: ffn_up holds gate_up_proj as is ([2 I, H], gate rows first; llama.cpp's SwiGLU over
  // the fused tensor).
  if (arch == "phi3" && rest == "mlp.gate_up_proj.weight") return {in_layer("ffn_up.weight")};
  const bool gemma = arch.starts_with("gemma");
  using Names = std::span<const std::pair<std::string_view, std::string_view>>;
  for (const auto& [from, to] : gemma ? Names(kGemmaNorms) : Names(kLlamaNorms)) {
    if (rest == from) return {in_layer(to)};
  }
  return {};
}

namespace {

constexpr const char* kGgufArchitectures[] = {"llama", "qwen2",  "qwen3",  "qwen2moe", "qwen3moe",
                                              "olmoe", "gemma2", "gemma3", "phi3"};

// An optional number key into `out`; its error when present but malformed.
absl::Status GetOptionalNumber(const GgufFile& f, const std::string& key, double* out) {
  absl::StatusOr<double> v = f.GetNumber(key);
  if (v.ok()) {
    *out = *v;
    return absl::OkStatus();
  }
  return absl::IsNotFound(v.status()) ? absl::OkStatus() : v.status();
}

// rope_freqs.weight (llama.cpp's converter writes Llama 3.1+'s llama3 rope scaling as one
// factor per frequency), dequantized.
absl::Status ReadRopeFreqs(const GgufFile& f, const GgufTensorInfo& t, int head_dim,
                           std::vector<float>* out) {
  const std::vector<int64_t> shape = t.shape();
  if (shape.size() != 1 || shape[0] != head_dim / 2) {
    return Invalid(
        f, absl::StrCat("rope_freqs.weight must hold head_dim / 2 = ", head_dim / 2, " factors"));
  }
  out->resize(static_cast<size_t>(shape[0]));
  RETURN_IF_ERROR(DequantizeToF32(t.type, f.Bytes(t), *out));
  for (float v : *out) {
    if (!(v > 0) || !std::isfinite(v)) return Invalid(f, "rope_freqs.weight holds a factor <= 0");
  }
  return absl::OkStatus();
}

// phi3's rope_factors_short / rope_factors_long (longrope's factors, rotary_dim / 2 each).
absl::Status ReadRopeFactors(const GgufFile& f, const GgufTensorInfo& t, int rotary_dim,
                             std::vector<double>* out) {
  const std::vector<int64_t> shape = t.shape();
  if (shape.size() != 1 || shape[0] != rotary_dim / 2) {
    return Invalid(
        f, absl::StrCat(t.name, " must hold rotary_dim / 2 = ", rotary_dim / 2, " factors"));
  }
  std::vector<float> v(static_cast<size_t>(shape[0]));
  RETURN_IF_ERROR(DequantizeToF32(t.type, f.Bytes(t), v));
  for (float x : v) {
    if (!(x > 0) || !std::isfinite(x))
      return Invalid(f, absl::StrCat(t.name, " holds a factor <= 0"));
  }
  out->assign(v.begin(), v.end());
  return absl::OkStatus();
}

// A mixture of experts (<arch>.expert_count > 0: Mixtral as llama, qwen2moe, qwen3moe, olmoe),
// as llama.cpp's graphs for these architectures run it: softmax over the router's logits, the top
// <arch>.expert_used_count, renormalized for llama and qwen3moe but not qwen2moe and olmoe (the
// key <arch>.expert_weights_norm, where a file has it, decides), experts
// <arch>.expert_feed_forward_length wide (Mixtral's and OLMoE's: feed_forward_length), Qwen2-MoE's
// shared expert <arch>.expert_shared_feed_forward_length wide. A layer is sparse when it has a
// router (blk.N.ffn_gate_inp), so Qwen2-MoE's mlp_only_layers are dense. What llama.cpp's graphs
// for these architectures do not do (other gating functions, scaled weights, grouped routing, the
// per-expert tensors of old Mixtral files) is refused by name.
absl::Status ReadExperts(const GgufFile& f, ModelConfig* c) {
  const std::string& arch = c->model_type;
  const std::string a = arch + ".";
  // Absent or 0 (some converters write llama.expert_count = 0 for dense models): no experts.
  int experts = 0;
  if (absl::StatusOr<int64_t> count = f.GetInt(a + "expert_count"); count.ok() && *count != 0) {
    RETURN_IF_ERROR(GetPositive(f, a + "expert_count", &experts));
  } else if (!count.ok() && !absl::IsNotFound(count.status())) {
    return count.status();
  }
  const bool moe_arch = arch == "qwen2moe" || arch == "qwen3moe" || arch == "olmoe";
  if (experts == 0) {
    if (moe_arch) return Invalid(f, a + "expert_count is required for " + arch);
    return absl::OkStatus();
  }
  if (arch != "llama" && !moe_arch) {
    return absl::UnimplementedError(absl::StrCat("gguf ", f.path(), ": ", a,
                                                 "expert_count = ", experts,
                                                 ": experts are supported for llama "
                                                 "(Mixtral), qwen2moe, qwen3moe and olmoe"));
  }
  auto unsupported = [&](std::string_view what) {
    return absl::UnimplementedError(absl::StrCat("gguf ", f.path(), ": ", std::string(what)));
  };
  if (f.FindTensor("blk.0.ffn_gate.0.weight") != nullptr) {
    return unsupported(
        "experts stored one tensor each (blk.N.ffn_gate.E.weight, the layout of Mixtral files "
        "converted before llama.cpp merged them) are not supported; convert the model again");
  }
  if (absl::StatusOr<int64_t> gating = f.GetInt(a + "expert_gating_func");
      gating.ok() && *gating != 1) {  // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX
    return unsupported(absl::StrCat(a, "expert_gating_func = ", *gating,
                                    ": only softmax routing (1) is supported"));
  }
  double scale = 1.0;
  RETURN_IF_ERROR(GetOptionalNumber(f, a + "expert_weights_scale", &scale));
  if (scale != 1.0 && scale != 0.0) {  // 0: unset, as llama.cpp reads it
    return unsupported(absl::StrCat(a, "expert_weights_scale = ", scale, " is not supported"));
  }
  // Grouped routing and several shared experts (DeepSeek's) are not these architectures'.
  for (const char* key : {"expert_group_count", "expert_shared_count"}) {
    if (absl::StatusOr<int64_t> v = f.GetInt(a + key); v.ok() && *v > 1) {
      return unsupported(absl::StrCat(a, key, " = ", *v, " is not supported"));
    }
  }
  c->num_experts = experts;
  RETURN_IF_ERROR(GetPositive(f, a + "expert_used_count", &c->num_experts_per_tok));
  if (c->num_experts_per_tok > experts) {
    return Invalid(f, absl::StrCat(a, "expert_used_count (", c->num_experts_per_tok, ") exceeds ",
                                   a, "expert_count (", experts, ")"));
  }
  if (arch == "llama" || arch == "olmoe") {  // experts feed_forward_length wide
    if (arch == "llama") c->architecture = "MixtralForCausalLM";
    c->moe_intermediate_size = c->intermediate_size;
  } else {
    RETURN_IF_ERROR(GetPositive(f, a + "expert_feed_forward_length", &c->moe_intermediate_size));
  }
  c->norm_topk_prob = arch == "llama" || arch == "qwen3moe";
  if (absl::StatusOr<int64_t> norm = f.GetInt(a + "expert_weights_norm"); norm.ok()) {
    c->norm_topk_prob = *norm != 0;
  }
  bool shared = false;  // in any layer: Qwen2-MoE's first layers may be dense
  for (int l = 0; l < c->num_hidden_layers && !shared; ++l) {
    shared = f.FindTensor(absl::StrCat("blk.", l, ".ffn_up_shexp.weight")) != nullptr;
  }
  if (shared) {
    if (arch != "qwen2moe") {
      return unsupported(arch + ": shared experts are supported for qwen2moe only");
    }
    RETURN_IF_ERROR(GetPositive(f, a + "expert_shared_feed_forward_length",
                                &c->shared_expert_intermediate_size));
  }
  c->moe_layers.resize(static_cast<size_t>(c->num_hidden_layers));
  for (int l = 0; l < c->num_hidden_layers; ++l) {
    c->moe_layers[static_cast<size_t>(l)] =
        f.FindTensor(absl::StrCat("blk.", l, ".ffn_gate_inp.weight")) != nullptr;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromGguf(const GgufFile& f) {
  ASSIGN_OR_RETURN(std::string arch, f.GetString("general.architecture"));
  if (std::find(std::begin(kGgufArchitectures), std::end(kGgufArchitectures), arch) ==
      std::end(kGgufArchitectures)) {
    return absl::UnimplementedError(
        absl::StrCat("gguf ", f.path(), ": general.architecture \"", arch, "\" is not supported (",
                     absl::StrJoin(kGgufArchitectures, ", "),
                     "; llama covers Llama 2/3.x, SmolLM2, Mistral and Mixtral)"));
  }
  const std::string a = arch + ".";
  ModelConfig c;
  c.model_type = arch;
  c.architecture = arch == "llama"      ? "LlamaForCausalLM"
                   : arch == "qwen2"    ? "Qwen2ForCausalLM"
                   : arch == "qwen3"    ? "Qwen3ForCausalLM"
                   : arch == "qwen2moe" ? "Qwen2MoeForCausalLM"
                   : arch == "qwen3moe" ? "Qwen3MoeForCausalLM"
                   : arch == "olmoe"    ? "OlmoeForCausalLM"
                   : arch == "gemma2"   ? "Gemma2ForCausalLM"
                   : arch == "gemma3"   ? "Gemma3ForCausalLM"
                                        : "Phi3ForCausalLM";
  RETURN_IF_ERROR(GetPositive(f, a + "embedding_length", &c.hidden_size));
  RETURN_IF_ERROR(GetPositive(f, a + "feed_forward_length", &c.intermediate_size));
  RETURN_IF_ERROR(GetPositive(f, a + "block_count", &c.num_hidden_layers));
  RETURN_IF_ERROR(GetPositive(f, a + "attention.head_count", &c.num_attention_heads));
  RETURN_IF_ERROR(
      GetPositive(f, a + "attention.head_count_kv", &c.num_key_value_heads, c.num_attention_heads));
  RETURN_IF_ERROR(GetPositive(f, a + "context_length", &c.max_position_embeddings));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return Invalid(f, absl::StrCat(a, "attention.head_count (", c.num_attention_heads,
                                   ") must be a multiple of ", a, "attention.head_count_kv (",
                                   c.num_key_value_heads, ")"));
  }
  int def_head_dim = c.hidden_size / c.num_attention_heads;
  RETURN_IF_ERROR(GetPositive(f, a + "attention.key_length", &c.head_dim, def_head_dim));
  int value_dim = 0;
  RETURN_IF_ERROR(GetPositive(f, a + "attention.value_length", &value_dim, c.head_dim));
  if (value_dim != c.head_dim) {
    return absl::UnimplementedError(absl::StrCat("gguf ", f.path(), ": ", a,
                                                 "attention.value_length ", value_dim,
                                                 " differs from the key length ", c.head_dim));
  }
  if (c.head_dim % 2 != 0) return Invalid(f, absl::StrCat("head dim ", c.head_dim, " is odd"));
  int rot = 0;
  RETURN_IF_ERROR(GetPositive(f, a + "rope.dimension_count", &rot, c.head_dim));
  if (rot != c.head_dim) {
    // Partial rotary: phi3 only (Phi-4-mini's 96 of 128), as for config.json.
    if (arch != "phi3") {
      return absl::UnimplementedError(absl::StrCat(
          "gguf ", f.path(), ": ", a, "rope.dimension_count ", rot, " differs from the head dim ",
          c.head_dim, " (partial rotary is supported for phi3 only)"));
    }
    if (rot > c.head_dim || rot % 2 != 0) {
      return Invalid(f, absl::StrCat(a, "rope.dimension_count ", rot,
                                     " must be even and <= the head dim ", c.head_dim));
    }
    c.rotary_dim = rot;
  }
  RETURN_IF_ERROR(GetOptionalNumber(f, a + "attention.layer_norm_rms_epsilon", &c.rms_norm_eps));
  if (!(c.rms_norm_eps > 0)) return Invalid(f, a + "attention.layer_norm_rms_epsilon must be > 0");
  RETURN_IF_ERROR(GetOptionalNumber(f, a + "rope.freq_base", &c.rope_theta));
  if (!(c.rope_theta > 0)) return Invalid(f, a + "rope.freq_base must be > 0");
  if (absl::StatusOr<std::string> type = f.GetString(a + "rope.scaling.type"); type.ok()) {
    if (*type == "linear") {
      c.rope_scaling.type = "linear";
      ASSIGN_OR_RETURN(c.rope_scaling.factor, f.GetNumber(a + "rope.scaling.factor"));
      if (!(c.rope_scaling.factor >= 1.0))
        return Invalid(f, a + "rope.scaling.factor must be >= 1");
    } else if (*type != "none") {
      return absl::UnimplementedError(absl::StrCat("gguf ", f.path(), ": ", a,
                                                   "rope.scaling.type \"", *type,
                                                   "\" is not supported (none or linear)"));
    }
  }
  if (const GgufTensorInfo* freqs = f.FindTensor("rope_freqs.weight"); freqs != nullptr) {
    RETURN_IF_ERROR(ReadRopeFreqs(f, *freqs, c.head_dim, &c.rope_freq_factors));
  }
  if (arch == "phi3") {
    // What llama.cpp's converter writes for Phi-3: qkv_proj as attn_qkv and gate_up_proj as
    // ffn_up (no permutation: NeoX-style rotary), and for longrope models the two factor
    // tensors, the original context length and the attention factor (computed when absent, as
    // transformers does from context_length / original_context_length).
    c.fused_qkv = f.FindTensor("blk.0.attn_qkv.weight") != nullptr;
    c.fused_gate_up = f.FindTensor("blk.0.ffn_gate.weight") == nullptr;
    const GgufTensorInfo* lng = f.FindTensor("rope_factors_long.weight");
    const GgufTensorInfo* shrt = f.FindTensor("rope_factors_short.weight");
    if ((lng == nullptr) != (shrt == nullptr)) {
      return Invalid(f, "rope_factors_long.weight and rope_factors_short.weight come together");
    }
    if (lng != nullptr) {
      RopeScaling& rs = c.rope_scaling;
      rs.type = "longrope";
      RETURN_IF_ERROR(ReadRopeFactors(f, *shrt, c.RotaryDim(), &rs.short_factor));
      RETURN_IF_ERROR(ReadRopeFactors(f, *lng, c.RotaryDim(), &rs.long_factor));
      RETURN_IF_ERROR(GetPositive(f, a + "rope.scaling.original_context_length",
                                  &rs.original_max_position_embeddings, 4096));
      const double original = rs.original_max_position_embeddings;
      rs.factor = c.max_position_embeddings / original;
      rs.attention_factor = rs.factor <= 1.0 || original <= 1
                                ? 1.0
                                : std::sqrt(1.0 + std::log(rs.factor) / std::log(original));
      RETURN_IF_ERROR(GetOptionalNumber(f, a + "rope.scaling.attn_factor", &rs.attention_factor));
      if (!(rs.attention_factor > 0)) return Invalid(f, a + "rope.scaling.attn_factor must be > 0");
    }
  }
  // Vocabulary: <arch>.vocab_size, else the token list's length, else the embedding's rows.
  const GgufTensorInfo* embd = f.FindTensor("token_embd.weight");
  if (embd == nullptr) return Invalid(f, "no tensor token_embd.weight");
  if (embd->dims.size() != 2) return Invalid(f, "token_embd.weight is not 2-D");
  const GgufValue* tokens = f.Find("tokenizer.ggml.tokens");
  int from_tokens = tokens != nullptr ? static_cast<int>(tokens->array.size()) : 0;
  RETURN_IF_ERROR(GetPositive(f, a + "vocab_size", &c.vocab_size,
                              from_tokens > 0 ? from_tokens : static_cast<int>(embd->dims[1])));
  c.tie_word_embeddings = f.FindTensor("output.weight") == nullptr;
  c.attention_bias = f.FindTensor("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = f.FindTensor("blk.0.attn_q_norm.weight") != nullptr;
  c.qk_norm_whole = c.qk_norm && arch == "olmoe";  // [n_embd], as llama.cpp's olmoe graph
  int window = 0;
  RETURN_IF_ERROR(GetPositive(f, a + "attention.sliding_window", &window, 0));
  if (window > 0 && window < c.max_position_embeddings) c.sliding_window = window;
  if (arch == "gemma2" || arch == "gemma3") {
    // What llama.cpp's Gemma graphs do beside the keys: GeGLU, embeddings scaled by
    // sqrt(hidden), four norms per layer (their weights already hold Gemma's + 1), the
    // attention scale from the head size (from hidden / heads for the 27B models), and the
    // layer pattern: every other layer sliding from the first (Gemma 2), five sliding to one
    // global with a local rope base of 10000 (Gemma 3).
    c.hidden_act = "gelu_pytorch_tanh";
    c.scale_embeddings = true;
    c.sandwich_norms = true;
    c.query_pre_attn_scalar = c.num_hidden_layers == (arch == "gemma2" ? 46 : 62)
                                  ? static_cast<double>(c.hidden_size) / c.num_attention_heads
                                  : c.head_dim;
    RETURN_IF_ERROR(GetOptionalNumber(f, a + "attn_logit_softcapping", &c.attn_logit_softcapping));
    RETURN_IF_ERROR(
        GetOptionalNumber(f, a + "final_logit_softcapping", &c.final_logit_softcapping));
    if (c.sliding_window > 0) {
      const int pattern = arch == "gemma2" ? 2 : 6;
      for (int l = 0; l < c.num_hidden_layers; ++l) c.sliding_layers.push_back((l + 1) % pattern);
    }
    if (arch == "gemma3") c.rope_local_theta = 10000.0;
  }
  RETURN_IF_ERROR(ReadExperts(f, &c));
  if (absl::StatusOr<int64_t> bos = f.GetInt("tokenizer.ggml.bos_token_id"); bos.ok()) {
    c.bos_token_id = static_cast<int>(*bos);
  }
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    if (absl::StatusOr<int64_t> id = f.GetInt(key); id.ok()) {
      if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), *id) == c.eos_token_ids.end()) {
        c.eos_token_ids.push_back(static_cast<int>(*id));
      }
    }
  }
  return c;
}

absl::StatusOr<std::unique_ptr<GgufWeights>> GgufWeights::Open(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  ASSIGN_OR_RETURN(std::unique_ptr<GgufWeights> w, FromFile(file.get()));
  w->owned_ = std::move(file);
  return w;
}

absl::StatusOr<std::unique_ptr<GgufWeights>> GgufWeights::FromFile(const GgufFile* file) {
  ASSIGN_OR_RETURN(ModelConfig c, ModelConfig::FromGguf(*file));
  std::unique_ptr<GgufWeights> w(new GgufWeights());
  w->file_ = file;
  w->n_head_ = c.num_attention_heads;
  w->n_head_kv_ = c.num_key_value_heads;
  w->arch_ = c.model_type;
  return w;
}

absl::StatusOr<GgufWeights::Stored> GgufWeights::Find(std::string_view hf) const {
  const GgufTensorRef ref = GgufTensorFor(hf, arch_);
  Stored s;
  s.info = ref.name.empty() ? nullptr : file_->FindTensor(ref.name);
  // --fuse-gate-up-exps: each expert's gate rows, then its up rows, in one tensor.
  int fused_half = -1;  // 0: the gate rows, 1: the up rows
  if (s.info == nullptr && ref.expert >= 0) {
    for (const auto& [part, half] : {std::pair{"ffn_gate_exps.", 0}, {"ffn_up_exps.", 1}}) {
      const size_t at = ref.name.find(part);
      if (at == std::string::npos) continue;
      std::string fused = ref.name;
      fused.replace(at, std::strlen(part), "ffn_gate_up_exps.");
      s.info = file_->FindTensor(fused);
      fused_half = half;
    }
  }
  if (s.info == nullptr) {
    return absl::NotFoundError(absl::StrCat("tensor ", std::string(hf), " (gguf ",
                                            ref.name.empty() ? "none" : ref.name, ") is not in ",
                                            file_->path()));
  }
  s.what = absl::StrCat("gguf ", file_->path(), ": tensor ", s.info->name);
  std::vector<int64_t> shape = s.info->shape();
  s.data = file_->Bytes(*s.info);
  if (ref.expert >= 0) {
    absl::StrAppend(&s.what, " expert ", ref.expert);
    if (shape.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          s.what, ": shape [", absl::StrJoin(shape, ", "), "] is not [experts, rows, columns]"));
    }
    if (ref.expert >= shape[0]) {
      return absl::NotFoundError(absl::StrCat(s.what, ": the tensor holds ", shape[0], " experts"));
    }
    const auto [block, block_bytes] = GgmlBlockLayout(s.info->type);
    if (block <= 0 || shape[2] % block != 0) {
      return absl::InvalidArgumentError(absl::StrCat(s.what, ": rows of ", shape[2],
                                                     " are not whole blocks of type ",
                                                     GgmlTypeName(s.info->type)));
    }
    const size_t expert_bytes = static_cast<size_t>(shape[1] * (shape[2] / block) * block_bytes);
    s.data = s.data.subspan(static_cast<size_t>(ref.expert) * expert_bytes, expert_bytes);
    shape = {shape[1], shape[2]};
    if (fused_half >= 0) {
      if (shape[0] % 2 != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(s.what, ": an odd number of gate and up rows (", shape[0], ")"));
      }
      shape[0] /= 2;
      s.first_row = fused_half * shape[0];
    }
  } else if (shape.size() == 1 && s.info->name.ends_with("ffn_gate_inp_shexp.weight")) {
    shape = {1, shape[0]};  // llama.cpp's [H]; Hugging Face's [1, H]
  }
  // q/k rows come back in Hugging Face order (llama.cpp permutes them for the llama
  // architecture only: the others use NeoX-style rotary, as Hugging Face does).
  if (arch_ == "llama" && absl::StrContains(s.info->name, "attn_q.")) {
    s.permute_head_dim = shape[0] / n_head_;
  } else if (arch_ == "llama" && absl::StrContains(s.info->name, "attn_k.")) {
    s.permute_head_dim = shape[0] / n_head_kv_;
  }
  s.shape = std::move(shape);
  return s;
}

absl::StatusOr<std::vector<int64_t>> GgufWeights::Shape(std::string_view name) const {
  ASSIGN_OR_RETURN(Stored s, Find(name));
  return std::move(s.shape);
}

absl::StatusOr<GgmlType> GgufWeights::TensorType(std::string_view name) const {
  ASSIGN_OR_RETURN(const Stored s, Find(name));
  return s.info->type;
}

absl::Status GgufWeights::ReadBlocks(std::string_view name, int dim, int64_t begin, int64_t end,
                                     std::vector<uint8_t>* out) const {
  ASSIGN_OR_RETURN(const Stored s, Find(name));
  const std::vector<int64_t>& shape = s.shape;
  if (shape.size() != 2 || dim < 0 || dim > 1) {
    return absl::InvalidArgumentError(absl::StrCat(s.what, ": cannot read blocks of dimension ",
                                                   dim, " of a ", shape.size(), "-D tensor"));
  }
  if (begin < 0 || end < begin || end > shape[dim]) {
    return absl::InvalidArgumentError(absl::StrCat(s.what, ": slice [", begin, ", ", end,
                                                   ") is out of range [0, ", shape[dim], ")"));
  }
  const auto [block, block_bytes] = GgmlBlockLayout(s.info->type);
  if (dim == 1 && (begin % block != 0 || end % block != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.what, ": columns [", begin, ", ", end, ") do not fall on the ",
                     GgmlTypeName(s.info->type), " blocks of ", block, " weights"));
  }
  const size_t row_bytes = static_cast<size_t>(shape[1] / block * block_bytes);
  const int64_t r0 = dim == 0 ? begin : 0, r1 = dim == 0 ? end : shape[0];
  const size_t c0 = dim == 0 ? 0 : static_cast<size_t>(begin / block * block_bytes);
  const size_t bytes =
      dim == 0 ? row_bytes : static_cast<size_t>((end - begin) / block * block_bytes);
  out->resize(static_cast<size_t>(r1 - r0) * bytes);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t src =
        s.first_row + (s.permute_head_dim > 0 ? PermutedRow(r, s.permute_head_dim) : r);
    std::memcpy(out->data() + static_cast<size_t>(r - r0) * bytes,
                s.data.data() + static_cast<size_t>(src) * row_bytes + c0, bytes);
  }
  return absl::OkStatus();
}

absl::Status GgufWeights::ReadSlice(std::string_view name, int dim, int64_t begin, int64_t end,
                                    StDType out_dtype, std::span<std::byte> out) const {
  ASSIGN_OR_RETURN(const Stored s, Find(name));
  const GgmlType type = s.info->type;
  if (!GgmlTypeCanDequantize(type)) {
    return absl::InvalidArgumentError(absl::StrCat(s.what, ": type ", GgmlTypeName(type),
                                                   " is not supported (", kGgmlDequantizableTypes,
                                                   ")"));
  }
  if (out_dtype != StDType::kF32 && out_dtype != StDType::kF16 && out_dtype != StDType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(s.what, ": output dtype ",
                                                   std::string(StDTypeName(out_dtype)),
                                                   " is not F32, F16 or BF16"));
  }
  const std::vector<int64_t>& shape = s.shape;
  if (shape.size() > 2 || dim < 0 || dim >= static_cast<int>(shape.size())) {
    return absl::InvalidArgumentError(absl::StrCat(s.what, ": cannot slice dimension ", dim,
                                                   " of a ", shape.size(), "-D tensor"));
  }
  if (begin < 0 || end < begin || end > shape[dim]) {
    return absl::InvalidArgumentError(absl::StrCat(s.what, ": slice [", begin, ", ", end,
                                                   ") is out of range [0, ", shape[dim], ")"));
  }
  const int64_t rows = shape.size() == 2 ? shape[0] : 1;
  const int64_t cols = shape.back();
  const int64_t out_rows = dim == 0 && shape.size() == 2 ? end - begin : rows;
  const int64_t out_cols = dim == 0 && shape.size() == 2 ? cols : end - begin;
  const size_t esize = StDTypeSize(out_dtype);
  if (out.size() != static_cast<size_t>(out_rows * out_cols) * esize) {
    return absl::InvalidArgumentError(absl::StrCat(
        s.what, ": the slice is ", out_rows * out_cols * esize, " bytes, the buffer ", out.size()));
  }
  const auto [block, block_bytes] = GgmlBlockLayout(type);
  const size_t row_bytes = static_cast<size_t>(cols / block * block_bytes);
  std::vector<float> row(static_cast<size_t>(cols));
  if (shape.size() == 1) {
    RETURN_IF_ERROR(DequantizeToF32(type, s.data, row));
    if (s.permute_head_dim > 0) {
      std::vector<float> hf(row.size());
      for (int64_t r = 0; r < cols; ++r) hf[r] = row[PermutedRow(r, s.permute_head_dim)];
      row.swap(hf);
    }
    Store(row.data() + begin, end - begin, out_dtype, out.data());
    return absl::OkStatus();
  }
  const int64_t r0 = dim == 0 ? begin : 0, r1 = dim == 0 ? end : rows;
  const int64_t c0 = dim == 0 ? 0 : begin;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t src =
        s.first_row + (s.permute_head_dim > 0 ? PermutedRow(r, s.permute_head_dim) : r);
    RETURN_IF_ERROR(DequantizeToF32(
        type, s.data.subspan(static_cast<size_t>(src) * row_bytes, row_bytes), row));
    Store(row.data() + c0, out_cols, out_dtype,
          out.data() + static_cast<size_t>((r - r0) * out_cols) * esize);
  }
  return absl::OkStatus();
}

}  // namespace llm
