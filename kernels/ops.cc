// The op dispatchers: check every argument's rank, shape, dtype, layout and device, then
// run the backend of the tensors' device: kernels/cpu for cpu tensors, kernels/cuda for cuda
// tensors when the build has the CUDA backend (LLM_WITH_CUDA), else an error.
#include "kernels/ops.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/paged_attention_plan.h"  // host-only: the workspace size
#include "kernels/op_check.h"
#ifdef LLM_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace llm::ops {

using internal::CheckArg;
using internal::CheckSameDevice;
using internal::CheckTokenStridedArg;
using internal::Error;
using internal::kAny;
using internal::NoBackend;

namespace {

constexpr DType kF32 = DType::kF32;
constexpr DType kI32 = DType::kI32;
constexpr DType kI64 = DType::kI64;
constexpr DType kF16 = DType::kF16;
constexpr DType kBF16 = DType::kBF16;

#define LLM_OPS_RETURN_IF_ERROR(expr) \
  do {                                \
    OpStatus _s = (expr);             \
    if (!_s.ok()) return _s;          \
  } while (0)

// KV caches may be f16 or bf16 on cuda; the CPU backend (the fp32 reference) takes f32 only.
OpStatus CheckCpuCache(const char* op, const char* arg, const TensorView& cache) {
  if (cache.dtype == kF32 || cache.dtype == kBF16) return OpStatus::Ok();
  return Error(
      op, std::string(arg) + ": the CPU backend takes f32 or bf16 caches, got " + cache.ToString());
}

// Activations may be f32, bf16 or f16 on cuda; the CPU backend takes f32 only. Checked once
// the device is known, for every present tensor of `args`.
OpStatus CheckCpuF32(const char* op, const TensorDevice& device,
                     std::initializer_list<internal::NamedView> args) {
  if (!device.is_cpu()) return OpStatus::Ok();
  for (const internal::NamedView& a : args) {
    if (a.view->present() && a.view->dtype != kF32) {
      return Error(
          op, std::string(a.name) + ": the CPU backend takes f32 only, got " + a.view->ToString());
    }
  }
  return OpStatus::Ok();
}

// x of the in-place elementwise ops: f32, bf16 or f16, any shape, contiguous, with data unless
// empty.
OpStatus CheckElementwiseArg(const char* op, const char* arg, const TensorView& t) {
  if (t.ndim < 0 || !(t.dtype == kF32 || t.dtype == kBF16 || t.dtype == kF16)) {
    return Error(op, std::string(arg) + ": expected f32|bf16|f16, any shape, got " + t.ToString());
  }
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0) {
      return Error(op, std::string(arg) + ": expected sizes >= 0, got " + t.ToString());
    }
  }
  if (!t.is_contiguous()) {
    return Error(op, std::string(arg) + ": must be contiguous, got " + t.ToString() +
                         " with non-row-major strides");
  }
  if (t.data == nullptr && t.numel() > 0) {
    return Error(op, std::string(arg) + ": data is null for " + t.ToString());
  }
  return OpStatus::Ok();
}

}  // namespace

OpStatus Embedding(const OpContext& ctx, const TensorView& out, const TensorView& token_ids,
                   const TensorView& table) {
  constexpr const char* kOp = "Embedding";
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "token_ids", token_ids, {kI32, kI64}, {kAny}));
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "table", table, {kF32, kBF16, kF16}, {kAny, kAny}));
  LLM_OPS_RETURN_IF_ERROR(
      CheckArg(kOp, "out", out, {table.dtype}, {token_ids.shape[0], table.shape[1]}));
  TensorDevice device;
  LLM_OPS_RETURN_IF_ERROR(
      CheckSameDevice(kOp, {{"out", &out}, {"token_ids", &token_ids}, {"table", &table}}, &device));
  LLM_OPS_RETURN_IF_ERROR(CheckCpuF32(kOp, device, {{"table", &table}}));
#ifdef LLM_WITH_CUDA
  if (device.is_cuda()) return cuda::Embedding(ctx.stream, out, token_ids, table);
#endif
  if (!device.is_cpu()) return NoBackend(kOp, device);
  return cpu::Embedding(out, token_ids, table);
}

OpStatus RmsNorm(const OpContext& ctx, const TensorView& out, const TensorView& x,
                 const TensorView& weight, float eps) {
  constexpr const char* kOp = "RmsNorm";
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "x", x, {kF32, kBF16, kF16}, {kAny, kAny}));
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "weight", weight, {x.dtype}, {x.shape[1]}));
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "out", out, {x.dtype}, {x.shape[0], x.shape[1]}));
  if (!(eps > 0.0f)) return Error(kOp, "eps must be > 0, got " + std::to_string(eps));
  TensorDevice device;
  LLM_OPS_RETURN_IF_ERROR(
      CheckSameDevice(kOp, {{"out", &out}, {"x", &x}, {"weight", &weight}}, &device));
  LLM_OPS_RETURN_IF_ERROR(CheckCpuF32(kOp, device, {{"x", &x}}));
