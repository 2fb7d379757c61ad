#include "worker_service/model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/gguf_model.h"
#include "common/half.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/cpu/thread_pool.h"
#include "worker_service/parallel/communicator.h"

#ifdef LLM_WITH_CUDA
#include "kernels/cuda/runtime_api.h"
#endif

namespace llm {
namespace {

absl::Status FromOp(ops::OpStatus s) {
  return s.ok() ? absl::OkStatus() : absl::InternalError(s.message);
}

template <typename T>
TensorView ConstView(std::span<const T> v, DType dtype) {
  return TensorView::Contiguous(const_cast<T*>(v.data()), dtype, {static_cast<int64_t>(v.size())});
}

StDType ToStDType(DType d) {
  return d == DType::kBF16 ? StDType::kBF16 : d == DType::kF16 ? StDType::kF16 : StDType::kF32;
}

// dst row r = src row r for `height` rows of `width` bytes (pitches in bytes), on the
// tensors' device; cuda: enqueued on `stream`.
absl::Status Copy2D(const TensorDevice& device, void* stream, void* dst, size_t dpitch,
                    const void* src, size_t spitch, size_t width, size_t height) {
  if (device.is_cpu()) {
    for (size_t r = 0; r < height; ++r) {
      std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                  width);
    }
    return absl::OkStatus();
  }
#ifdef LLM_WITH_CUDA
  return CudaStatus(cuda::Copy2DAsync(dst, dpitch, src, spitch, width, height, stream));
#else
  (void)stream;
  return absl::InternalError("cuda tensors in a build without CUDA");
#endif
}

absl::Status Copy(const TensorDevice& device, void* dst, const void* src, size_t bytes,
                  void* stream) {
  return CudaStatus(CopyBytes(device, dst, src, bytes, stream));
}

absl::Status Memset(const TensorDevice& device, void* stream, void* ptr, int value, size_t bytes) {
  if (device.is_cpu()) {
    std::memset(ptr, value, bytes);
    return absl::OkStatus();
  }
#ifdef LLM_WITH_CUDA
  return CudaStatus(cuda::MemsetAsync(ptr, value, bytes, stream));
#else
  (void)stream;
  return absl::InternalError("cuda tensors in a build without CUDA");
#endif
}

// Heads first_head .. first_head + num_heads - 1 of the rows of qkv [T, (Hq + 2 Hkv) * D], as a
// token-strided view [T, num_heads, D] (strides [(Hq + 2 Hkv) * D, D, 1]).
TensorView QkvPart(const TensorView& qkv, int64_t first_head, int64_t num_heads, int64_t d) {
  TensorView v = qkv;
  v.data = static_cast<char*>(qkv.data) + first_head * d * DTypeSize(qkv.dtype);
  v.ndim = 3;
  v.shape = {qkv.shape[0], num_heads, d};
  v.strides = {qkv.shape[1], d, 1};
  return v;
}

// A token-strided [T, heads, D] view as [T, 1, heads * D]: each token's heads as one vector.
TensorView AsOneHead(const TensorView& heads) {
  TensorView v = heads;
  v.shape = {heads.shape[0], 1, heads.shape[1] * heads.shape[2]};
  v.strides = {heads.strides[0], v.shape[2], 1};
  return v;
}

// The element count from which the mixture of experts' row loops (gather, weighted add) run on
// the OpenMP pool, as the CPU kernels' own loops do.
constexpr int64_t kMinParallelElements = int64_t{1} << 15;

// out = in W^T on the cpu by a GEMM kept as GGUF blocks (`quant`) or packed for oneDNN.
ops::OpStatus CpuLinear(const cpu::QuantizedLinear* quant, const cpu::PackedLinear* packed,
                        const TensorView& out, const TensorView& in) {
  return quant != nullptr ? quant->Forward(out, in) : packed->Forward(out, in);
}

// Rounds a byte offset up to 256 (each input array starts aligned).
size_t Align(size_t bytes) { return (bytes + 255) / 256 * 256; }

// A fused weight's shape (Phi-3's qkv_proj, gate_up_proj), before ranks read slices of it;
// nothing to check without weights (random ones).
absl::Status CheckShape(const WeightSource* weights, const std::string& name,
                        std::initializer_list<int64_t> shape) {
  if (weights == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::vector<int64_t> st_shape, weights->Shape(name));
  if (st_shape != std::vector<int64_t>(shape)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " has shape [", absl::StrJoin(st_shape, ", "), "]; the config implies [",
                     absl::StrJoin(shape, ", "), "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<float>> RopeCosSinTable(const ops::RopeConfig& rope,
                                                   const RopeScaling& scaling,
                                                   int64_t max_position) {
  const int64_t r = rope.rotary_dim;
  std::vector<float> table(static_cast<size_t>(std::max<int64_t>(0, max_position) * r));
  if (scaling.type != "longrope") {
    RETURN_IF_ERROR(FromOp(ops::ComputeRopeCosSinCache(rope, max_position, table)));
    return table;
  }
  // longrope: per-frequency divisors (ops::RopeConfig::freq_factors), the short ones below
  // the original length and the long ones from there on, per position; every cos and sin
  // times the attention factor. transformers instead picks one set for the whole forward
  // (long once any position reaches the original length, i.e. seq_len > original) and vLLM
  // one per batch, so the three agree on every position of a sequence shorter than the
  // original length; past it, a sequence's earlier positions here keep their short-factor
  // angles (which also keeps its cached keys valid as it grows past the original length).
  if (scaling.short_factor.size() != static_cast<size_t>(r / 2) ||
      scaling.long_factor.size() != static_cast<size_t>(r / 2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "longrope: short_factor and long_factor must hold rotary_dim / 2 = ", r / 2, " factors"));
  }
  if (!(scaling.attention_factor > 0)) {
    return absl::InvalidArgumentError("longrope: attention_factor must be > 0");
  }
  const int64_t original =
      std::clamp<int64_t>(scaling.original_max_position_embeddings, 0, max_position);
  ops::RopeConfig part = rope;
  part.freq_factors = scaling.long_factor;
  RETURN_IF_ERROR(FromOp(ops::ComputeRopeCosSinCache(part, max_position, table)));
  part.freq_factors = scaling.short_factor;
  RETURN_IF_ERROR(FromOp(ops::ComputeRopeCosSinCache(
      part, original, std::span<float>(table).first(static_cast<size_t>(original * r)))));
  const float mscale = static_cast<float>(scaling.attention_factor);
  if (mscale != 1.0f) {
    for (float& v : table) v *= mscale;
  }
  return table;
}

absl::StatusOr<DType> ParseModelDType(const std::string& name, const TensorDevice& device) {
  DType d;
  if (name.empty() || name == "auto") {
    d = device.is_cuda() || cpu::CpuHasNativeBf16() ? DType::kBF16 : DType::kF32;
  } else if (name == "float32" || name == "float" || name == "fp32") {
    d = DType::kF32;
  } else if (name == "bfloat16" || name == "bf16") {
    d = DType::kBF16;
  } else if (name == "float16" || name == "half" || name == "fp16") {
    d = DType::kF16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype \"", name, "\" is not known (auto, float32, bfloat16 or float16)"));
  }
  if (device.is_cpu() && d == DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype ", name, " is not supported on device cpu (expected float32 or bfloat16)"));
  }
  if (device.is_cpu() && d == DType::kBF16 && !cpu::CpuHasNativeBf16()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", name,
                     " is not supported on this cpu (bf16 GEMMs need AVX512_BF16 or AMX; use "
                     "float32)"));
  }
  return d;
}

