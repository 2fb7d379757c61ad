#include "kernels/cpu/quantized_linear.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

namespace llm::cpu {
namespace {

using ops::OpStatus;

// Output columns (weight rows) per work item: enough items to share among the threads at
// decode sizes, few enough that the dequantized tile of a prefill (rows x K floats) stays in
// the L2 cache.
constexpr int64_t kRowsPerTile = 64;

// Bytes of every thread's Scratch, for ScratchBytes().
std::atomic<size_t> g_scratch_bytes{0};

// Per thread: the quantized activations (the calling thread's) and the dequantized tile (each
// pool thread's). Grown by Reserve before serving, so that steps do not allocate.
struct Scratch {
  std::vector<Q8Block> xq;
  std::vector<float> tile;

  size_t bytes() const { return xq.capacity() * sizeof(Q8Block) + tile.capacity() * sizeof(float); }
  template <typename T>
  void Grow(std::vector<T>* v, size_t n) {
    if (v->size() >= n) return;
    const size_t before = bytes();
    v->resize(n);
    g_scratch_bytes.fetch_add(bytes() - before, std::memory_order_relaxed);
  }
  ~Scratch() { g_scratch_bytes.fetch_sub(bytes(), std::memory_order_relaxed); }
};
thread_local Scratch t_scratch;

}  // namespace

OpStatus QuantizedLinear::Create(int64_t k, std::vector<Part> parts, const TensorView& bias,
                                 std::unique_ptr<QuantizedLinear>* out) {
  if (k < 1) return OpStatus::Error("QuantizedLinear: k: expected >= 1, got " + std::to_string(k));
  int64_t n = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    const Part& part = parts[p];
    const std::string what = "QuantizedLinear: part " + std::to_string(p) + " (" +
                             std::string(QuantTypeName(part.type)) + "): ";
    if (k % QuantBlockElems(part.type) != 0) {
      return OpStatus::Error(what + "K = " + std::to_string(k) + " is not a multiple of " +
                             std::to_string(QuantBlockElems(part.type)));
    }
    if (part.rows < 0 ||
        static_cast<int64_t>(part.blocks.size()) != part.rows * QuantRowBytes(part.type, k)) {
      return OpStatus::Error(what + std::to_string(part.blocks.size()) + " bytes for " +
                             std::to_string(part.rows) + " rows of " + std::to_string(k));
    }
    n += part.rows;
  }
  if (n < 1) return OpStatus::Error("QuantizedLinear: parts: expected at least one row");
  if (bias.data != nullptr && (bias.dtype != DType::kF32 || bias.ndim != 1 || bias.shape[0] != n ||
                               !bias.device.is_cpu() || !bias.is_contiguous())) {
    return OpStatus::Error("QuantizedLinear: bias: expected f32 [" + std::to_string(n) +
                           "] on cpu, got " + bias.ToString());
  }
  std::unique_ptr<QuantizedLinear> q(new QuantizedLinear());
  q->n_ = n;
  q->k_ = k;
  q->parts_ = std::move(parts);
  int64_t col = 0;
  for (size_t p = 0; p < q->parts_.size(); ++p) {
    const int64_t rows = q->parts_[p].rows;
    for (int64_t r = 0; r < rows; r += kRowsPerTile) {
      q->tiles_.push_back({static_cast<int>(p), r, std::min(kRowsPerTile, rows - r), col + r});
    }
    col += rows;
  }
  if (bias.data != nullptr) {
    const float* b = bias.data_as<const float>();
    q->bias_.assign(b, b + n);
  }
  *out = std::move(q);
  return OpStatus::Ok();
}

size_t QuantizedLinear::bytes() const {
  size_t total = bias_.size() * sizeof(float);
  for (const Part& p : parts_) total += p.blocks.size();
  return total;
}

std::string QuantizedLinear::ImplementationName(int64_t m) const {
  std::string name = "quant:";
  for (size_t p = 0; p < parts_.size(); ++p) {
    const std::string_view t = QuantTypeName(parts_[p].type);
    if (name.find(t) != std::string::npos) continue;
    if (p > 0) name += "+";
    name += t;
  }
  if (m >= dequant_min_rows_) name += ":dequant";
  return name;
}

void QuantizedLinear::Reserve(int64_t max_m) const {
  const int64_t rows = std::min(max_m, dequant_min_rows_ - 1);
  t_scratch.Grow(&t_scratch.xq,
                 static_cast<size_t>(std::max<int64_t>(rows, 0) * (k_ / kQ8BlockElems)));
  // Steps that dequantize may do so on every thread of the calling thread's team.
  if (max_m < dequant_min_rows_) return;
#pragma omp parallel
  { t_scratch.Grow(&t_scratch.tile, static_cast<size_t>(kRowsPerTile * k_)); }
}