#ifdef LLM_WITH_CUDA
  if (device.is_cuda()) return cuda::RmsNorm(ctx.stream, out, x, weight, eps);
#endif
  if (!device.is_cpu()) return NoBackend(kOp, device);
  return cpu::RmsNorm(out, x, weight, eps);
}

OpStatus FusedAddRmsNorm(const OpContext& ctx, const TensorView& x, const TensorView& residual,
                         const TensorView& weight, float eps) {
  constexpr const char* kOp = "FusedAddRmsNorm";
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "x", x, {kF32, kBF16, kF16}, {kAny, kAny}));
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "residual", residual, {x.dtype}, {x.shape[0], x.shape[1]}));
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "weight", weight, {x.dtype}, {x.shape[1]}));
  if (!(eps > 0.0f)) return Error(kOp, "eps must be > 0, got " + std::to_string(eps));
  TensorDevice device;
  LLM_OPS_RETURN_IF_ERROR(
      CheckSameDevice(kOp, {{"x", &x}, {"residual", &residual}, {"weight", &weight}}, &device));
  LLM_OPS_RETURN_IF_ERROR(CheckCpuF32(kOp, device, {{"x", &x}}));
#ifdef LLM_WITH_CUDA
  if (device.is_cuda()) return cuda::FusedAddRmsNorm(ctx.stream, x, residual, weight, eps);
#endif
  if (!device.is_cpu()) return NoBackend(kOp, device);
  return cpu::FusedAddRmsNorm(x, residual, weight, eps);
}

OpStatus HeadRmsNorm(const OpContext& ctx, const TensorView& x, const TensorView& weight,
                     float eps) {
  constexpr const char* kOp = "HeadRmsNorm";
  LLM_OPS_RETURN_IF_ERROR(
      CheckTokenStridedArg(kOp, "x", x, {kF32, kBF16, kF16}, {kAny, kAny, kAny}));
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "weight", weight, {x.dtype}, {x.shape[2]}));
  if (!(eps > 0.0f)) return Error(kOp, "eps must be > 0, got " + std::to_string(eps));
  TensorDevice device;
  LLM_OPS_RETURN_IF_ERROR(CheckSameDevice(kOp, {{"x", &x}, {"weight", &weight}}, &device));
  LLM_OPS_RETURN_IF_ERROR(CheckCpuF32(kOp, device, {{"x", &x}}));
#ifdef LLM_WITH_CUDA
  if (device.is_cuda()) return cuda::HeadRmsNorm(ctx.stream, x, weight, eps);
#endif
  if (!device.is_cpu()) return NoBackend(kOp, device);
  return cpu::HeadRmsNorm(x, weight, eps);
}

OpStatus SumOfSquares(const OpContext& ctx, const TensorView& sums, const TensorView& x) {
  constexpr const char* kOp = "SumOfSquares";
  LLM_OPS_RETURN_IF_ERROR(
      CheckTokenStridedArg(kOp, "x", x, {kF32, kBF16, kF16}, {kAny, kAny, kAny}));
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "sums", sums, {kF32}, {x.shape[0]}));
  TensorDevice device;
  LLM_OPS_RETURN_IF_ERROR(CheckSameDevice(kOp, {{"x", &x}, {"sums", &sums}}, &device));
  LLM_OPS_RETURN_IF_ERROR(CheckCpuF32(kOp, device, {{"x", &x}}));
#ifdef LLM_WITH_CUDA
  if (device.is_cuda()) return cuda::SumOfSquares(ctx.stream, sums, x);
#endif
  if (!device.is_cpu()) return NoBackend(kOp, device);
  return cpu::SumOfSquares(sums, x);
}

OpStatus RmsNormBySums(const OpContext& ctx, const TensorView& x, const TensorView& sums,
                       const TensorView& weight, int64_t count, float eps) {
  constexpr const char* kOp = "RmsNormBySums";
  LLM_OPS_RETURN_IF_ERROR(
      CheckTokenStridedArg(kOp, "x", x, {kF32, kBF16, kF16}, {kAny, kAny, kAny}));
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "sums", sums, {kF32}, {x.shape[0]}));
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "weight", weight, {x.dtype}, {x.shape[1] * x.shape[2]}));
  if (count < x.shape[1] * x.shape[2]) {
    return Error(kOp, "count " + std::to_string(count) + " is less than a row of x (" +
                          std::to_string(x.shape[1] * x.shape[2]) + ")");
  }
  if (!(eps > 0.0f)) return Error(kOp, "eps must be > 0, got " + std::to_string(eps));
  TensorDevice device;
  LLM_OPS_RETURN_IF_ERROR(
      CheckSameDevice(kOp, {{"x", &x}, {"sums", &sums}, {"weight", &weight}}, &device));
  LLM_OPS_RETURN_IF_ERROR(CheckCpuF32(kOp, device, {{"x", &x}}));
#ifdef LLM_WITH_CUDA
  if (device.is_cuda()) return cuda::RmsNormBySums(ctx.stream, x, sums, weight, count, eps);
#endif
  if (!device.is_cpu()) return NoBackend(kOp, device);
  return cpu::RmsNormBySums(x, sums, weight, count, eps);
}