LlamaModel::LlamaModel(const ModelConfig& config, Communicator* comm, const ModelOptions& options)
    : config_(config),
      comm_(comm),
      context_(options.context),
      device_(options.context != nullptr ? options.context->device() : TensorDevice::Cpu()),
      dtype_(options.dtype),
      act_dtype_(device_.is_cpu() ? DType::kF32 : options.dtype),
      quantized_weights_(options.quantized_weights) {
  if (comm != nullptr) {
    rank_ = comm->rank();
    world_ = comm->world_size();
  }
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& model_dir,
                                                             const ModelConfig& config,
                                                             Communicator* comm,
                                                             const ModelOptions& options) {
  if (IsGgufPath(model_dir)) {
    ASSIGN_OR_RETURN(std::unique_ptr<GgufWeights> weights, GgufWeights::Open(model_dir));
    return Load(*weights, config, comm, options);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsModel> weights, SafetensorsModel::Open(model_dir));
  return Load(*weights, config, comm, options);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const WeightSource& weights,
                                                             const ModelConfig& config,
                                                             Communicator* comm,
                                                             const ModelOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> m, Make(config, comm, options));
  RETURN_IF_ERROR(m->LoadWeights(&weights, 0));
  return m;
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::CreateRandom(const ModelConfig& config,
                                                                     uint64_t seed,
                                                                     Communicator* comm,
                                                                     const ModelOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> m, Make(config, comm, options));
  RETURN_IF_ERROR(m->LoadWeights(nullptr, seed));
  return m;
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Make(const ModelConfig& config,
                                                             Communicator* comm,
                                                             const ModelOptions& options) {
  std::unique_ptr<LlamaModel> m(new LlamaModel(config, comm, options));
  if (m->device_.is_cpu() && m->dtype_ != DType::kF32 &&
      !(m->dtype_ == DType::kBF16 && cpu::CpuHasNativeBf16())) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", DTypeName(m->dtype_),
                     " is not supported on device cpu (expected f32, or bf16 on a CPU with "
                     "AVX512_BF16 or AMX)"));
  }
  if (m->dtype_ != DType::kF32 && m->dtype_ != DType::kBF16 && m->dtype_ != DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("model dtype ", DTypeName(m->dtype_), ": expected f32, bf16 or f16"));
  }
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
  // OLMoE's q/k norm spans all of a token's heads: each rank sums its heads' squares and the
  // ranks all-reduce the sums, which would count a replicated KV head once per copy.
  if (config.qk_norm_whole && hkv < w) {
    return absl::UnimplementedError(
        absl::StrCat(config.architecture,
                     ": its k norm spans every KV head of a token, and tensor-parallel "
                     "size ",
                     w, " exceeds num_key_value_heads (", hkv, "), which would replicate them"));
  }
  if (config.num_experts > 0) {
    if (config.num_experts_per_tok < 1 || config.num_experts_per_tok > config.num_experts) {
      return absl::InvalidArgumentError(absl::StrCat(
          "num_experts_per_tok (", config.num_experts_per_tok, ") must be in [1, num_experts]"));
    }
    // Every expert's (and the shared expert's) intermediate size is split over the ranks.
    if (config.moe_intermediate_size < 1 || config.moe_intermediate_size % w != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("moe_intermediate_size (", config.moe_intermediate_size,
                       ") must be positive and divisible by the tensor-parallel size (", w, ")"));
    }
    if (config.shared_expert_intermediate_size % w != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shared_expert_intermediate_size (", config.shared_expert_intermediate_size,
                       ") is not divisible by the tensor-parallel size (", w, ")"));
    }
  }
  const int d = config.head_dim;
  if (m->device_.is_cuda() && d != 16 && d != 32 && d != 64 && d != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim ", d,
                     " is not supported on cuda (the attention kernels take 16, 32, 64 and 128)"));
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
  m->local_expert_intermediate_ = config.moe_intermediate_size / w;
  m->local_shared_intermediate_ = config.shared_expert_intermediate_size / w;
  m->local_max_intermediate_ = config.MaxIntermediateSize() / w;
  m->vocab_per_rank_ = (config.vocab_size + w - 1) / w;
  m->rope_.theta = config.rope_theta;
  m->rope_.rotary_dim = config.RotaryDim();
  const RopeScaling& rs = config.rope_scaling;
  if (rs.type == "linear") m->rope_.scaling.type = ops::RopeScaling::Type::kLinear;
  if (rs.type == "llama3") m->rope_.scaling.type = ops::RopeScaling::Type::kLlama3;
  m->rope_.scaling.factor = rs.factor;
  m->rope_.scaling.low_freq_factor = rs.low_freq_factor;
  m->rope_.scaling.high_freq_factor = rs.high_freq_factor;
  m->rope_.scaling.original_max_position_embeddings = rs.original_max_position_embeddings;
  m->rope_.freq_factors.assign(config.rope_freq_factors.begin(), config.rope_freq_factors.end());
  if (config.rope_local_theta > 0 && config.sliding_window > 0) {
    m->rope_local_.theta = config.rope_local_theta;
    m->rope_local_.rotary_dim = config.head_dim;
  }
  if (config.hidden_act != "silu" && config.hidden_act != "gelu_pytorch_tanh") {
    return absl::InvalidArgumentError(
        absl::StrCat("hidden_act \"", config.hidden_act, "\" is not supported"));
  }
  return m;
}