size_t QuantizedLinear::ScratchBytes() { return g_scratch_bytes.load(std::memory_order_relaxed); }

OpStatus QuantizedLinear::Forward(const TensorView& out, const TensorView& x) const {
  if (x.dtype != DType::kF32 || x.ndim != 2 || x.shape[1] != k_ || !x.device.is_cpu() ||
      !x.is_contiguous()) {
    return OpStatus::Error("QuantizedLinear: x: expected f32 [M, " + std::to_string(k_) +
                           "] contiguous on cpu, got " + x.ToString());
  }
  const int64_t m = x.shape[0];
  if (out.dtype != DType::kF32 || out.ndim != 2 || out.shape[0] != m || out.shape[1] != n_ ||
      !out.device.is_cpu() || !out.is_contiguous()) {
    return OpStatus::Error("QuantizedLinear: out: expected f32 [" + std::to_string(m) + ", " +
                           std::to_string(n_) + "] contiguous on cpu, got " + out.ToString());
  }
  if (m == 0) return OpStatus::Ok();
  const float* xf = x.data_as<const float>();
  float* o = out.data_as<float>();
  const int64_t ntiles = static_cast<int64_t>(tiles_.size());
  if (m < dequant_min_rows_) {
    const int64_t xb = k_ / kQ8BlockElems;
    t_scratch.Grow(&t_scratch.xq, static_cast<size_t>(m * xb));
    Q8Block* xq = t_scratch.xq.data();
    for (int64_t i = 0; i < m; ++i) QuantizeRowQ8(xf + i * k_, k_, xq + i * xb);
#pragma omp parallel for schedule(dynamic) if (ntiles > 1)
    for (int64_t t = 0; t < ntiles; ++t) {
      const Tile& tile = tiles_[t];
      const Part& p = parts_[tile.part];
      const int64_t rb = QuantRowBytes(p.type, k_);
      QuantGemm(p.type, p.blocks.data() + tile.row0 * rb, rb, tile.rows, k_, xq, xb, m,
                o + tile.col0, n_);
    }
  } else {
#pragma omp parallel for schedule(dynamic) if (ntiles > 1)
    for (int64_t t = 0; t < ntiles; ++t) {
      const Tile& tile = tiles_[t];
      const Part& p = parts_[tile.part];
      const int64_t rb = QuantRowBytes(p.type, k_);
      t_scratch.Grow(&t_scratch.tile, static_cast<size_t>(kRowsPerTile * k_));
      float* w = t_scratch.tile.data();
      DequantizeRowsFast(p.type, p.blocks.data() + tile.row0 * rb, rb, tile.rows, k_, w);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m),
                  static_cast<int>(tile.rows), static_cast<int>(k_), 1.0f, xf, static_cast<int>(k_),
                  w, static_cast<int>(k_), 0.0f, o + tile.col0, static_cast<int>(n_));
    }
  }
  if (!bias_.empty()) {
    for (int64_t i = 0; i < m; ++i) {
      float* row = o + i * n_;
      for (int64_t j = 0; j < n_; ++j) row[j] += bias_[j];
    }
  }
  return OpStatus::Ok();
}

OpStatus QuantizedLinear::GatherRows(const TensorView& out, const TensorView& rows) const {
  if (rows.dtype != DType::kI32 || rows.ndim != 1 || !rows.device.is_cpu() ||
      !rows.is_contiguous()) {
    return OpStatus::Error("QuantizedLinear::GatherRows: rows: expected i32 [T] on cpu, got " +
                           rows.ToString());
  }
  const int64_t t = rows.shape[0];
  if (out.dtype != DType::kF32 || out.ndim != 2 || out.shape[0] != t || out.shape[1] != k_ ||
      !out.device.is_cpu() || !out.is_contiguous()) {
    return OpStatus::Error("QuantizedLinear::GatherRows: out: expected f32 [" + std::to_string(t) +
                           ", " + std::to_string(k_) + "] contiguous on cpu, got " +
                           out.ToString());
  }
  const int32_t* ids = rows.data_as<const int32_t>();
  float* o = out.data_as<float>();
  for (int64_t i = 0; i < t; ++i) {
    float* dst = o + i * k_;
    int64_t row = ids[i];
    if (row < 0 || row >= n_) {
      std::memset(dst, 0, static_cast<size_t>(k_) * sizeof(float));
      continue;
    }
    for (const Part& p : parts_) {
      if (row < p.rows) {
        const int64_t rb = QuantRowBytes(p.type, k_);
        DequantizeRows(p.type, p.blocks.data() + row * rb, rb, 1, k_, dst);
        break;
      }
      row -= p.rows;
    }
  }
  return OpStatus::Ok();
}

}  // namespace llm::cpu