OpStatus ComputeRopeInvFreq(const RopeConfig& config, std::span<double> inv_freq) {
  constexpr const char* kOp = "ComputeRopeInvFreq";
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  if (half <= 0) return Error(kOp, "inv_freq: expected rotary_dim / 2 > 0 entries, got 0");
  if (!(config.theta > 0.0)) {
    return Error(kOp, "theta must be > 0, got " + std::to_string(config.theta));
  }
  const RopeScaling& sc = config.scaling;
  if (sc.type != RopeScaling::Type::kNone && !(sc.factor > 0.0)) {
    return Error(kOp, "rope_scaling.factor must be > 0, got " + std::to_string(sc.factor));
  }
  if (sc.type == RopeScaling::Type::kLlama3 &&
      !(sc.high_freq_factor > sc.low_freq_factor && sc.low_freq_factor > 0.0 &&
        sc.original_max_position_embeddings > 0)) {
    return Error(kOp,
                 "llama3 rope_scaling needs high_freq_factor > low_freq_factor > 0 and "
                 "original_max_position_embeddings > 0, got high_freq_factor " +
                     std::to_string(sc.high_freq_factor) + ", low_freq_factor " +
                     std::to_string(sc.low_freq_factor) + ", original_max_position_embeddings " +
                     std::to_string(sc.original_max_position_embeddings));
  }
  if (!config.freq_factors.empty()) {
    if (static_cast<int64_t>(config.freq_factors.size()) != half) {
      return Error(kOp, "freq_factors: expected " + std::to_string(half) + " factors, got " +
                            std::to_string(config.freq_factors.size()));
    }
    for (double v : config.freq_factors) {
      if (!(v > 0.0) || !std::isfinite(v)) {
        return Error(kOp, "freq_factors: expected factors > 0, got " + std::to_string(v));
      }
    }
  }
  const double dim = 2.0 * static_cast<double>(half);
  for (int64_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(config.theta, static_cast<double>(2 * i) / dim);
    switch (sc.type) {
      case RopeScaling::Type::kNone:
        break;
      case RopeScaling::Type::kLinear:
        f /= sc.factor;  // the same as dividing positions by factor
        break;
      case RopeScaling::Type::kLlama3: {
        // transformers' _compute_llama3_parameters: long wavelengths are divided by factor,
        // short ones kept, and the band between interpolated smoothly.
        const double old_len = static_cast<double>(sc.original_max_position_embeddings);
        const double low_freq_wavelen = old_len / sc.low_freq_factor;
        const double high_freq_wavelen = old_len / sc.high_freq_factor;
        const double wavelen = 2.0 * std::numbers::pi / f;
        if (wavelen > low_freq_wavelen) {
          f /= sc.factor;
        } else if (wavelen >= high_freq_wavelen) {
          const double smooth =
              (old_len / wavelen - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor);
          f = (1.0 - smooth) * f / sc.factor + smooth * f;
        }
        break;
      }
    }
    if (!config.freq_factors.empty()) f /= config.freq_factors[i];
    inv_freq[i] = f;
  }
  return OpStatus::Ok();
}

OpStatus RotaryEmbedding(const OpContext& ctx, const TensorView& positions, const TensorView& query,
                         const TensorView& key, const RopeConfig& config) {
  constexpr const char* kOp = "RotaryEmbedding";
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "positions", positions, {kI32, kI64}, {kAny}));
  const int64_t num_tokens = positions.shape[0];
  LLM_OPS_RETURN_IF_ERROR(
      CheckTokenStridedArg(kOp, "query", query, {kF32, kBF16, kF16}, {num_tokens, kAny, kAny}));
  const int64_t head_size = query.shape[2];
  LLM_OPS_RETURN_IF_ERROR(
      CheckTokenStridedArg(kOp, "key", key, {query.dtype}, {num_tokens, kAny, head_size}));
  const int64_t rotary_dim = config.rotary_dim == 0 ? head_size : config.rotary_dim;
  if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > head_size) {
    return Error(kOp, "rotary_dim must be even, > 0 and <= head size " + std::to_string(head_size) +
                          ", got " + std::to_string(rotary_dim));
  }
  TensorDevice device;
  LLM_OPS_RETURN_IF_ERROR(
      CheckSameDevice(kOp, {{"positions", &positions}, {"query", &query}, {"key", &key}}, &device));
  if (!device.is_cpu() && !device.is_cuda()) return NoBackend(kOp, device);
  LLM_OPS_RETURN_IF_ERROR(CheckCpuF32(kOp, device, {{"query", &query}}));
  std::vector<double> inv_freq(rotary_dim / 2);
  LLM_OPS_RETURN_IF_ERROR(ComputeRopeInvFreq(config, inv_freq));
  if (device.is_cuda()) {
#ifdef LLM_WITH_CUDA
    return cuda::RotaryEmbedding(ctx.stream, positions, query, key, inv_freq,
                                 static_cast<int>(rotary_dim));
#else
    return NoBackend(kOp, device);
#endif
  }
  return cpu::RotaryEmbedding(positions, query, key, inv_freq, static_cast<int>(rotary_dim));
}

