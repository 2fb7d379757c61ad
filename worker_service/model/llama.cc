#include "worker_service/model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "worker_service/parallel/communicator.h"

namespace llm {
namespace {

absl::Status FromOp(ops::OpStatus s) {
  return s.ok() ? absl::OkStatus() : absl::InternalError(s.message);
}

TensorView View(float* data, std::initializer_list<int64_t> shape) {
  return TensorView::Contiguous(data, DType::kF32, shape);
}

template <typename T>
TensorView ConstView(std::span<const T> v, DType dtype) {
  return TensorView::Contiguous(const_cast<T*>(v.data()), dtype, {static_cast<int64_t>(v.size())});
}

HostTensor Zeros(std::initializer_list<int64_t> shape) {
  HostTensor t(DType::kF32, shape);
  std::memset(t.data<float>(), 0, t.view().nbytes());
  return t;
}

}  // namespace

LlamaModel::LlamaModel(const ModelConfig& config, Communicator* comm)
    : config_(config), comm_(comm) {
  if (comm != nullptr) {
    rank_ = comm->rank();
    world_ = comm->world_size();
  }
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& model_dir,
                                                             const ModelConfig& config,
                                                             Communicator* comm) {
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsModel> weights, SafetensorsModel::Open(model_dir));
  return Load(*weights, config, comm);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const SafetensorsModel& weights,
                                                             const ModelConfig& config,
                                                             Communicator* comm) {
  ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> m, Make(config, comm));
  RETURN_IF_ERROR(m->LoadWeights(&weights, 0));
  return m;
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::CreateRandom(const ModelConfig& config,
                                                                     uint64_t seed,
                                                                     Communicator* comm) {
  ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> m, Make(config, comm));
  RETURN_IF_ERROR(m->LoadWeights(nullptr, seed));
  return m;
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Make(const ModelConfig& config,
                                                             Communicator* comm) {
  std::unique_ptr<LlamaModel> m(new LlamaModel(config, comm));
  const int w = m->world_, hq = config.num_attention_heads, hkv = config.num_key_value_heads;
  if (hq % w != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_attention_heads (", hq,
                                                   ") is not divisible by the tensor-parallel "
                                                   "size (",
                                                   w, ")"));
  }
  if (hkv % w != 0 && w % hkv != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_key_value_heads (", hkv,
                                                   ") and the tensor-parallel size (", w,
                                                   ") must divide one another"));
  }
  if (config.intermediate_size % w != 0) {
    return absl::InvalidArgumentError(absl::StrCat("intermediate_size (", config.intermediate_size,
                                                   ") is not divisible by the tensor-parallel "
                                                   "size (",
                                                   w, ")"));
  }
  m->local_q_heads_ = hq / w;
  if (hkv >= w) {
    m->local_kv_heads_ = hkv / w;
    m->first_kv_head_ = m->rank_ * m->local_kv_heads_;
  } else {
    m->local_kv_heads_ = 1;
    m->first_kv_head_ = m->rank_ / (w / hkv);
  }
  m->local_intermediate_ = config.intermediate_size / w;
  m->vocab_per_rank_ = (config.vocab_size + w - 1) / w;
  m->rope_.theta = config.rope_theta;
  m->rope_.rotary_dim = config.head_dim;
  const RopeScaling& rs = config.rope_scaling;
  if (rs.type == "linear") m->rope_.scaling.type = ops::RopeScaling::Type::kLinear;
  if (rs.type == "llama3") m->rope_.scaling.type = ops::RopeScaling::Type::kLlama3;
  m->rope_.scaling.factor = rs.factor;
  m->rope_.scaling.low_freq_factor = rs.low_freq_factor;
  m->rope_.scaling.high_freq_factor = rs.high_freq_factor;
  m->rope_.scaling.original_max_position_embeddings = rs.original_max_position_embeddings;
  return m;
}