absl::Status LlamaModel::AllocateOnDevice(DType dtype, std::initializer_list<int64_t> shape,
                                          Tensor* t) {
  if (std::string err = Tensor::Allocate(dtype, shape, device_, t); !err.empty()) {
    return absl::ResourceExhaustedError(err);
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::AllocateActivation(DType dtype, std::initializer_list<int64_t> shape,
                                            Tensor* t) {
  // On cpu reserved address space: a buffer sized for the largest step costs only the pages
  // that the steps served so far reached, and a buffer outgrown goes back to the system whole
  // instead of staying in malloc's heap.
  const HostMemory kind = device_.is_cpu() ? HostMemory::kReserved : HostMemory::kPageable;
  if (std::string err = Tensor::Allocate(dtype, shape, device_, t, kind); !err.empty()) {
    return absl::ResourceExhaustedError(err);
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::LoadWeights(const WeightSource* weights, uint64_t seed) {
  const int64_t h = config_.hidden_size, d = config_.head_dim, i_local = local_intermediate_;
  const size_t esize = DTypeSize(act_dtype_);
  uint64_t state = seed * 0x9e3779b97f4a7c15ULL + 1;
  void* stream = context_ != nullptr ? context_->stream() : nullptr;
  std::vector<std::byte> staging;  // cuda: one slice on its way up
  std::vector<float> random;
  std::vector<float> f32;
  // Reads rows [begin, end) (dim 0) or columns (dim 1) of a 2-D weight, or a 1-D slice (begin
  // < 0: the whole tensor), in the model's dtype, into `dst` at element `offset`; or fills
  // them with uniform values in [-0.05, 0.05) when there are no weights. `add` is added to
  // every value before the one rounding to the model's dtype (Gemma's 1 + w norms).
  auto read = [&](const std::string& name, int dim, int64_t begin, int64_t end,
                  std::initializer_list<int64_t> shape, Tensor* dst, int64_t offset,
                  float add = 0.0f) -> absl::Status {
    int64_t numel = 1;
    for (int64_t x : shape) numel *= x;
    const size_t bytes = static_cast<size_t>(numel) * esize;
    std::byte* out = static_cast<std::byte*>(dst->view().data) + offset * esize;
    std::byte* host = out;
    if (device_.is_cuda()) {
      staging.resize(bytes);
      host = staging.data();
    }
    if (weights == nullptr) {
      random.resize(numel);
      for (int64_t i = 0; i < numel; ++i) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;  // xorshift64
        random[i] = static_cast<float>(static_cast<double>(state >> 11) * 0x1.0p-53 - 0.5) * 0.1f;
      }
      for (int64_t i = 0; i < numel; ++i) {
        if (act_dtype_ == DType::kF32) {
          std::memcpy(host + i * 4, &random[i], 4);
        } else {
          const uint16_t b =
              act_dtype_ == DType::kBF16 ? FloatToBf16(random[i]) : FloatToHalf(random[i]);
          std::memcpy(host + i * 2, &b, 2);
        }
      }
    } else {
      ASSIGN_OR_RETURN(const std::vector<int64_t> st_shape, weights->Shape(name));
      int64_t st_numel = 1;
      for (int64_t x : st_shape) st_numel *= x;
      if (begin < 0) {
        if (st_shape.empty() || st_numel != numel) {
          return absl::InvalidArgumentError(absl::StrCat(name, " has an unexpected shape"));
        }
        begin = 0;
        end = st_shape[0];
        dim = 0;
      } else if (st_shape.empty() || (dim == 1 && st_shape.size() != 2)) {
        return absl::InvalidArgumentError(absl::StrCat(name, " has an unexpected shape"));
      }
      if (add == 0.0f) {
        RETURN_IF_ERROR(weights->ReadSlice(name, dim, begin, end, ToStDType(act_dtype_),
                                           std::span<std::byte>(host, bytes)));
      } else {
        f32.resize(static_cast<size_t>(numel));
        RETURN_IF_ERROR(weights->ReadSlice(
            name, dim, begin, end, StDType::kF32,
            std::span<std::byte>(reinterpret_cast<std::byte*>(f32.data()), f32.size() * 4)));
        for (int64_t i = 0; i < numel; ++i) {
          const float v = f32[i] + add;
          if (act_dtype_ == DType::kF32) {
            std::memcpy(host + i * 4, &v, 4);
          } else {
            const uint16_t b = act_dtype_ == DType::kBF16 ? FloatToBf16(v) : FloatToHalf(v);
            std::memcpy(host + i * 2, &b, 2);
          }
        }
      }
    }
    if (device_.is_cuda()) {
      RETURN_IF_ERROR(Copy(device_, out, host, bytes, stream));
      RETURN_IF_ERROR(context_->Synchronize());  // `staging` is reused by the next slice
    }
    return absl::OkStatus();
  };
  auto alloc = [&](std::initializer_list<int64_t> shape, Tensor* t) -> absl::Status {
    RETURN_IF_ERROR(AllocateOnDevice(act_dtype_, shape, t));
    weight_bytes_ += t->view().nbytes();
    return absl::OkStatus();
  };
  auto whole = [&](const std::string& name, std::initializer_list<int64_t> shape, Tensor* t,
                   float add = 0.0f) -> absl::Status {
    RETURN_IF_ERROR(alloc(shape, t));
    if (weights != nullptr) {
      ASSIGN_OR_RETURN(const std::vector<int64_t> st_shape, weights->Shape(name));
      if (st_shape != std::vector<int64_t>(shape)) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, " has shape [", absl::StrJoin(st_shape, ", "),
                         "]; the config implies [", absl::StrJoin(shape, ", "), "]"));
      }
    }
    return read(name, 0, -1, -1, shape, t, 0, add);
  };
  // An RMSNorm weight, with the family's offset (config.norm_weight_offset).
  auto norm = [&](const std::string& name, int64_t n, Tensor* t) -> absl::Status {
    return whole(name, {n}, t, weights != nullptr ? config_.norm_weight_offset : 0.0f);
  };

  // Vocab-parallel embedding: this rank's rows, then zeros (padding and the "other rank" row).
  const int64_t vp = vocab_per_rank_;
  const int64_t v0 = static_cast<int64_t>(rank_) * vp;
  const int64_t v1 = std::min<int64_t>(v0 + vp, config_.vocab_size);
  // Kept quantized, the table's rows past this rank's vocabulary are zero blocks (rows >= Vp,
  // other ranks' tokens, gather zeros).
  ASSIGN_OR_RETURN(const bool embed_quantized,
                   LoadQuantized(weights, {{"model.embed_tokens.weight", 0, v0, v1}}, h, vp,
                                 Tensor(), &embed_quant_));
  if (!embed_quantized) {
    RETURN_IF_ERROR(alloc({vp + 1, h}, &embed_));
    RETURN_IF_ERROR(Memset(device_, stream, embed_.view().data, 0, embed_.view().nbytes()));
    if (v1 > v0) {
      RETURN_IF_ERROR(read("model.embed_tokens.weight", 0, v0, v1, {v1 - v0, h}, &embed_, 0));
    }
  }
  if (!config_.tie_word_embeddings) {
    ASSIGN_OR_RETURN(
        const bool head_quantized,
        LoadQuantized(weights, {{"lm_head.weight", 0, v0, v1}}, h, vp, Tensor(), &lm_head_quant_));
    if (!head_quantized) {
      RETURN_IF_ERROR(alloc({vp, h}, &lm_head_));
      RETURN_IF_ERROR(Memset(device_, stream, lm_head_.view().data, 0, lm_head_.view().nbytes()));
      if (v1 > v0) RETURN_IF_ERROR(read("lm_head.weight", 0, v0, v1, {v1 - v0, h}, &lm_head_, 0));
    }
  }
  if (device_.is_cpu()) RETURN_IF_ERROR(PackCpuHead());
  RETURN_IF_ERROR(norm("model.norm.weight", h, &final_norm_));

  // Rotary's cos/sin tables, computed once (fp64 angles) and kept on the device: [positions,
  // rotary_dim] (narrower than the head with a partial rotary).
  auto rope_table = [&](const ops::RopeConfig& rope, const RopeScaling& scaling,
                        Tensor* out) -> absl::Status {
    const int64_t positions = std::max(1, config_.max_position_embeddings);
    ASSIGN_OR_RETURN(const std::vector<float> table, RopeCosSinTable(rope, scaling, positions));
    RETURN_IF_ERROR(AllocateOnDevice(DType::kF32, {positions, rope.rotary_dim}, out));
    RETURN_IF_ERROR(Copy(device_, out->view().data, table.data(), table.size() * 4, stream));
    if (context_ != nullptr) RETURN_IF_ERROR(context_->Synchronize());
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(rope_table(rope_, config_.rope_scaling, &cos_sin_cache_));
  if (rope_local_.rotary_dim > 0) {
    RETURN_IF_ERROR(rope_table(rope_local_, RopeScaling{}, &cos_sin_local_));
  }

  const int64_t qd = static_cast<int64_t>(local_q_heads_) * d;
  const int64_t kd = static_cast<int64_t>(local_kv_heads_) * d;
  const int64_t q0 = static_cast<int64_t>(rank_) * qd, q1 = q0 + qd;
  const int64_t k0 = static_cast<int64_t>(first_kv_head_) * d, k1 = k0 + kd;
  const int64_t m0 = static_cast<int64_t>(rank_) * i_local;
  layers_.resize(config_.num_hidden_layers);
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    Layer& L = layers_[l];
    const std::string p = absl::StrCat("model.layers.", l, ".");
    L.sliding = config_.IsSlidingLayer(l);
    L.moe = config_.IsMoeLayer(l);
    RETURN_IF_ERROR(norm(p + "input_layernorm.weight", h, &L.input_norm));
    if (config_.sandwich_norms) {
      RETURN_IF_ERROR(norm(p + "post_attention_layernorm.weight", h, &L.attn_out_norm));
      RETURN_IF_ERROR(norm(p + "pre_feedforward_layernorm.weight", h, &L.post_norm));
      RETURN_IF_ERROR(norm(p + "post_feedforward_layernorm.weight", h, &L.mlp_out_norm));
    } else {
      RETURN_IF_ERROR(norm(p + "post_attention_layernorm.weight", h, &L.post_norm));
    }
    if (config_.qk_norm && config_.qk_norm_whole) {
      // OLMoE's over the whole projections: this rank's heads' part of each weight.
      const float add = weights != nullptr ? config_.norm_weight_offset : 0.0f;
      const std::string qn = p + "self_attn.q_norm.weight", kn = p + "self_attn.k_norm.weight";
      RETURN_IF_ERROR(CheckShape(weights, qn, {config_.num_attention_heads * int64_t{d}}));
      RETURN_IF_ERROR(CheckShape(weights, kn, {config_.num_key_value_heads * int64_t{d}}));
      RETURN_IF_ERROR(alloc({qd}, &L.q_norm));
      RETURN_IF_ERROR(read(qn, 0, q0, q1, {qd}, &L.q_norm, 0, add));
      RETURN_IF_ERROR(alloc({kd}, &L.k_norm));
      RETURN_IF_ERROR(read(kn, 0, k0, k1, {kd}, &L.k_norm, 0, add));
    } else if (config_.qk_norm) {
      RETURN_IF_ERROR(norm(p + "self_attn.q_norm.weight", d, &L.q_norm));
      RETURN_IF_ERROR(norm(p + "self_attn.k_norm.weight", d, &L.k_norm));
    }
    if (config_.attention_bias) {
      RETURN_IF_ERROR(alloc({qd + 2 * kd}, &L.qkv_bias));
      RETURN_IF_ERROR(read(p + "self_attn.q_proj.bias", 0, q0, q1, {qd}, &L.qkv_bias, 0));
      RETURN_IF_ERROR(read(p + "self_attn.k_proj.bias", 0, k0, k1, {kd}, &L.qkv_bias, qd));
      RETURN_IF_ERROR(read(p + "self_attn.v_proj.bias", 0, k0, k1, {kd}, &L.qkv_bias, qd + kd));
    }
    // Each GEMM's rows as slices of the file's tensors, for LoadQuantized, or read dequantized.
    std::vector<WeightSlice> qkv_slices;
    if (config_.fused_qkv) {
      // Phi-3's qkv_proj [(Hq + 2 Hkv) D, H]: this rank's q rows, then its k rows (after all
      // Hq D q rows), then its v rows (after the Hkv D k rows).
      const std::string qkv = p + "self_attn.qkv_proj.weight";
      const int64_t k_at = static_cast<int64_t>(config_.num_attention_heads) * d;
      const int64_t v_at = k_at + static_cast<int64_t>(config_.num_key_value_heads) * d;
      RETURN_IF_ERROR(CheckShape(weights, qkv, {v_at + v_at - k_at, h}));
      qkv_slices = {
          {qkv, 0, q0, q1}, {qkv, 0, k_at + k0, k_at + k1}, {qkv, 0, v_at + k0, v_at + k1}};
    } else {
      qkv_slices = {{p + "self_attn.q_proj.weight", 0, q0, q1},
                    {p + "self_attn.k_proj.weight", 0, k0, k1},
                    {p + "self_attn.v_proj.weight", 0, k0, k1}};
    }
    std::vector<WeightSlice> gate_up_slices;
    if (config_.fused_gate_up) {
      // Phi-3's gate_up_proj [2 I, H]: this rank's gate rows, then its up rows (after all I
      // gate rows).
      const std::string gate_up = p + "mlp.gate_up_proj.weight";
      const int64_t im = config_.intermediate_size;
      RETURN_IF_ERROR(CheckShape(weights, gate_up, {2 * im, h}));
      gate_up_slices = {{gate_up, 0, m0, m0 + i_local}, {gate_up, 0, im + m0, im + m0 + i_local}};
    } else {
      gate_up_slices = {{p + "mlp.gate_proj.weight", 0, m0, m0 + i_local},
                        {p + "mlp.up_proj.weight", 0, m0, m0 + i_local}};
    }
    // Reads the slices' rows, stacked, into `dst` [n, k] in the model's dtype.
    auto read_rows = [&](const std::vector<WeightSlice>& slices, int64_t n, int64_t k,
                         Tensor* dst) -> absl::Status {
      RETURN_IF_ERROR(alloc({n, k}, dst));
      int64_t row = 0;
      for (const WeightSlice& sl : slices) {
        const int64_t rows = sl.dim == 0 ? sl.end - sl.begin : n;
        const int64_t cols = sl.dim == 0 ? k : sl.end - sl.begin;
        RETURN_IF_ERROR(read(sl.name, sl.dim, sl.begin, sl.end, {rows, cols}, dst, row * k));
        row += rows;
      }
      return absl::OkStatus();
    };
    // A GEMM kept as GGUF blocks, or read dequantized into `dst`.
    auto gemm = [&](const std::vector<WeightSlice>& slices, int64_t n, int64_t k,
                    const Tensor& bias, std::unique_ptr<cpu::QuantizedLinear>* quant,
                    Tensor* dst) -> absl::Status {
      ASSIGN_OR_RETURN(const bool quantized, LoadQuantized(weights, slices, k, n, bias, quant));
      if (quantized) return absl::OkStatus();
      return read_rows(slices, n, k, dst);
    };
    RETURN_IF_ERROR(gemm(qkv_slices, qd + 2 * kd, h, L.qkv_bias, &L.qkv_quant, &L.qkv_proj));
    if (L.qkv_quant != nullptr && L.qkv_bias.allocated()) {  // the bias went with the blocks
      weight_bytes_ -= L.qkv_bias.view().nbytes();
      L.qkv_bias = Tensor();
    }
    RETURN_IF_ERROR(
        gemm({{p + "self_attn.o_proj.weight", 1, q0, q1}}, h, qd, Tensor(), &L.o_quant, &L.o_proj));
    if (L.moe) {
      // Mixtral: block_sparse_moe.gate and experts.<e>.w1 (gate), w3 (up), w2 (down); Qwen-MoE:
      // mlp.gate and experts.<e>.gate_proj, up_proj, down_proj.
      const bool mixtral = config_.architecture == "MixtralForCausalLM";
      const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
      const int64_t ne = config_.num_experts;
      // cpu: packed (the router in f32); cuda: kept as Tensors in the model's dtype.
      const bool cpu = device_.is_cpu();
      RETURN_IF_ERROR(whole(moe + "gate.weight", {ne, h}, &L.router));
      if (cpu) RETURN_IF_ERROR(PackCpuWeight(&L.router, nullptr, &L.router_packed, DType::kF32));
      const int64_t ie = local_expert_intermediate_, e0 = static_cast<int64_t>(rank_) * ie;
      for (auto* v : {&L.expert_gate_up, &L.expert_down}) v->resize(cpu ? ne : 0);
      for (auto* v : {&L.expert_gate_up_quant, &L.expert_down_quant}) v->resize(cpu ? ne : 0);
      for (auto* v : {&L.expert_gate_up_w, &L.expert_down_w}) v->resize(cpu ? 0 : ne);
      for (int64_t e = 0; e < ne; ++e) {
        const std::string x = absl::StrCat(moe, "experts.", e, ".");
        const std::string gate = x + (mixtral ? "w1.weight" : "gate_proj.weight");
        const std::string up = x + (mixtral ? "w3.weight" : "up_proj.weight");
        const std::string down = x + (mixtral ? "w2.weight" : "down_proj.weight");
        const std::vector<WeightSlice> gate_up = {{gate, 0, e0, e0 + ie}, {up, 0, e0, e0 + ie}};
        const std::vector<WeightSlice> down_cols = {{down, 1, e0, e0 + ie}};
        Tensor gate_up_w, down_w;
        if (cpu) {  // kept as the file's blocks where it can be, else packed
          RETURN_IF_ERROR(
              gemm(gate_up, 2 * ie, h, Tensor(), &L.expert_gate_up_quant[e], &gate_up_w));
          RETURN_IF_ERROR(gemm(down_cols, h, ie, Tensor(), &L.expert_down_quant[e], &down_w));
          RETURN_IF_ERROR(PackCpuWeight(&gate_up_w, nullptr, &L.expert_gate_up[e]));
          RETURN_IF_ERROR(PackCpuWeight(&down_w, nullptr, &L.expert_down[e]));
        } else {
          RETURN_IF_ERROR(read_rows(gate_up, 2 * ie, h, &L.expert_gate_up_w[e]));
          RETURN_IF_ERROR(read_rows(down_cols, h, ie, &L.expert_down_w[e]));
        }
      }
      // Qwen2-MoE's shared expert, in the dense MLP's place, and its gate [1, H].
      const int64_t is = local_shared_intermediate_, s0 = static_cast<int64_t>(rank_) * is;
      if (is > 0) {
        const std::string se = moe + "shared_expert.";
        RETURN_IF_ERROR(gemm(
            {{se + "gate_proj.weight", 0, s0, s0 + is}, {se + "up_proj.weight", 0, s0, s0 + is}},
            2 * is, h, Tensor(), &L.gate_up_quant, &L.gate_up_proj));
        RETURN_IF_ERROR(gemm({{se + "down_proj.weight", 1, s0, s0 + is}}, h, is, Tensor(),
                             &L.down_quant, &L.down_proj));
        RETURN_IF_ERROR(whole(moe + "shared_expert_gate.weight", {1, h}, &L.shared_gate));
      }
    } else {
      RETURN_IF_ERROR(
          gemm(gate_up_slices, 2 * i_local, h, Tensor(), &L.gate_up_quant, &L.gate_up_proj));
      RETURN_IF_ERROR(gemm({{p + "mlp.down_proj.weight", 1, m0, m0 + i_local}}, h, i_local,
                           Tensor(), &L.down_quant, &L.down_proj));
    }
    // cpu: packed now, so that a load holds the unpacked copy of one layer at a time.
    if (device_.is_cpu()) RETURN_IF_ERROR(PackCpuLayer(&L));
  }
  if (context_ != nullptr) RETURN_IF_ERROR(context_->Synchronize());
  return absl::OkStatus();
}