OpStatus ComputeRopeCosSinCache(const RopeConfig& config, int64_t max_position,
                                std::span<float> out) {
  constexpr const char* kOp = "ComputeRopeCosSinCache";
  const int64_t rotary_dim = config.rotary_dim;
  if (rotary_dim <= 0 || rotary_dim % 2 != 0) {
    return Error(kOp, "config.rotary_dim must be even and > 0, got " + std::to_string(rotary_dim));
  }
  if (max_position < 0) {
    return Error(kOp, "max_position must be >= 0, got " + std::to_string(max_position));
  }
  if (static_cast<int64_t>(out.size()) != max_position * rotary_dim) {
    return Error(kOp, "out: expected max_position * rotary_dim = " +
                          std::to_string(max_position * rotary_dim) + " floats, got " +
                          std::to_string(out.size()));
  }
  const int64_t half = rotary_dim / 2;
  std::vector<double> inv_freq(half);
  LLM_OPS_RETURN_IF_ERROR(ComputeRopeInvFreq(config, inv_freq));
  for (int64_t p = 0; p < max_position; ++p) {
    float* row = out.data() + p * rotary_dim;  // [cos_0 .. cos_{half-1}, sin_0 .. sin_{half-1}]
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * inv_freq[i];
      row[i] = static_cast<float>(std::cos(angle));
      row[half + i] = static_cast<float>(std::sin(angle));
    }
  }
  return OpStatus::Ok();
}

OpStatus RotaryEmbeddingCached(const OpContext& ctx, const TensorView& positions,
                               const TensorView& query, const TensorView& key,
                               const TensorView& cos_sin_cache) {
  constexpr const char* kOp = "RotaryEmbeddingCached";
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "positions", positions, {kI32, kI64}, {kAny}));
  const int64_t num_tokens = positions.shape[0];
  LLM_OPS_RETURN_IF_ERROR(
      CheckTokenStridedArg(kOp, "query", query, {kF32, kBF16, kF16}, {num_tokens, kAny, kAny}));
  const int64_t head_size = query.shape[2];
  LLM_OPS_RETURN_IF_ERROR(
      CheckTokenStridedArg(kOp, "key", key, {query.dtype}, {num_tokens, kAny, head_size}));
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "cos_sin_cache", cos_sin_cache, {kF32}, {kAny, kAny}));
  const int64_t rotary_dim = cos_sin_cache.shape[1];
  if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > head_size) {
    return Error(kOp,
                 "cos_sin_cache: rotary_dim (its second dim) must be even, > 0 and <= head "
                 "size " +
                     std::to_string(head_size) + ", got " + cos_sin_cache.ToString());
  }
  TensorDevice device;
  LLM_OPS_RETURN_IF_ERROR(CheckSameDevice(kOp,
                                          {{"positions", &positions},
                                           {"query", &query},
                                           {"key", &key},
                                           {"cos_sin_cache", &cos_sin_cache}},
                                          &device));
#ifdef LLM_WITH_CUDA
  if (device.is_cuda())
    return cuda::RotaryEmbeddingCached(ctx.stream, positions, query, key, cos_sin_cache);
#endif
  if (!device.is_cpu()) return NoBackend(kOp, device);
  LLM_OPS_RETURN_IF_ERROR(CheckCpuF32(kOp, device, {{"query", &query}}));
  return cpu::RotaryEmbeddingCached(positions, query, key, cos_sin_cache);
}

OpStatus SiluAndMul(const OpContext& ctx, const TensorView& out, const TensorView& x) {
  constexpr const char* kOp = "SiluAndMul";
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "x", x, {kF32, kBF16, kF16}, {kAny, kAny}));
  if (x.shape[1] % 2 != 0) {
    return Error(kOp, "x: expected an even last dim [T, 2 * I], got " + x.ToString());
  }
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "out", out, {x.dtype}, {x.shape[0], x.shape[1] / 2}));
  TensorDevice device;
  LLM_OPS_RETURN_IF_ERROR(CheckSameDevice(kOp, {{"out", &out}, {"x", &x}}, &device));
  LLM_OPS_RETURN_IF_ERROR(CheckCpuF32(kOp, device, {{"x", &x}}));
#ifdef LLM_WITH_CUDA
  if (device.is_cuda()) return cuda::SiluAndMul(ctx.stream, out, x);
#endif
  if (!device.is_cpu()) return NoBackend(kOp, device);
  return cpu::SiluAndMul(out, x);
}

OpStatus GeluTanhAndMul(const OpContext& ctx, const TensorView& out, const TensorView& x) {
  constexpr const char* kOp = "GeluTanhAndMul";
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "x", x, {kF32, kBF16, kF16}, {kAny, kAny}));
  if (x.shape[1] % 2 != 0) {
    return Error(kOp, "x: expected an even last dim [T, 2 * I], got " + x.ToString());
  }
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "out", out, {x.dtype}, {x.shape[0], x.shape[1] / 2}));
  TensorDevice device;
  LLM_OPS_RETURN_IF_ERROR(CheckSameDevice(kOp, {{"out", &out}, {"x", &x}}, &device));
  LLM_OPS_RETURN_IF_ERROR(CheckCpuF32(kOp, device, {{"x", &x}}));