absl::Status LlamaModel::LoadWeights(const SafetensorsModel* weights, uint64_t seed) {
  const int64_t h = config_.hidden_size, d = config_.head_dim, i_local = local_intermediate_;
  uint64_t state = seed * 0x9e3779b97f4a7c15ULL + 1;
  // Reads rows [begin, end) (dim 0) or columns (dim 1) of a 2-D weight, or a 1-D slice; or
  // fills them with uniform values in [-0.05, 0.05) when there are no weights.
  auto read = [&](const std::string& name, int dim, int64_t begin, int64_t end,
                  std::initializer_list<int64_t> shape, float* out) -> absl::Status {
    int64_t numel = 1;
    for (int64_t s : shape) numel *= s;
    if (weights == nullptr) {
      for (int64_t i = 0; i < numel; ++i) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;  // xorshift64
        out[i] = static_cast<float>(static_cast<double>(state >> 11) * 0x1.0p-53 - 0.5) * 0.1f;
      }
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(SafetensorsModel::Entry e, weights->Find(name));
    if (begin < 0) return weights->ReadAsF32(name, std::span<float>(out, numel));
    if (e.info->shape.empty() || (dim == 1 && e.info->shape.size() != 2)) {
      return absl::InvalidArgumentError(absl::StrCat(name, " has an unexpected shape"));
    }
    return weights->ReadSliceAsF32(name, dim, begin, end, std::span<float>(out, numel));
  };
  auto whole = [&](const std::string& name, std::initializer_list<int64_t> shape,
                   HostTensor* t) -> absl::Status {
    *t = HostTensor(DType::kF32, shape);
    if (weights == nullptr) return read(name, 0, -1, -1, shape, t->data<float>());
    ASSIGN_OR_RETURN(SafetensorsModel::Entry e, weights->Find(name));
    if (e.info->shape != std::vector<int64_t>(shape)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " has shape [", absl::StrJoin(e.info->shape, ", "),
                       "]; the config implies [", absl::StrJoin(shape, ", "), "]"));
    }
    return read(name, 0, -1, -1, shape, t->data<float>());
  };

  // Vocab-parallel embedding: this rank's rows, then zeros (padding and the "other rank" row).
  const int64_t vp = vocab_per_rank_;
  const int64_t v0 = static_cast<int64_t>(rank_) * vp;
  const int64_t v1 = std::min<int64_t>(v0 + vp, config_.vocab_size);
  embed_ = Zeros({vp + 1, h});
  if (v1 > v0) {
    RETURN_IF_ERROR(
        read("model.embed_tokens.weight", 0, v0, v1, {v1 - v0, h}, embed_.data<float>()));
  }
  if (!config_.tie_word_embeddings) {
    lm_head_ = Zeros({vp, h});
    if (v1 > v0) {
      RETURN_IF_ERROR(read("lm_head.weight", 0, v0, v1, {v1 - v0, h}, lm_head_.data<float>()));
    }
  }
  RETURN_IF_ERROR(whole("model.norm.weight", {h}, &final_norm_));

  const int64_t q0 = static_cast<int64_t>(rank_) * local_q_heads_ * d;
  const int64_t q1 = q0 + local_q_heads_ * d;
  const int64_t k0 = static_cast<int64_t>(first_kv_head_) * d;
  const int64_t k1 = k0 + local_kv_heads_ * d;
  const int64_t m0 = static_cast<int64_t>(rank_) * i_local;
  layers_.resize(config_.num_hidden_layers);
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    Layer& L = layers_[l];
    const std::string p = absl::StrCat("model.layers.", l, ".");
    RETURN_IF_ERROR(whole(p + "input_layernorm.weight", {h}, &L.input_norm));
    RETURN_IF_ERROR(whole(p + "post_attention_layernorm.weight", {h}, &L.post_norm));
    L.q_proj = HostTensor(DType::kF32, {q1 - q0, h});
    L.k_proj = HostTensor(DType::kF32, {k1 - k0, h});
    L.v_proj = HostTensor(DType::kF32, {k1 - k0, h});
    RETURN_IF_ERROR(
        read(p + "self_attn.q_proj.weight", 0, q0, q1, {q1 - q0, h}, L.q_proj.data<float>()));
    RETURN_IF_ERROR(
        read(p + "self_attn.k_proj.weight", 0, k0, k1, {k1 - k0, h}, L.k_proj.data<float>()));
    RETURN_IF_ERROR(
        read(p + "self_attn.v_proj.weight", 0, k0, k1, {k1 - k0, h}, L.v_proj.data<float>()));
    if (config_.attention_bias) {
      L.q_bias = HostTensor(DType::kF32, {q1 - q0});
      L.k_bias = HostTensor(DType::kF32, {k1 - k0});
      L.v_bias = HostTensor(DType::kF32, {k1 - k0});
      RETURN_IF_ERROR(
          read(p + "self_attn.q_proj.bias", 0, q0, q1, {q1 - q0}, L.q_bias.data<float>()));
      RETURN_IF_ERROR(
          read(p + "self_attn.k_proj.bias", 0, k0, k1, {k1 - k0}, L.k_bias.data<float>()));
      RETURN_IF_ERROR(
          read(p + "self_attn.v_proj.bias", 0, k0, k1, {k1 - k0}, L.v_bias.data<float>()));
    }
    L.o_proj = HostTensor(DType::kF32, {h, q1 - q0});
    RETURN_IF_ERROR(
        read(p + "self_attn.o_proj.weight", 1, q0, q1, {h, q1 - q0}, L.o_proj.data<float>()));
    L.gate_up_proj = HostTensor(DType::kF32, {2 * i_local, h});
    RETURN_IF_ERROR(read(p + "mlp.gate_proj.weight", 0, m0, m0 + i_local, {i_local, h},
                         L.gate_up_proj.data<float>()));
    RETURN_IF_ERROR(read(p + "mlp.up_proj.weight", 0, m0, m0 + i_local, {i_local, h},
                         L.gate_up_proj.data<float>() + i_local * h));
    L.down_proj = HostTensor(DType::kF32, {h, i_local});
    RETURN_IF_ERROR(read(p + "mlp.down_proj.weight", 1, m0, m0 + i_local, {h, i_local},
                         L.down_proj.data<float>()));
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::AllReduce(const TensorView& t) {
  if (world_ == 1) return absl::OkStatus();
  return comm_->AllReduceSum(t.data_as<float>(), static_cast<size_t>(t.numel()));
}