absl::StatusOr<bool> LlamaModel::LoadQuantized(const WeightSource* weights,
                                               const std::vector<WeightSlice>& slices, int64_t k,
                                               int64_t n_rows, const Tensor& bias,
                                               std::unique_ptr<cpu::QuantizedLinear>* out) {
  const auto* gguf = dynamic_cast<const GgufWeights*>(weights);
  if (!device_.is_cpu() || !quantized_weights_ || gguf == nullptr) return false;
  std::vector<cpu::QuantizedLinear::Part> parts;
  int64_t n = 0;
  for (const WeightSlice& sl : slices) {
    ASSIGN_OR_RETURN(const GgmlType type, gguf->TensorType(sl.name));
    ASSIGN_OR_RETURN(const std::vector<int64_t> shape, gguf->Shape(sl.name));
    if (!cpu::IsQuantType(static_cast<int>(type))) {
      if (type != GgmlType::kF32 && type != GgmlType::kF16 && type != GgmlType::kBF16) {
        // At most a few lines: a mixture of experts has thousands of expert GEMMs.
        LOG_FIRST_N(INFO, 8) << sl.name << ": " << GgmlTypeName(type)
                             << " has no quantized kernel; dequantized at load";
      }
      return false;
    }
    const auto q = static_cast<cpu::QuantType>(type);
    const int64_t block = cpu::QuantBlockElems(q);
    if (shape.size() != 2 || shape[1] != (sl.dim == 0 ? k : shape[1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          sl.name, " has shape [", absl::StrJoin(shape, ", "), "]; expected ", k, " columns"));
    }
    if (sl.dim == 1 && (sl.begin % block != 0 || sl.end % block != 0)) {
      LOG_FIRST_N(WARNING, 8) << sl.name << ": this rank's columns [" << sl.begin << ", " << sl.end
                              << ") are not whole " << cpu::QuantTypeName(q) << " blocks of "
                              << block << " weights (tensor-parallel size " << world_
                              << "); dequantized at load instead";
      return false;
    }
    cpu::QuantizedLinear::Part part;
    part.type = q;
    part.rows = sl.dim == 0 ? sl.end - sl.begin : shape[0];
    RETURN_IF_ERROR(gguf->ReadBlocks(sl.name, sl.dim, sl.begin, sl.end, &part.blocks));
    n += part.rows;
    parts.push_back(std::move(part));
  }
  if (n > n_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat(slices.front().name, ": ", n, " rows where the config implies ", n_rows));
  }
  if (n < n_rows) {  // zero blocks decode to zero weights in every type
    cpu::QuantizedLinear::Part pad;
    pad.type = parts.back().type;
    pad.rows = n_rows - n;
    pad.blocks.assign(static_cast<size_t>(pad.rows * cpu::QuantRowBytes(pad.type, k)), 0);
    parts.push_back(std::move(pad));
  }
  RETURN_IF_ERROR(FromOp(cpu::QuantizedLinear::Create(
      k, std::move(parts), bias.allocated() ? bias.view() : TensorView{}, out)));
  weight_bytes_ += (*out)->bytes();
  quantized_weight_bytes_ += (*out)->bytes();
  return true;
}