#ifdef LLM_WITH_CUDA
  if (device.is_cuda()) return cuda::GeluTanhAndMul(ctx.stream, out, x);
#endif
  if (!device.is_cpu()) return NoBackend(kOp, device);
  return cpu::GeluTanhAndMul(out, x);
}

OpStatus MoeRoute(const OpContext& ctx, const TensorView& offsets, const TensorView& sorted_tokens,
                  const TensorView& experts, const TensorView& weights, const TensorView& positions,
                  const TensorView& logits, int k, bool normalize) {
  constexpr const char* kOp = "MoeRoute";
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "logits", logits, {kF32}, {kAny, kAny}));
  const int64_t t = logits.shape[0], e = logits.shape[1];
  if (k < 1 || k > e) {
    return Error(
        kOp, "k: expected 1 <= k <= " + std::to_string(e) + " experts, got " + std::to_string(k));
  }
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "offsets", offsets, {kI32}, {e + 1}));
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "sorted_tokens", sorted_tokens, {kI32}, {t * k}));
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "experts", experts, {kI32}, {t, k}));
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "weights", weights, {kF32}, {t, k}));
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "positions", positions, {kI32}, {t, k}));
  TensorDevice device;
  LLM_OPS_RETURN_IF_ERROR(CheckSameDevice(kOp,
                                          {{"offsets", &offsets},
                                           {"sorted_tokens", &sorted_tokens},
                                           {"experts", &experts},
                                           {"weights", &weights},
                                           {"positions", &positions},
                                           {"logits", &logits}},
                                          &device));
#ifdef LLM_WITH_CUDA
  if (device.is_cuda()) {
    return cuda::MoeRoute(ctx.stream, offsets, sorted_tokens, experts, weights, positions, logits,
                          k, normalize);
  }
#endif
  if (!device.is_cpu()) return NoBackend(kOp, device);
  return cpu::MoeRoute(offsets, sorted_tokens, experts, weights, positions, logits, k, normalize);
}

OpStatus MoeCombine(const OpContext& ctx, const TensorView& out, const TensorView& expert_out,
                    const TensorView& weights, const TensorView& positions,
                    const TensorView& shared, const TensorView& shared_gate) {
  constexpr const char* kOp = "MoeCombine";
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "out", out, {kF32, kBF16, kF16}, {kAny, kAny}));
  const int64_t t = out.shape[0], h = out.shape[1];
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "weights", weights, {kF32}, {t, kAny}));
  const int64_t k = weights.shape[1];
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "positions", positions, {kI32}, {t, k}));
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "expert_out", expert_out, {out.dtype}, {t * k, h}));
  if (shared.present() != shared_gate.present()) {
    return Error(kOp, "shared and shared_gate: expected both present or both absent");
  }
  if (shared.present()) {
    LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "shared", shared, {out.dtype}, {t, h}));
    LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "shared_gate", shared_gate, {kF32}, {t, 1}));
  }
  TensorDevice device;
  LLM_OPS_RETURN_IF_ERROR(CheckSameDevice(kOp,
                                          {{"out", &out},
                                           {"expert_out", &expert_out},
                                           {"weights", &weights},
                                           {"positions", &positions},
                                           {"shared", &shared},
                                           {"shared_gate", &shared_gate}},
                                          &device));
  LLM_OPS_RETURN_IF_ERROR(CheckCpuF32(kOp, device, {{"out", &out}}));
  if (device.is_cpu()) {
    // The cuda kernel cannot check positions without a synchronization (it skips a bad one).
    for (int64_t i = 0; i < t * k; ++i) {
      const int32_t p = positions.data_as<const int32_t>()[i];
      if (p < 0 || p >= t * k) {
        return Error(kOp, "positions: " + std::to_string(p) + " is outside [0, " +
                              std::to_string(t * k) + ")");
      }
    }
  }
#ifdef LLM_WITH_CUDA
  if (device.is_cuda()) {
    return cuda::MoeCombine(ctx.stream, out, expert_out, weights, positions, shared, shared_gate);
  }
#endif
  if (!device.is_cpu()) return NoBackend(kOp, device);
  return cpu::MoeCombine(out, expert_out, weights, positions, shared, shared_gate);
}

OpStatus Scale(const OpContext& ctx, const TensorView& x, float factor) {
  constexpr const char* kOp = "Scale";
  LLM_OPS_RETURN_IF_ERROR(CheckElementwiseArg(kOp, "x", x));
  if (!std::isfinite(factor)) {
    return Error(kOp, "factor must be finite, got " + std::to_string(factor));
  }
  TensorDevice device;
  LLM_OPS_RETURN_IF_ERROR(CheckSameDevice(kOp, {{"x", &x}}, &device));
  LLM_OPS_RETURN_IF_ERROR(CheckCpuF32(kOp, device, {{"x", &x}}));
#ifdef LLM_WITH_CUDA
  if (device.is_cuda()) return cuda::Scale(ctx.stream, x, factor);
#endif
  if (!device.is_cpu()) return NoBackend(kOp, device);
  return cpu::Scale(x, factor);
}