absl::Status LlamaModel::Forward(const ForwardInput& in, std::span<const LayerKvCache> caches,
                                 HostTensor* logits) {
  // The ops run on the communicator's stream (null for host communicators and for world size
  // 1 without one): one ordered stream for kernels, copies and collectives.
  ops::OpContext ctx;
  ctx.stream = comm_ != nullptr ? comm_->stream() : nullptr;
  const int64_t t = static_cast<int64_t>(in.token_ids.size());
  const int64_t s = static_cast<int64_t>(in.seq_lens.size());
  const int64_t h = config_.hidden_size, d = config_.head_dim;
  const int64_t qh = local_q_heads_, kvh = local_kv_heads_, il = local_intermediate_;
  const int64_t vp = vocab_per_rank_;
  if (static_cast<int>(caches.size()) != config_.num_hidden_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(caches.size(), " KV caches for ", config_.num_hidden_layers, " layers"));
  }
  if (in.positions.size() != in.token_ids.size() || in.slot_mapping.size() != in.token_ids.size()) {
    return absl::InvalidArgumentError("token_ids, positions and slot_mapping differ in length");
  }
  if (in.query_start_loc.size() != in.seq_lens.size() + 1 ||
      in.block_tables.size() != static_cast<size_t>(s * in.max_blocks)) {
    return absl::InvalidArgumentError("attention metadata sizes are inconsistent");
  }
  for (int32_t id : in.token_ids) {
    if (id < 0 || id >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", id, " is outside the vocabulary [0, ", config_.vocab_size, ")"));
    }
  }

  // Vocab-parallel lookup: ids outside this rank's range read the zero row vp.
  std::vector<int32_t> local_ids(t);
  const int64_t v0 = static_cast<int64_t>(rank_) * vp;
  for (int64_t i = 0; i < t; ++i) {
    const int64_t id = in.token_ids[i] - v0;
    local_ids[i] = (id >= 0 && id < vp) ? static_cast<int32_t>(id) : static_cast<int32_t>(vp);
  }
  HostTensor x(DType::kF32, {t, h}), residual(DType::kF32, {t, h});
  RETURN_IF_ERROR(FromOp(
      ops::Embedding(ctx, x.view(), ConstView<int32_t>(local_ids, DType::kI32), embed_.view())));
  RETURN_IF_ERROR(AllReduce(x.view()));

  const TensorView positions = ConstView(in.positions, DType::kI32);
  const TensorView slots = ConstView(in.slot_mapping, DType::kI64);
  ops::AttentionMetadata meta;
  meta.block_tables = TensorView::Contiguous(const_cast<int32_t*>(in.block_tables.data()),
                                             DType::kI32, {s, in.max_blocks});
  meta.seq_lens = ConstView(in.seq_lens, DType::kI32);
  meta.query_start_loc = ConstView(in.query_start_loc, DType::kI32);
  meta.max_seq_len = s == 0 ? 0 : *std::max_element(in.seq_lens.begin(), in.seq_lens.end());
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));

  HostTensor q(DType::kF32, {t, qh, d}), k(DType::kF32, {t, kvh, d}), v(DType::kF32, {t, kvh, d});
  HostTensor attn(DType::kF32, {t, qh, d}), gate_up(DType::kF32, {t, 2 * il});
  HostTensor act(DType::kF32, {t, il});
  const TensorView q2 = View(q.data<float>(), {t, qh * d});
  const TensorView k2 = View(k.data<float>(), {t, kvh * d});
  const TensorView v2 = View(v.data<float>(), {t, kvh * d});
  const TensorView attn2 = View(attn.data<float>(), {t, qh * d});
  const TensorView none;

  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    const Layer& L = layers_[l];
    if (l == 0) {
      std::memcpy(residual.data<float>(), x.data<float>(), x.view().nbytes());
      RETURN_IF_ERROR(FromOp(ops::RmsNorm(ctx, x.view(), x.view(), L.input_norm.view(),
                                          static_cast<float>(config_.rms_norm_eps))));
    } else {
      RETURN_IF_ERROR(
          FromOp(ops::FusedAddRmsNorm(ctx, x.view(), residual.view(), L.input_norm.view(),
                                      static_cast<float>(config_.rms_norm_eps))));
    }
    const bool bias = config_.attention_bias;
    RETURN_IF_ERROR(
        FromOp(ops::Linear(ctx, q2, x.view(), L.q_proj.view(), bias ? L.q_bias.view() : none)));
    RETURN_IF_ERROR(
        FromOp(ops::Linear(ctx, k2, x.view(), L.k_proj.view(), bias ? L.k_bias.view() : none)));
    RETURN_IF_ERROR(
        FromOp(ops::Linear(ctx, v2, x.view(), L.v_proj.view(), bias ? L.v_bias.view() : none)));
    RETURN_IF_ERROR(FromOp(ops::RotaryEmbedding(ctx, positions, q.view(), k.view(), rope_)));
    RETURN_IF_ERROR(FromOp(
        ops::ReshapeAndCache(ctx, k.view(), v.view(), caches[l].key, caches[l].value, slots)));
    RETURN_IF_ERROR(FromOp(ops::PagedAttention(ctx, attn.view(), q.view(), caches[l].key,
                                               caches[l].value, meta, scale)));
    RETURN_IF_ERROR(FromOp(ops::Linear(ctx, x.view(), attn2, L.o_proj.view(), none)));
    RETURN_IF_ERROR(AllReduce(x.view()));
    RETURN_IF_ERROR(FromOp(ops::FusedAddRmsNorm(ctx, x.view(), residual.view(), L.post_norm.view(),
                                                static_cast<float>(config_.rms_norm_eps))));
    RETURN_IF_ERROR(
        FromOp(ops::Linear(ctx, gate_up.view(), x.view(), L.gate_up_proj.view(), none)));
    RETURN_IF_ERROR(FromOp(ops::SiluAndMul(ctx, act.view(), gate_up.view())));
    RETURN_IF_ERROR(FromOp(ops::Linear(ctx, x.view(), act.view(), L.down_proj.view(), none)));
    RETURN_IF_ERROR(AllReduce(x.view()));
  }
  RETURN_IF_ERROR(FromOp(ops::FusedAddRmsNorm(ctx, x.view(), residual.view(), final_norm_.view(),
                                              static_cast<float>(config_.rms_norm_eps))));

  // The rows that sample, then this rank's slice of the vocabulary, then all of it.
  const int64_t n = static_cast<int64_t>(in.logits_indices.size());
  HostTensor selected(DType::kF32, {n, h});
  RETURN_IF_ERROR(FromOp(
      ops::Embedding(ctx, selected.view(), ConstView(in.logits_indices, DType::kI32), x.view())));
  const TensorView head =
      config_.tie_word_embeddings ? View(embed_.data<float>(), {vp, h}) : lm_head_.view();
  HostTensor local(DType::kF32, {n, vp});
  RETURN_IF_ERROR(FromOp(ops::Linear(ctx, local.view(), selected.view(), head, none)));
  const int64_t vocab = config_.vocab_size;
  *logits = HostTensor(DType::kF32, {n, vocab});
  if (world_ == 1) {
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(logits->data<float>() + r * vocab, local.data<float>() + r * vp,
                  vocab * sizeof(float));
    }
    return absl::OkStatus();
  }
  HostTensor gathered(DType::kF32, {world_, n, vp});
  RETURN_IF_ERROR(
      comm_->AllGather(local.data<float>(), static_cast<size_t>(n * vp), gathered.data<float>()));
  for (int64_t r = 0; r < n; ++r) {
    for (int w = 0; w < world_; ++w) {
      const int64_t begin = w * vp, count = std::min(vp, vocab - begin);
      if (count <= 0) continue;
      std::memcpy(logits->data<float>() + r * vocab + begin,
                  gathered.data<float>() + (w * n + r) * vp, count * sizeof(float));
    }
  }
  return absl::OkStatus();
}

}  // namespace llm