absl::Status LlamaModel::PackCpuWeight(Tensor* weight, Tensor* bias,
                                       std::unique_ptr<cpu::PackedLinear>* out,
                                       std::optional<DType> dtype) {
  if (!weight->allocated()) return absl::OkStatus();  // kept as GGUF blocks
  RETURN_IF_ERROR(FromOp(cpu::PackedLinear::Create(
      weight->view(), bias != nullptr && bias->allocated() ? bias->view() : TensorView{},
      dtype.value_or(dtype_), out)));
  weight_bytes_ += (*out)->packed_bytes();
  coded_weight_bytes_ += (*out)->coded_bytes();
  weight_bytes_ -= weight->view().nbytes();
  *weight = Tensor();
  if (bias != nullptr && bias->allocated()) {
    weight_bytes_ -= bias->view().nbytes();
    *bias = Tensor();
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::PackCpuLayer(Layer* L) {
  RETURN_IF_ERROR(PackCpuWeight(&L->qkv_proj, &L->qkv_bias, &L->qkv_packed));
  RETURN_IF_ERROR(PackCpuWeight(&L->o_proj, nullptr, &L->o_packed));
  RETURN_IF_ERROR(PackCpuWeight(&L->gate_up_proj, nullptr, &L->gate_up_packed));
  return PackCpuWeight(&L->down_proj, nullptr, &L->down_packed);
}

absl::Status LlamaModel::PackCpuHead() {
  if (!config_.tie_word_embeddings) return PackCpuWeight(&lm_head_, nullptr, &lm_head_packed_);
  if (embed_quant_ != nullptr) return absl::OkStatus();  // the head is the quantized table
  // The table is held once, packed as the head: the lookup reads its rows from there
  // (PackedLinear::GatherRows; ids of other ranks, mapped to row vp, read zeros).
  RETURN_IF_ERROR(FromOp(cpu::PackedLinear::Create(
      embed_.Prefix({vocab_per_rank_, config_.hidden_size}), {}, dtype_, &lm_head_packed_)));
  weight_bytes_ += lm_head_packed_->packed_bytes();
  coded_weight_bytes_ += lm_head_packed_->coded_bytes();
  weight_bytes_ -= embed_.view().nbytes();
  embed_ = Tensor();
  return absl::OkStatus();
}

size_t LlamaModel::activation_bytes() const {
  const Buffers& b = buf_;
  size_t total = 0;
  for (const Tensor* t :
       {&b.x, &b.residual, &b.qkv, &b.attn, &b.gate_up, &b.act, &b.norm_sums, &b.router_logits,
        &b.moe_in, &b.moe_out, &b.moe_sum, &b.selected, &b.local_logits, &b.gathered, &b.logits,
        &b.staging, &b.inputs, &b.attention_workspace}) {
    total += device_.is_cpu() ? t->ResidentBytes() : t->capacity_bytes();
  }
  // cuda: the mixture of experts' routing buffers (the offsets' host copy is pinned).
  for (const Tensor* t : {&b.moe_offsets, &b.moe_sorted, &b.moe_experts, &b.moe_weights,
                          &b.moe_positions, &b.moe_offsets_host, &b.shared_gate_logits}) {
    total += t->capacity_bytes();
  }
  // The quantized GEMMs' per-thread scratch (the process's, shared by its models).
  if (quantized_weight_bytes_ > 0) total += cpu::QuantizedLinear::ScratchBytes();
  return total;
}

absl::Status LlamaModel::Synchronize() {
  if (world_ > 1) return comm_->WaitForCollectives();
  return context_ != nullptr ? context_->Synchronize() : absl::OkStatus();
}

absl::Status LlamaModel::AllReduce(const TensorView& t) {
  if (world_ == 1) return absl::OkStatus();
  if (t.dtype == DType::kF32) {
    return comm_->AllReduceSum(t.data_as<float>(), static_cast<size_t>(t.numel()));
  }
  return comm_->AllReduceSum16(t.data, static_cast<size_t>(t.numel()), t.dtype == DType::kBF16);
}

ops::OpContext LlamaModel::OpContextFor() const {
  ops::OpContext ctx;
  if (context_ != nullptr) ctx = context_->op_context();
  // The ops run on the one stream of the rank: its kernels, copies and collectives in order.
  if (ctx.stream == nullptr && comm_ != nullptr) ctx.stream = comm_->stream();
  if (buf_.attention_workspace.allocated()) {
    ctx.workspace = buf_.attention_workspace.view().data;
    ctx.workspace_bytes = buf_.attention_workspace.capacity_bytes();
  }
  return ctx;
}

absl::Status LlamaModel::Reserve(int64_t max_tokens, int64_t max_seqs, int64_t max_model_len) {
  if (max_tokens < 1 || max_seqs < 1 || max_model_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("Reserve(", max_tokens, ", ", max_seqs, ", ",
                                                   max_model_len, "): each must be >= 1"));
  }
  if (device_.is_cuda() && max_model_len > buf_.max_model_len) {
    const size_t bytes = ops::PagedAttentionWorkspaceBytes(max_tokens, local_q_heads_,
                                                           config_.head_dim, max_model_len);
    if (bytes > 0) {
      RETURN_IF_ERROR(AllocateOnDevice(DType::kI32, {static_cast<int64_t>((bytes + 3) / 4)},
                                       &buf_.attention_workspace));
    }
    buf_.max_model_len = max_model_len;
  }
  if (device_.is_cpu()) {
    // The GEMMs' primitives for every row count up to these, and this thread's scratch.
    for (const Layer& L : layers_) {
      for (const cpu::PackedLinear* p :
           {L.qkv_packed.get(), L.o_packed.get(), L.gate_up_packed.get(), L.down_packed.get(),
            L.router_packed.get()}) {
        if (p != nullptr) RETURN_IF_ERROR(FromOp(p->Reserve(max_tokens)));
      }
      for (const auto* experts : {&L.expert_gate_up, &L.expert_down}) {
        for (const std::unique_ptr<cpu::PackedLinear>& p : *experts) {
          if (p != nullptr) RETURN_IF_ERROR(FromOp(p->Reserve(max_tokens)));
        }
      }
    }
    if (lm_head_packed_ != nullptr) {
      RETURN_IF_ERROR(FromOp(lm_head_packed_->Reserve(std::min(max_tokens, max_seqs))));
    }
    for (const Layer& L : layers_) {
      for (const cpu::QuantizedLinear* q :
           {L.qkv_quant.get(), L.o_quant.get(), L.gate_up_quant.get(), L.down_quant.get()}) {
        if (q != nullptr) q->Reserve(max_tokens);
      }
      for (const auto* experts : {&L.expert_gate_up_quant, &L.expert_down_quant}) {
        for (const std::unique_ptr<cpu::QuantizedLinear>& q : *experts) {
          if (q != nullptr) q->Reserve(max_tokens);
        }
      }
    }
    for (const cpu::QuantizedLinear* q : {embed_quant_.get(), lm_head_quant_.get()}) {
      if (q != nullptr) q->Reserve(std::min(max_tokens, max_seqs));
    }
  }
  const int64_t blocks_per_seq = max_model_len;  // an upper bound for any block size >= 1
  return Grow(max_tokens, std::min(max_tokens, max_seqs), std::min(max_tokens, max_seqs),
              std::min(max_seqs * blocks_per_seq, int64_t{1} << 20));
}

absl::Status LlamaModel::Grow(int64_t tokens, int64_t rows, int64_t seqs, int64_t table) {
  Buffers& b = buf_;
  const int64_t h = config_.hidden_size, d = config_.head_dim;
  const int64_t qh = local_q_heads_, kvh = local_kv_heads_, il = local_max_intermediate_;
  const int64_t vp = vocab_per_rank_;
  const bool inputs_stale = tokens > b.tokens || rows > b.rows || seqs > b.seqs ||
                            table > b.table || !b.inputs.allocated();
  // A captured graph holds the addresses of these buffers: a reallocation retires the graphs.
  if (tokens > b.tokens || rows > b.rows || (device_.is_cuda() && inputs_stale)) ReleaseGraphs();
  if (tokens > b.tokens) {
    tokens = std::max<int64_t>(tokens, 1);
    RETURN_IF_ERROR(AllocateActivation(act_dtype_, {tokens, h}, &b.x));
    RETURN_IF_ERROR(AllocateActivation(act_dtype_, {tokens, h}, &b.residual));
    RETURN_IF_ERROR(AllocateActivation(act_dtype_, {tokens, (qh + 2 * kvh) * d}, &b.qkv));
    RETURN_IF_ERROR(AllocateActivation(act_dtype_, {tokens, qh, d}, &b.attn));
    RETURN_IF_ERROR(AllocateActivation(act_dtype_, {tokens, 2 * il}, &b.gate_up));
    RETURN_IF_ERROR(AllocateActivation(act_dtype_, {tokens, il}, &b.act));
    if (config_.qk_norm_whole && world_ > 1) {
      RETURN_IF_ERROR(AllocateActivation(DType::kF32, {2, tokens}, &b.norm_sums));
    }
    if (config_.num_experts > 0) {
      const int64_t ne = config_.num_experts, pairs = tokens * config_.num_experts_per_tok;
      RETURN_IF_ERROR(AllocateActivation(DType::kF32, {tokens, ne}, &b.router_logits));
      if (device_.is_cpu()) {
        for (Tensor* t : {&b.moe_in, &b.moe_out, &b.moe_sum}) {
          RETURN_IF_ERROR(AllocateActivation(DType::kF32, {tokens, h}, t));
        }
      } else {
        RETURN_IF_ERROR(AllocateActivation(act_dtype_, {pairs, h}, &b.moe_in));
        RETURN_IF_ERROR(AllocateActivation(act_dtype_, {pairs, h}, &b.moe_out));
        RETURN_IF_ERROR(AllocateActivation(act_dtype_, {tokens, h}, &b.moe_sum));
        RETURN_IF_ERROR(AllocateActivation(DType::kI32, {ne + 1}, &b.moe_offsets));
        RETURN_IF_ERROR(AllocateActivation(DType::kI32, {pairs}, &b.moe_sorted));
        RETURN_IF_ERROR(AllocateActivation(DType::kI32, {pairs}, &b.moe_experts));
        RETURN_IF_ERROR(AllocateActivation(DType::kF32, {pairs}, &b.moe_weights));
        RETURN_IF_ERROR(AllocateActivation(DType::kI32, {pairs}, &b.moe_positions));
        RETURN_IF_ERROR(AllocateActivation(DType::kF32, {tokens}, &b.shared_gate_logits));
        if (!b.moe_offsets_host.allocated()) {
          if (std::string err = Tensor::Allocate(DType::kI32, {ne + 1}, TensorDevice::Cpu(),
                                                 &b.moe_offsets_host, HostMemory::kPinned);
              !err.empty()) {
            return absl::ResourceExhaustedError(err);
          }
        }
      }
    }
    b.tokens = tokens;
  }
  if (rows > b.rows) {
    RETURN_IF_ERROR(AllocateActivation(act_dtype_, {rows, h}, &b.selected));
    RETURN_IF_ERROR(AllocateActivation(DType::kF32, {rows, vp}, &b.local_logits));
    if (world_ > 1) {
      RETURN_IF_ERROR(AllocateActivation(DType::kF32, {world_, rows, vp}, &b.gathered));
      RETURN_IF_ERROR(AllocateActivation(DType::kF32, {rows, config_.vocab_size}, &b.logits));
    }
    b.rows = rows;
  }
  if (device_.is_cuda() && inputs_stale) {
    b.seqs = std::max(b.seqs, seqs);
    b.table = std::max(b.table, table);
    // ids, positions (i32), slots (i64) per token; tables; lens and qsl per sequence; rows.
    const size_t bytes = Align(b.tokens * 4) * 2 + Align(b.tokens * 8) + Align(b.table * 4) +
                         Align(b.seqs * 4) + Align((b.seqs + 1) * 4) + Align(b.rows * 4);
    const int64_t words = static_cast<int64_t>(bytes / 4);
    if (std::string err = Tensor::Allocate(DType::kI32, {words}, TensorDevice::Cpu(), &b.staging,
                                           HostMemory::kPinned);
        !err.empty()) {
      return absl::ResourceExhaustedError(err);
    }
    RETURN_IF_ERROR(AllocateOnDevice(DType::kI32, {words}, &b.inputs));
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::Forward(const ForwardInput& in, std::span<const LayerKvCache> caches,
                                 HostTensor* logits) {
  TensorView view;
  RETURN_IF_ERROR(Forward(in, caches, &view));
  *logits = HostTensor(DType::kF32, {view.shape[0], view.shape[1]});
  RETURN_IF_ERROR(Copy(device_, logits->view().data, view.data, view.nbytes(),
                       context_ != nullptr ? context_->stream() : nullptr));
  return Synchronize();
}

absl::Status LlamaModel::Forward(const ForwardInput& in, std::span<const LayerKvCache> caches,
                                 TensorView* logits) {
  const int64_t t = static_cast<int64_t>(in.token_ids.size());
  const int64_t s = static_cast<int64_t>(in.seq_lens.size());
  const int64_t n = static_cast<int64_t>(in.logits_indices.size());
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
  for (int32_t r : in.logits_indices) {
    if (r < 0 || r >= t) {
      return absl::InvalidArgumentError(
          absl::StrCat("logits row ", r, " is outside the step's ", t, " tokens"));
    }
  }
  if (UseGraph(in, caches)) return GraphForward(in, caches, logits);
  RETURN_IF_ERROR(Grow(t, n, s, s * in.max_blocks));
  StepViews views;
  RETURN_IF_ERROR(Upload(in, &views));
  return Compute(views, caches, logits);
}

void LlamaModel::EnableCudaGraphs(int max_batch) {
  ReleaseGraphs();
  failed_graphs_.clear();
  max_graph_batch_ = device_.is_cuda() ? std::max(0, max_batch) : 0;
  // A mixture of experts waits for the device in every MoE layer (its experts' token counts
  // size the GEMMs, see MoeMlpCuda): no step of it can be captured.
  if (config_.num_experts > 0) max_graph_batch_ = 0;
#ifdef LLM_CUDA_EMU
  // The emulated NCCL queues its collectives as host work, which a capture cannot record.
  if (world_ > 1) max_graph_batch_ = 0;
#endif
}

std::vector<int> LlamaModel::GraphBatchSizes() const {
  std::vector<int> sizes;
  for (int64_t s = 1; max_graph_batch_ > 0; s *= 2) {
    const int64_t b = GraphSize(s);
    if (!sizes.empty() && b == sizes.back()) break;
    sizes.push_back(static_cast<int>(b));
  }
  return sizes;
}

void LlamaModel::ReleaseGraphs() {
#ifdef LLM_WITH_CUDA
  for (auto& [size, graph] : graphs_) (void)cuda::GraphExecDestroy(graph.exec);
#endif
  graphs_.clear();
  graph_caches_ = nullptr;
}

LlamaModel::~LlamaModel() { ReleaseGraphs(); }

bool LlamaModel::UseGraph(const ForwardInput& in, std::span<const LayerKvCache> caches) const {
  const int64_t s = static_cast<int64_t>(in.seq_lens.size());
  if (max_graph_batch_ == 0 || s == 0 || s > max_graph_batch_ ||
      in.token_ids.size() != static_cast<size_t>(s) ||
      in.logits_indices.size() != static_cast<size_t>(s) || buf_.max_model_len == 0 ||
      caches.empty() || GraphSize(s) > buf_.seqs || GraphSize(s) > buf_.rows) {
    return false;
  }
  for (int64_t i = 0; i < s; ++i) {
    if (in.logits_indices[i] != i || in.query_start_loc[i + 1] != i + 1) return false;
  }
  const int64_t width = GraphTableWidth(caches);
  if (in.max_blocks > width || GraphSize(s) * width > buf_.table) return false;
  auto failed = failed_graphs_.find(GraphSize(s));
  return failed == failed_graphs_.end();
}

int64_t LlamaModel::GraphTableWidth(std::span<const LayerKvCache> caches) const {
  const int64_t block_size = caches[0].key.shape[1];
  return (buf_.max_model_len + block_size - 1) / block_size;
}

int64_t LlamaModel::GraphSize(int64_t s) const {
  int64_t b = 1;
  while (b < s) b *= 2;
  return std::min<int64_t>(b, max_graph_batch_);
}

absl::Status LlamaModel::GraphForward(const ForwardInput& in, std::span<const LayerKvCache> caches,
                                      TensorView* logits) {
#ifdef LLM_WITH_CUDA
  // The batch padded to B sequences of one token each, with a block table of the longest
  // context's width: every launch of the graph sees the same sizes and addresses. Padding rows:
  // token 0 at position 0, no cache write (slot -1), a context of 1 in block 0; their outputs
  // are never read.
  const int64_t s = static_cast<int64_t>(in.seq_lens.size());
  const int64_t b = GraphSize(s);
  const int64_t width = GraphTableWidth(caches);
  if (graph_caches_ != caches[0].key.data) {
    ReleaseGraphs();  // captured over other caches
    graph_caches_ = caches[0].key.data;
  }
  g_ids_.assign(in.token_ids.begin(), in.token_ids.end());
  g_ids_.resize(b, 0);
  g_positions_.assign(in.positions.begin(), in.positions.end());
  g_positions_.resize(b, 0);
  g_slots_.assign(in.slot_mapping.begin(), in.slot_mapping.end());
  g_slots_.resize(b, -1);
  g_tables_.assign(static_cast<size_t>(b * width), 0);
  for (int64_t i = 0; i < s; ++i) {
    std::copy_n(in.block_tables.begin() + i * in.max_blocks, in.max_blocks,
                g_tables_.begin() + i * width);
  }
  g_lens_.assign(in.seq_lens.begin(), in.seq_lens.end());
  g_lens_.resize(b, 1);
  g_qsl_.resize(b + 1);
  g_rows_.resize(b);
  for (int64_t i = 0; i <= b; ++i) g_qsl_[i] = static_cast<int32_t>(i);
  for (int64_t i = 0; i < b; ++i) g_rows_[i] = static_cast<int32_t>(i);
  const ForwardInput padded{g_ids_,  g_positions_, g_slots_, g_tables_, static_cast<int>(width),
                            g_lens_, g_qsl_,       g_rows_};
  StepViews views;
  RETURN_IF_ERROR(Upload(padded, &views));  // outside the graph: a copy before its launch
  // The attention plan for any lengths (the graph replays it whatever this step's are).
  views.meta.max_seq_len = static_cast<int>(buf_.max_model_len);
  views.meta.seq_lens_host = {};
  void* stream = context_->stream();
  auto it = graphs_.find(b);
  if (it == graphs_.end()) {
    Graph graph;
    RETURN_IF_ERROR(CudaStatus(cuda::BeginCapture(stream)));
    const absl::Status captured = Compute(views, caches, &graph.logits);
    const std::string ended = cuda::EndCapture(stream, &graph.exec);
    if (!captured.ok() || !ended.empty()) {
      // Not capturable here (e.g. a collective that cannot be captured): this size runs
      // eagerly from now on.
      failed_graphs_[b] = captured.ok() ? ended : std::string(captured.message());
      (void)cuda::GraphExecDestroy(graph.exec);
      RETURN_IF_ERROR(Compute(views, caches, logits));
      logits->shape[0] = s;
      return absl::OkStatus();
    }
    it = graphs_.emplace(b, graph).first;
  }
  RETURN_IF_ERROR(CudaStatus(cuda::GraphLaunch(it->second.exec, stream)));
  ++graph_replays_;
  *logits = it->second.logits;
  logits->shape[0] = s;  // the real sequences' rows
  return absl::OkStatus();
#else
  (void)in, (void)caches, (void)logits;
  return absl::InternalError("CUDA graphs in a build without CUDA");
#endif
}

absl::Status LlamaModel::Upload(const ForwardInput& in, StepViews* out) {
  const int64_t t = static_cast<int64_t>(in.token_ids.size());
  const int64_t s = static_cast<int64_t>(in.seq_lens.size());
  const int64_t n = static_cast<int64_t>(in.logits_indices.size());
  const int64_t vp = vocab_per_rank_;
  void* stream = OpContextFor().stream;

  // Vocab-parallel lookup: ids outside this rank's range read the zero row vp.
  local_ids_.resize(t);
  const int64_t v0 = static_cast<int64_t>(rank_) * vp;
  for (int64_t i = 0; i < t; ++i) {
    const int64_t id = in.token_ids[i] - v0;
    local_ids_[i] = (id >= 0 && id < vp) ? static_cast<int32_t>(id) : static_cast<int32_t>(vp);
  }
  // The integer inputs: read in place on cpu; on cuda packed into pinned memory and sent up in
  // one copy (the previous step's copy is complete: the caller waited for that step).
  TensorView ids = ConstView<int32_t>(local_ids_, DType::kI32);
  TensorView positions = ConstView(in.positions, DType::kI32);
  TensorView slots = ConstView(in.slot_mapping, DType::kI64);
  ops::AttentionMetadata meta;
  meta.block_tables = TensorView::Contiguous(const_cast<int32_t*>(in.block_tables.data()),
                                             DType::kI32, {s, in.max_blocks});
  meta.seq_lens = ConstView(in.seq_lens, DType::kI32);
  meta.query_start_loc = ConstView(in.query_start_loc, DType::kI32);
  TensorView rows = ConstView(in.logits_indices, DType::kI32);
  if (device_.is_cuda()) {
    char* host = static_cast<char*>(buf_.staging.view().data);
    char* dev = static_cast<char*>(buf_.inputs.view().data);
    size_t offset = 0;
    auto put = [&](const void* src, size_t bytes, TensorView* view) {
      std::memcpy(host + offset, src, bytes);
      view->data = dev + offset;
      view->device = device_;
      offset += Align(bytes);
    };
    put(local_ids_.data(), t * 4, &ids);
    put(in.positions.data(), t * 4, &positions);
    put(in.slot_mapping.data(), t * 8, &slots);
    put(in.block_tables.data(), in.block_tables.size() * 4, &meta.block_tables);
    put(in.seq_lens.data(), s * 4, &meta.seq_lens);
    put(in.query_start_loc.data(), (s + 1) * 4, &meta.query_start_loc);
    put(in.logits_indices.data(), n * 4, &rows);
    RETURN_IF_ERROR(Copy(device_, dev, host, offset, stream));
  }
  meta.max_seq_len = s == 0 ? 0 : *std::max_element(in.seq_lens.begin(), in.seq_lens.end());
  meta.query_start_loc_host = in.query_start_loc;
  meta.seq_lens_host = in.seq_lens;  // the attention's split-KV plan
  *out = {ids, positions, slots, rows, meta, t, s, n};
  return absl::OkStatus();
}

absl::Status LlamaModel::Compute(const StepViews& sv, std::span<const LayerKvCache> caches,
                                 TensorView* logits) {
  const int64_t t = sv.t, n = sv.n;
  const int64_t h = config_.hidden_size, d = config_.head_dim;
  const int64_t qh = local_q_heads_, kvh = local_kv_heads_;
  const int64_t vp = vocab_per_rank_, vocab = config_.vocab_size;
  const ops::OpContext ctx = OpContextFor();
  void* stream = ctx.stream;
  const TensorView &ids = sv.ids, &positions = sv.positions, &slots = sv.slots, &rows = sv.rows;
  const ops::AttentionMetadata& meta = sv.meta;
  ops::AttentionOptions attention;
  attention.scale = 1.0f / std::sqrt(static_cast<float>(config_.query_pre_attn_scalar > 0
                                                            ? config_.query_pre_attn_scalar
                                                            : static_cast<double>(d)));
  attention.softcap = static_cast<float>(config_.attn_logit_softcapping);
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const bool gelu = config_.hidden_act == "gelu_pytorch_tanh";
  if (device_.is_cpu()) cpu::EnterThreadPool();
  // out = in weight^T (+ bias): the packed GEMM on cpu, ops::Linear on cuda.
  auto linear = [&](const TensorView& out, const TensorView& in, const Tensor& weight,
                    const Tensor& bias, const cpu::PackedLinear* packed,
                    const cpu::QuantizedLinear* quant = nullptr) -> absl::Status {
    if (quant != nullptr) return FromOp(quant->Forward(out, in));
    if (packed != nullptr) return FromOp(packed->Forward(out, in));
    return FromOp(
        ops::Linear(ctx, out, in, weight.view(), bias.allocated() ? bias.view() : TensorView{}));
  };
  const Tensor no_tensor;

  const TensorView x = buf_.x.Prefix({t, h}), residual = buf_.residual.Prefix({t, h});
  const TensorView qkv = buf_.qkv.Prefix({t, (qh + 2 * kvh) * d});
  // q, k and v are token-strided views of the fused projection's rows [q | k | v]
  // (kernels/ops.h): q[t][h][i] = qkv[t][h * d + i], k[t][h][i] = qkv[t][(qh + h) * d + i],
  // v[t][h][i] = qkv[t][(qh + kvh + h) * d + i]. Rotary, the cache write and attention read
  // them in place.
  const TensorView q = QkvPart(qkv, 0, qh, d), k = QkvPart(qkv, qh, kvh, d);
  const TensorView v = QkvPart(qkv, qh + kvh, kvh, d), attn = buf_.attn.Prefix({t, qh, d});
  const TensorView attn2 = buf_.attn.Prefix({t, qh * d});
  const TensorView none;

  if (embed_.allocated()) {
    RETURN_IF_ERROR(FromOp(ops::Embedding(ctx, x, ids, embed_.view())));
  } else if (embed_quant_ != nullptr) {
    RETURN_IF_ERROR(FromOp(embed_quant_->GatherRows(x, ids)));
  } else {
    RETURN_IF_ERROR(FromOp(lm_head_packed_->GatherRows(x, ids)));
  }
  RETURN_IF_ERROR(AllReduce(x));
  if (config_.scale_embeddings) {
    // sqrt(H) in the activations' dtype, as transformers multiplies by it.
    float normalizer = std::sqrt(static_cast<float>(h));
    if (act_dtype_ == DType::kBF16) normalizer = Bf16ToFloat(FloatToBf16(normalizer));
    if (act_dtype_ == DType::kF16) normalizer = HalfToFloat(FloatToHalf(normalizer));
    RETURN_IF_ERROR(FromOp(ops::Scale(ctx, x, normalizer)));
  }
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    const Layer& L = layers_[l];
    if (l == 0) {
      RETURN_IF_ERROR(Copy(device_, residual.data, x.data, x.nbytes(), stream));
      RETURN_IF_ERROR(FromOp(ops::RmsNorm(ctx, x, x, L.input_norm.view(), eps)));
    } else {
      RETURN_IF_ERROR(FromOp(ops::FusedAddRmsNorm(ctx, x, residual, L.input_norm.view(), eps)));
    }
    RETURN_IF_ERROR(linear(qkv, x, L.qkv_proj, L.qkv_bias, L.qkv_packed.get(), L.qkv_quant.get()));
    if (config_.qk_norm_whole && world_ > 1) {
      // OLMoE's norm over all the ranks' heads: the sums of squares all-reduced in between.
      const TensorView sums = buf_.norm_sums.Prefix(DType::kF32, {2, t});
      const TensorView q_sums = TensorView::Contiguous(sums.data, DType::kF32, {t}, sums.device);
      const TensorView k_sums =
          TensorView::Contiguous(sums.data_as<float>() + t, DType::kF32, {t}, sums.device);
      RETURN_IF_ERROR(FromOp(ops::SumOfSquares(ctx, q_sums, q)));
      RETURN_IF_ERROR(FromOp(ops::SumOfSquares(ctx, k_sums, k)));
      RETURN_IF_ERROR(AllReduce(sums));
      const int64_t q_row = int64_t{config_.num_attention_heads} * d;
      const int64_t k_row = int64_t{config_.num_key_value_heads} * d;
      RETURN_IF_ERROR(FromOp(ops::RmsNormBySums(ctx, q, q_sums, L.q_norm.view(), q_row, eps)));
      RETURN_IF_ERROR(FromOp(ops::RmsNormBySums(ctx, k, k_sums, L.k_norm.view(), k_row, eps)));
    } else if (config_.qk_norm) {
      const bool whole = config_.qk_norm_whole;  // one rank: all heads as one vector
      RETURN_IF_ERROR(
          FromOp(ops::HeadRmsNorm(ctx, whole ? AsOneHead(q) : q, L.q_norm.view(), eps)));
      RETURN_IF_ERROR(
          FromOp(ops::HeadRmsNorm(ctx, whole ? AsOneHead(k) : k, L.k_norm.view(), eps)));
    }
    const Tensor& rope_table =
        L.sliding && cos_sin_local_.allocated() ? cos_sin_local_ : cos_sin_cache_;
    RETURN_IF_ERROR(FromOp(ops::RotaryEmbeddingCached(ctx, positions, q, k, rope_table.view())));
    RETURN_IF_ERROR(FromOp(ops::ReshapeAndCache(ctx, k, v, caches[l].key, caches[l].value, slots)));
    attention.sliding_window = L.sliding ? config_.sliding_window : 0;
    RETURN_IF_ERROR(
        FromOp(ops::PagedAttention(ctx, attn, q, caches[l].key, caches[l].value, meta, attention)));
    RETURN_IF_ERROR(linear(x, attn2, L.o_proj, no_tensor, L.o_packed.get(), L.o_quant.get()));
    RETURN_IF_ERROR(AllReduce(x));
    if (config_.sandwich_norms) {
      RETURN_IF_ERROR(FromOp(ops::RmsNorm(ctx, x, x, L.attn_out_norm.view(), eps)));
    }
    RETURN_IF_ERROR(FromOp(ops::FusedAddRmsNorm(ctx, x, residual, L.post_norm.view(), eps)));
    if (L.moe) {
      RETURN_IF_ERROR(MoeMlp(L, x, t));
    } else {
      const int64_t il = local_intermediate_;
      const TensorView gate_up = buf_.gate_up.Prefix({t, 2 * il}), act = buf_.act.Prefix({t, il});
      RETURN_IF_ERROR(linear(gate_up, x, L.gate_up_proj, no_tensor, L.gate_up_packed.get(),
                             L.gate_up_quant.get()));
      if (gelu) {
        RETURN_IF_ERROR(FromOp(ops::GeluTanhAndMul(ctx, act, gate_up)));
      } else {
        RETURN_IF_ERROR(FromOp(ops::SiluAndMul(ctx, act, gate_up)));
      }
      RETURN_IF_ERROR(
          linear(x, act, L.down_proj, no_tensor, L.down_packed.get(), L.down_quant.get()));
    }
    RETURN_IF_ERROR(AllReduce(x));
    if (config_.sandwich_norms) {
      RETURN_IF_ERROR(FromOp(ops::RmsNorm(ctx, x, x, L.mlp_out_norm.view(), eps)));
    }
  }
  RETURN_IF_ERROR(FromOp(ops::FusedAddRmsNorm(ctx, x, residual, final_norm_.view(), eps)));

  // The rows that sample, then this rank's slice of the vocabulary (fp32), then all of it.
  const TensorView selected = buf_.selected.Prefix({n, h});
  RETURN_IF_ERROR(FromOp(ops::Embedding(ctx, selected, rows, x)));
  const cpu::QuantizedLinear* head_quant =
      config_.tie_word_embeddings ? embed_quant_.get() : lm_head_quant_.get();
  const TensorView head = lm_head_packed_ != nullptr || head_quant != nullptr ? TensorView{}
                          : config_.tie_word_embeddings ? embed_.Prefix({vp, h})
                                                        : lm_head_.view();
  const TensorView local = buf_.local_logits.Prefix(DType::kF32, {n, vp});
  if (head_quant != nullptr) {
    RETURN_IF_ERROR(FromOp(head_quant->Forward(local, selected)));
  } else if (lm_head_packed_ != nullptr) {
    RETURN_IF_ERROR(FromOp(lm_head_packed_->Forward(local, selected)));
  } else {
    RETURN_IF_ERROR(FromOp(ops::Linear(ctx, local, selected, head, none)));
  }
  if (config_.final_logit_softcapping > 0 && n > 0) {
    RETURN_IF_ERROR(
        FromOp(ops::Softcap(ctx, local, static_cast<float>(config_.final_logit_softcapping))));
  }
  if (world_ == 1) {
    *logits = local;  // vp == vocab
    return absl::OkStatus();
  }
  const TensorView gathered = buf_.gathered.Prefix(DType::kF32, {world_, n, vp});
  RETURN_IF_ERROR(comm_->AllGather(local.data_as<float>(), static_cast<size_t>(n * vp),
                                   gathered.data_as<float>()));
  const TensorView all = buf_.logits.Prefix(DType::kF32, {n, vocab});
  for (int w = 0; w < world_; ++w) {
    const int64_t begin = w * vp, count = std::min(vp, vocab - begin);
    if (count <= 0 || n == 0) continue;
    RETURN_IF_ERROR(Copy2D(device_, stream, all.data_as<float>() + begin, vocab * 4,
                           gathered.data_as<float>() + w * n * vp, vp * 4, count * 4, n));
  }
  *logits = all;
  return absl::OkStatus();
}

absl::Status LlamaModel::MoeMlpCuda(const Layer& L, const TensorView& x, int64_t t) {
  const int64_t h = config_.hidden_size, ne = config_.num_experts;
  const int k = config_.num_experts_per_tok;
  const int64_t pairs = t * k, ie = local_expert_intermediate_;
  const ops::OpContext ctx = OpContextFor();
  const TensorView none;
  // Route on the device: f32 logits, then softmax, top-k and the (token, choice) pairs sorted
  // by expert (kernels/ops.h: MoeRoute).
  const TensorView logits = buf_.router_logits.Prefix(DType::kF32, {t, ne});
  RETURN_IF_ERROR(FromOp(ops::Linear(ctx, logits, x, L.router.view(), none)));
  const TensorView offsets = buf_.moe_offsets.Prefix({ne + 1});
  const TensorView sorted = buf_.moe_sorted.Prefix({pairs});
  const TensorView weights = buf_.moe_weights.Prefix({t, k});
  const TensorView positions = buf_.moe_positions.Prefix({t, k});
  RETURN_IF_ERROR(FromOp(ops::MoeRoute(ctx, offsets, sorted, buf_.moe_experts.Prefix({t, k}),
                                       weights, positions, logits, k, config_.norm_topk_prob)));
  // The synchronization point: the experts' row counts size their GEMMs, so they come to the
  // host (one small copy and one wait per MoE layer; why a MoE model runs without CUDA graphs).
  const int32_t* off = buf_.moe_offsets_host.view().data_as<const int32_t>();
  RETURN_IF_ERROR(Copy(device_, buf_.moe_offsets_host.view().data, offsets.data,
                       static_cast<size_t>(ne + 1) * 4, ctx.stream));
  RETURN_IF_ERROR(Synchronize());
  if (off[ne] != pairs) {
    return absl::InternalError(
        absl::StrCat("MoeRoute placed ", off[ne], " (token, expert) pairs of ", pairs));
  }
  // Every pair's input row, in sorted order: moe_in[i] = x[sorted[i]].
  const TensorView in = buf_.moe_in.Prefix({pairs, h}), out = buf_.moe_out.Prefix({pairs, h});
  RETURN_IF_ERROR(FromOp(ops::Embedding(ctx, in, sorted, x)));
  // Rows [begin, begin + n) of a [pairs, width] buffer.
  auto rows = [&](const TensorView& v, int64_t begin, int64_t n) {
    const int64_t width = v.shape[1];
    return TensorView::Contiguous(static_cast<char*>(v.data) + begin * width * DTypeSize(v.dtype),
                                  v.dtype, {n, width}, v.device);
  };
  for (int64_t e = 0; e < ne; ++e) {
    const int64_t begin = off[e], n = off[e + 1] - off[e];
    if (n == 0) continue;
    const TensorView gate_up = buf_.gate_up.Prefix({n, 2 * ie}), act = buf_.act.Prefix({n, ie});
    RETURN_IF_ERROR(
        FromOp(ops::Linear(ctx, gate_up, rows(in, begin, n), L.expert_gate_up_w[e].view(), none)));
    RETURN_IF_ERROR(FromOp(ops::SiluAndMul(ctx, act, gate_up)));
    RETURN_IF_ERROR(
        FromOp(ops::Linear(ctx, rows(out, begin, n), act, L.expert_down_w[e].view(), none)));
  }
  // Qwen2-MoE's shared expert over every token, and its gate's logit (f32).
  TensorView shared, shared_gate;
  if (L.gate_up_proj.allocated()) {
    const int64_t is = local_shared_intermediate_;
    const TensorView gate_up = buf_.gate_up.Prefix({t, 2 * is}), act = buf_.act.Prefix({t, is});
    shared = buf_.moe_sum.Prefix({t, h});
    shared_gate = buf_.shared_gate_logits.Prefix(DType::kF32, {t, 1});
    RETURN_IF_ERROR(FromOp(ops::Linear(ctx, gate_up, x, L.gate_up_proj.view(), none)));
    RETURN_IF_ERROR(FromOp(ops::SiluAndMul(ctx, act, gate_up)));
    RETURN_IF_ERROR(FromOp(ops::Linear(ctx, shared, act, L.down_proj.view(), none)));
    RETURN_IF_ERROR(FromOp(ops::Linear(ctx, shared_gate, x, L.shared_gate.view(), none)));
  }
  // x[t] = sum_j weights[t][j] * out[positions[t][j]] (+ sigmoid(gate) * shared[t]).
  return FromOp(ops::MoeCombine(ctx, x, out, weights, positions, shared, shared_gate));
}

absl::Status LlamaModel::MoeMlp(const Layer& L, const TensorView& x, int64_t t) {
  if (device_.is_cuda()) return MoeMlpCuda(L, x, t);
  // cpu: activations are f32 host memory.
  const int64_t h = config_.hidden_size, ne = config_.num_experts;
  const int k = config_.num_experts_per_tok;
  const ops::OpContext ctx = OpContextFor();
  float* in = x.data_as<float>();
  // Route: the router's logits, then each token's top-k and the tokens grouped by expert.
  const TensorView logits = buf_.router_logits.Prefix(DType::kF32, {t, ne});
  RETURN_IF_ERROR(FromOp(L.router_packed->Forward(logits, x)));
  routing_.Route(std::span<const float>(logits.data_as<float>(), static_cast<size_t>(t * ne)), t,
                 static_cast<int>(ne), k, config_.norm_topk_prob);
  float* sum = buf_.moe_sum.view().data_as<float>();
  std::fill_n(sum, t * h, 0.0f);
  float* gathered = buf_.moe_in.view().data_as<float>();
  float* out = buf_.moe_out.view().data_as<float>();
  // Each active expert: one GEMM pair over its tokens' rows, gathered; then its rows added,
  // weighted, into their tokens' sums (out[tokens[i]] += weights[i] * y[i]).
  const int64_t ie = local_expert_intermediate_;
  for (int64_t e = 0; e < ne; ++e) {
    const int64_t n = routing_.count(static_cast<int>(e));
    if (n == 0) continue;
    const int32_t* tokens = routing_.tokens.data() + routing_.offsets[e];
    const float* weights = routing_.weights.data() + routing_.offsets[e];
    const bool parallel = n > 1 && n * h >= kMinParallelElements;
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t i = 0; i < n; ++i) std::copy_n(in + tokens[i] * h, h, gathered + i * h);
    const TensorView gate_up = buf_.gate_up.Prefix({n, 2 * ie}), act = buf_.act.Prefix({n, ie});
    RETURN_IF_ERROR(FromOp(CpuLinear(L.expert_gate_up_quant[e].get(), L.expert_gate_up[e].get(),
                                     gate_up, buf_.moe_in.Prefix({n, h}))));
    RETURN_IF_ERROR(FromOp(ops::SiluAndMul(ctx, act, gate_up)));
    RETURN_IF_ERROR(FromOp(CpuLinear(L.expert_down_quant[e].get(), L.expert_down[e].get(),
                                     buf_.moe_out.Prefix({n, h}), act)));
    // An expert's tokens are distinct: its rows add into distinct sums.
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t i = 0; i < n; ++i) {
      float* dst = sum + tokens[i] * h;
      const float* src = out + i * h;
      const float w = weights[i];
      for (int64_t j = 0; j < h; ++j) dst[j] += w * src[j];
    }
  }
  // The shared expert over every token, times sigmoid(shared_gate . x).
  if (const int64_t is = local_shared_intermediate_; is > 0) {
    const TensorView gate_up = buf_.gate_up.Prefix({t, 2 * is}), act = buf_.act.Prefix({t, is});
    RETURN_IF_ERROR(FromOp(CpuLinear(L.gate_up_quant.get(), L.gate_up_packed.get(), gate_up, x)));
    RETURN_IF_ERROR(FromOp(ops::SiluAndMul(ctx, act, gate_up)));
    RETURN_IF_ERROR(FromOp(
        CpuLinear(L.down_quant.get(), L.down_packed.get(), buf_.moe_out.Prefix({t, h}), act)));
    const float* gate = L.shared_gate.view().data_as<float>();
#pragma omp parallel for schedule(static) if (t > 1 && t * h >= kMinParallelElements)
    for (int64_t i = 0; i < t; ++i) {
      float dot = 0.0f;
      for (int64_t j = 0; j < h; ++j) dot += gate[j] * in[i * h + j];
      const float g = 1.0f / (1.0f + std::exp(-dot));
      for (int64_t j = 0; j < h; ++j) sum[i * h + j] += g * out[i * h + j];
    }
  }
  std::copy_n(sum, t * h, in);
  return absl::OkStatus();
}

}  // namespace llm