OpStatus Softcap(const OpContext& ctx, const TensorView& x, float cap) {
  constexpr const char* kOp = "Softcap";
  LLM_OPS_RETURN_IF_ERROR(CheckElementwiseArg(kOp, "x", x));
  if (!(cap > 0.0f) || !std::isfinite(cap)) {
    return Error(kOp, "cap must be finite and > 0, got " + std::to_string(cap));
  }
  TensorDevice device;
  LLM_OPS_RETURN_IF_ERROR(CheckSameDevice(kOp, {{"x", &x}}, &device));
  LLM_OPS_RETURN_IF_ERROR(CheckCpuF32(kOp, device, {{"x", &x}}));
#ifdef LLM_WITH_CUDA
  if (device.is_cuda()) return cuda::Softcap(ctx.stream, x, cap);
#endif
  if (!device.is_cpu()) return NoBackend(kOp, device);
  return cpu::Softcap(x, cap);
}

OpStatus Linear(const OpContext& ctx, const TensorView& out, const TensorView& x,
                const TensorView& weight, const TensorView& bias) {
  constexpr const char* kOp = "Linear";
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "x", x, {kF32, kBF16, kF16}, {kAny, kAny}));
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "weight", weight, {x.dtype}, {kAny, x.shape[1]}));
  LLM_OPS_RETURN_IF_ERROR(
      CheckArg(kOp, "out", out, {x.dtype, kF32}, {x.shape[0], weight.shape[0]}));
  if (bias.present()) {
    LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "bias", bias, {out.dtype}, {weight.shape[0]}));
  }
  // BLAS takes 32-bit sizes.
  constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
  if (x.shape[0] > kMaxDim || x.shape[1] > kMaxDim || weight.shape[0] > kMaxDim) {
    return Error(kOp, "dimensions of x " + x.ShapeString() + " and weight " + weight.ShapeString() +
                          " must be below 2^31");
  }
  TensorDevice device;
  LLM_OPS_RETURN_IF_ERROR(CheckSameDevice(
      kOp, {{"out", &out}, {"x", &x}, {"weight", &weight}, {"bias", &bias}}, &device));
  LLM_OPS_RETURN_IF_ERROR(CheckCpuF32(kOp, device, {{"x", &x}, {"out", &out}}));
#ifdef LLM_WITH_CUDA
  if (device.is_cuda()) return cuda::Linear(ctx, out, x, weight, bias);
#endif
  if (!device.is_cpu()) return NoBackend(kOp, device);
  return cpu::Linear(out, x, weight, bias);
}

OpStatus ReshapeAndCache(const OpContext& ctx, const TensorView& key, const TensorView& value,
                         const TensorView& key_cache, const TensorView& value_cache,
                         const TensorView& slot_mapping) {
  constexpr const char* kOp = "ReshapeAndCache";
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "slot_mapping", slot_mapping, {kI32, kI64}, {kAny}));
  const int64_t num_tokens = slot_mapping.shape[0];
  LLM_OPS_RETURN_IF_ERROR(
      CheckArg(kOp, "key_cache", key_cache, {kF32, kF16, kBF16}, {kAny, kAny, kAny, kAny}));
  const int64_t num_blocks = key_cache.shape[0], block_size = key_cache.shape[1];
  const int64_t num_kv_heads = key_cache.shape[2], head_size = key_cache.shape[3];
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "value_cache", value_cache, {key_cache.dtype},
                                   {num_blocks, block_size, num_kv_heads, head_size}));
  LLM_OPS_RETURN_IF_ERROR(CheckTokenStridedArg(kOp, "key", key, {kF32, kBF16, kF16},
                                               {num_tokens, num_kv_heads, head_size}));
  LLM_OPS_RETURN_IF_ERROR(CheckTokenStridedArg(kOp, "value", value, {key.dtype},
                                               {num_tokens, num_kv_heads, head_size}));
  TensorDevice device;
  LLM_OPS_RETURN_IF_ERROR(CheckSameDevice(kOp,
                                          {{"key", &key},
                                           {"value", &value},
                                           {"key_cache", &key_cache},
                                           {"value_cache", &value_cache},
                                           {"slot_mapping", &slot_mapping}},
                                          &device));
#ifdef LLM_WITH_CUDA
  if (device.is_cuda())
    return cuda::ReshapeAndCache(ctx.stream, key, value, key_cache, value_cache, slot_mapping);
#endif
  if (!device.is_cpu()) return NoBackend(kOp, device);
  LLM_OPS_RETURN_IF_ERROR(CheckCpuF32(kOp, device, {{"key", &key}}));
  LLM_OPS_RETURN_IF_ERROR(CheckCpuCache(kOp, "key_cache", key_cache));
  return cpu::ReshapeAndCache(key, value, key_cache, value_cache, slot_mapping);
}

OpStatus PagedAttention(const OpContext& ctx, const TensorView& out, const TensorView& query,
                        const TensorView& key_cache, const TensorView& value_cache,
                        const AttentionMetadata& metadata, const AttentionOptions& options) {
  constexpr const char* kOp = "PagedAttention";
  // f32 query and out with f32, f16 or bf16 caches, or everything bf16 or everything f16.
  LLM_OPS_RETURN_IF_ERROR(
      CheckTokenStridedArg(kOp, "query", query, {kF32, kF16, kBF16}, {kAny, kAny, kAny}));
  const int64_t num_tokens = query.shape[0], num_heads = query.shape[1];
  const int64_t head_size = query.shape[2];
  LLM_OPS_RETURN_IF_ERROR(
      CheckArg(kOp, "out", out, {query.dtype}, {num_tokens, num_heads, head_size}));
  if (query.dtype == kF32) {
    LLM_OPS_RETURN_IF_ERROR(
        CheckArg(kOp, "key_cache", key_cache, {kF32, kF16, kBF16}, {kAny, kAny, kAny, head_size}));
  } else {
    LLM_OPS_RETURN_IF_ERROR(
        CheckArg(kOp, "key_cache", key_cache, {query.dtype}, {kAny, kAny, kAny, head_size}));
  }
  const int64_t num_blocks = key_cache.shape[0], block_size = key_cache.shape[1];
  const int64_t num_kv_heads = key_cache.shape[2];
  LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, "value_cache", value_cache, {key_cache.dtype},
                                   {num_blocks, block_size, num_kv_heads, head_size}));
  if (block_size <= 0) return Error(kOp, "key_cache: block_size must be > 0");
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) {
    return Error(kOp, "query heads (" + std::to_string(num_heads) +
                          ") must be a multiple of key_cache's kv heads (" +
                          std::to_string(num_kv_heads) + ")");
  }
  LLM_OPS_RETURN_IF_ERROR(
      CheckArg(kOp, "metadata.block_tables", metadata.block_tables, {kI32}, {kAny, kAny}));
  const int64_t num_seqs = metadata.block_tables.shape[0];
  LLM_OPS_RETURN_IF_ERROR(
      CheckArg(kOp, "metadata.seq_lens", metadata.seq_lens, {kI32}, {num_seqs}));
  LLM_OPS_RETURN_IF_ERROR(
      CheckArg(kOp, "metadata.query_start_loc", metadata.query_start_loc, {kI32}, {num_seqs + 1}));
  if (!std::isfinite(options.scale)) return Error(kOp, "scale must be finite");
  if (options.sliding_window < 0) {
    return Error(kOp, "options.sliding_window must be >= 0 (0 = none), got " +
                          std::to_string(options.sliding_window));
  }
  if (!(options.softcap >= 0.0f) || std::isinf(options.softcap)) {
    return Error(kOp, "options.softcap must be finite and >= 0 (0 = none), got " +
                          std::to_string(options.softcap));
  }
  const size_t host_qsl = metadata.query_start_loc_host.size();
  if (host_qsl != 0 && static_cast<int64_t>(host_qsl) != num_seqs + 1) {
    return Error(kOp, "metadata.query_start_loc_host: expected " + std::to_string(num_seqs + 1) +
                          " entries (or none), got " + std::to_string(host_qsl));
  }
  const size_t host_lens = metadata.seq_lens_host.size();
  if (host_lens != 0 && static_cast<int64_t>(host_lens) != num_seqs) {
    return Error(kOp, "metadata.seq_lens_host: expected " + std::to_string(num_seqs) +
                          " entries (or none), got " + std::to_string(host_lens));
  }
  TensorDevice device;
  LLM_OPS_RETURN_IF_ERROR(CheckSameDevice(kOp,
                                          {{"out", &out},
                                           {"query", &query},
                                           {"key_cache", &key_cache},
                                           {"value_cache", &value_cache},
                                           {"metadata.block_tables", &metadata.block_tables},
                                           {"metadata.seq_lens", &metadata.seq_lens},
                                           {"metadata.query_start_loc", &metadata.query_start_loc}},
                                          &device));
#ifdef LLM_WITH_CUDA
  if (device.is_cuda())
    return cuda::PagedAttention(ctx, out, query, key_cache, value_cache, metadata, options);
#endif
  if (!device.is_cpu()) return NoBackend(kOp, device);
  if (query.dtype != kF32) {
    return Error(kOp, "query: the CPU backend takes f32 queries, got " + query.ToString());
  }
  LLM_OPS_RETURN_IF_ERROR(CheckCpuCache(kOp, "key_cache", key_cache));
  return cpu::PagedAttention(out, query, key_cache, value_cache, metadata, options);
}

OpStatus PagedAttention(const OpContext& ctx, const TensorView& out, const TensorView& query,
                        const TensorView& key_cache, const TensorView& value_cache,
                        const AttentionMetadata& metadata, float scale) {
  AttentionOptions options;
  options.scale = scale;
  return PagedAttention(ctx, out, query, key_cache, value_cache, metadata, options);
}

size_t PagedAttentionWorkspaceBytes(int64_t max_num_tokens, int64_t num_heads, int64_t head_size,
                                    int64_t max_model_len) {
  return cuda::PagedAttentionWorkspaceBytes(max_num_tokens, num_heads, head_size, max_model_len);
}

OpStatus CopyBlocks(const OpContext& ctx, std::span<const TensorView> key_caches,
                    std::span<const TensorView> value_caches, std::span<const BlockPair> pairs) {
  constexpr const char* kOp = "CopyBlocks";
  if (key_caches.size() != value_caches.size()) {
    return Error(kOp, "key_caches has " + std::to_string(key_caches.size()) +
                          " layers but value_caches has " + std::to_string(value_caches.size()));
  }
  if (key_caches.empty()) return OpStatus::Ok();
  const TensorView& first = key_caches[0];
  LLM_OPS_RETURN_IF_ERROR(
      CheckArg(kOp, "key_caches[0]", first, {kF32, kF16, kBF16}, {kAny, kAny, kAny, kAny}));
  for (size_t l = 0; l < key_caches.size(); ++l) {
    for (const TensorView* t : {&key_caches[l], &value_caches[l]}) {
      const std::string name = std::string(t == &key_caches[l] ? "key_caches[" : "value_caches[") +
                               std::to_string(l) + "]";
      LLM_OPS_RETURN_IF_ERROR(
          CheckArg(kOp, name.c_str(), *t, {first.dtype},
                   {first.shape[0], first.shape[1], first.shape[2], first.shape[3]}));
      TensorDevice device;
      LLM_OPS_RETURN_IF_ERROR(
          CheckSameDevice(kOp, {{"key_caches[0]", &first}, {name.c_str(), t}}, &device));
    }
  }
#ifdef LLM_WITH_CUDA
  if (first.device.is_cuda()) return cuda::CopyBlocks(ctx.stream, key_caches, value_caches, pairs);
#endif
  if (!first.device.is_cpu()) return NoBackend(kOp, first.device);
  LLM_OPS_RETURN_IF_ERROR(CheckCpuCache(kOp, "key_caches[0]", first));
  return cpu::CopyBlocks(key_caches, value_caches, pairs);
}

OpStatus SwapBlocks(const OpContext& ctx, std::span<const TensorView> src,
                    std::span<const TensorView> dst, std::span<const BlockPair> pairs) {
  constexpr const char* kOp = "SwapBlocks";
  if (src.size() != dst.size()) {
    return Error(kOp, "src has " + std::to_string(src.size()) + " caches but dst has " +
                          std::to_string(dst.size()));
  }
  if (src.empty()) return OpStatus::Ok();
  const TensorView& s0 = src[0];
  LLM_OPS_RETURN_IF_ERROR(
      CheckArg(kOp, "src[0]", s0, {kF32, kF16, kBF16}, {kAny, kAny, kAny, kAny}));
  LLM_OPS_RETURN_IF_ERROR(
      CheckArg(kOp, "dst[0]", dst[0], {s0.dtype}, {kAny, s0.shape[1], s0.shape[2], s0.shape[3]}));
  const TensorView& d0 = dst[0];
  for (size_t i = 0; i < src.size(); ++i) {
    const std::string src_name = "src[" + std::to_string(i) + "]";
    const std::string dst_name = "dst[" + std::to_string(i) + "]";
    LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, src_name.c_str(), src[i], {s0.dtype},
                                     {s0.shape[0], s0.shape[1], s0.shape[2], s0.shape[3]}));
    LLM_OPS_RETURN_IF_ERROR(CheckArg(kOp, dst_name.c_str(), dst[i], {s0.dtype},
                                     {d0.shape[0], d0.shape[1], d0.shape[2], d0.shape[3]}));
    TensorDevice device;
    LLM_OPS_RETURN_IF_ERROR(
        CheckSameDevice(kOp, {{"src[0]", &s0}, {src_name.c_str(), &src[i]}}, &device));
    LLM_OPS_RETURN_IF_ERROR(
        CheckSameDevice(kOp, {{"dst[0]", &d0}, {dst_name.c_str(), &dst[i]}}, &device));
  }
#ifdef LLM_WITH_CUDA
  // Swap out (cuda -> cpu), swap in (cpu -> cuda) or between devices.
  if (s0.device.is_cuda() || d0.device.is_cuda()) {
    return cuda::SwapBlocks(ctx.stream, src, dst, pairs);
  }
#endif
  if (!s0.device.is_cpu()) return NoBackend(kOp, s0.device);
  if (!d0.device.is_cpu()) return NoBackend(kOp, d0.device);
  LLM_OPS_RETURN_IF_ERROR(CheckCpuCache(kOp, "src[0]", s0));
  return cpu::SwapBlocks(src, dst, pairs);
}

OpStatus SwapBlocks(const OpContext& ctx, const TensorView& src, const TensorView& dst,
                    std::span<const BlockPair> pairs) {
  return SwapBlocks(ctx, std::span<const TensorView>(&src, 1), std::span<const TensorView>(&dst, 1),
                    pairs);
}

}  // namespace llm::ops
