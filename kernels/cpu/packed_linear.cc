#include "kernels/cpu/packed_linear.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "common/half.h"
#include "kernels/cpu/coded_gemv.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace llm::cpu {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using ops::OpStatus;

std::string Shape2(const TensorView& t) { return t.ToString(); }

std::atomic<bool> g_coded_weights{true};

const dnnl::engine& Engine() {
  static const dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

// Per thread: the oneDNN stream, the scratchpad and x rounded to bf16, grown as needed.
struct ThreadScratch {
  std::optional<dnnl::stream> stream;
  struct alignas(64) Line {
    char bytes[64];
  };
  std::vector<Line> pad;  // oneDNN's scratchpad, 64-byte aligned
  char* pad_data() { return reinterpret_cast<char*>(pad.data()); }
  void GrowPad(size_t bytes) {
    if (pad.size() * 64 < bytes) pad.resize((bytes + 63) / 64);
  }
  std::vector<uint16_t> src16;
};
ThreadScratch& Scratch() {
  thread_local ThreadScratch s;
  if (!s.stream) s.stream.emplace(Engine());
  return s;
}

// Where the primitive for a row count is kept: 1 .. kRowChunk at their count, kBigChunk after.
constexpr int64_t kNumSlots = PackedLinear::kRowChunk + 2;
int64_t Slot(int64_t m) { return m == PackedLinear::kBigChunk ? PackedLinear::kRowChunk + 1 : m; }

// The rows of the next chunk when `left` rows remain (see packed_linear.h).
int64_t ChunkRows(int64_t left) {
  return left >= PackedLinear::kBigChunk ? PackedLinear::kBigChunk
                                         : std::min(left, PackedLinear::kRowChunk);
}

// One primitive per row count, shared by every weight of one shape class.
struct RowPrimitive {
  dnnl::matmul prim;
  size_t scratch_bytes = 0;
  std::string impl;
};
struct ShapeClass {
  std::mutex mu;
  dnnl::memory::desc packed;  // the weights' layout, chosen once (format_tag::any)
  std::vector<std::optional<RowPrimitive>> by_m;  // [Slot(m)]
};
using ShapeKey = std::tuple<int64_t, int64_t, bool, bool>;  // n, k, bf16, bias

std::shared_ptr<ShapeClass> GetShapeClass(const ShapeKey& key) {
  static std::mutex mu;
  static auto* classes = new std::map<ShapeKey, std::shared_ptr<ShapeClass>>();
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<ShapeClass>& c = (*classes)[key];
  if (c == nullptr) {
    c = std::make_shared<ShapeClass>();
    c->by_m.resize(kNumSlots);
  }
  return c;
}

dnnl::matmul::primitive_desc MakeDesc(int64_t m, int64_t n, int64_t k, bool bf16, bool bias,
                                      const dnnl::memory::desc& weights) {
  const dnnl::memory::desc src({m, k}, bf16 ? dt::bf16 : dt::f32, tag::ab);
  const dnnl::memory::desc dst({m, n}, dt::f32, tag::ab);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (bias) {
    const dnnl::memory::desc b({1, n}, dt::f32, tag::ab);
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, b, dst), attr, Engine());
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst), attr, Engine());
}

// x rounded to bf16, nearest even (vcvtne2ps2bf16).
__attribute__((target("avx512f,avx512bf16"))) void ToBf16(const float* src, uint16_t* dst,
                                                          int64_t count) {
  int64_t i = 0;
  for (; i + 32 <= count; i += 32) {
    const __m512bh r = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
    _mm512_storeu_si512(dst + i, reinterpret_cast<const __m512i&>(r));
  }
  for (; i < count; ++i) dst[i] = FloatToBf16(src[i]);
}

}  // namespace

void SetCodedWeights(bool on) { g_coded_weights = on; }

bool CpuHasNativeBf16() {
  static const bool has = [] {
    const unsigned isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const unsigned bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    return (isa & bf16) == bf16;
  }();
  return has;
}

// The element offset of weights[k][n] (oneDNN's [K, N]) in a blocked layout, as oneDNN's
// memory_desc_wrapper::off_v computes it: the inner blocks from the innermost out, then the outer
// strides. Each dimension's part is added separately, so offset(k, n) = offset(k, 0) + offset(0,
// n) - offset0. (dnnl_memory_desc_t is a public struct in oneDNN 2.x, the version Debian ships.)
int64_t BlockedOffset(const dnnl_memory_desc_t& md, int64_t k, int64_t n) {
  const dnnl_blocking_desc_t& blk = md.format_desc.blocking;
  int64_t pos[2] = {k, n};
  int64_t offset = md.offset0, stride = 1;
  for (int j = blk.inner_nblks - 1; j >= 0; --j) {
    const int d = blk.inner_idxs[j];
    offset += pos[d] % blk.inner_blks[j] * stride;
    stride *= blk.inner_blks[j];
    pos[d] /= blk.inner_blks[j];
  }
  return offset + pos[0] * blk.strides[0] + pos[1] * blk.strides[1];
}

struct PackedLinear::Impl {
  std::shared_ptr<ShapeClass> shape;
  dnnl::memory weights;                    // packed, owned by oneDNN
  std::vector<int64_t> k_offsets;          // BlockedOffset(k, 0) per k; empty: not blocked
  dnnl::memory bias;                       // f32 [1, N]
  std::unique_ptr<CodedBf16Matrix> coded;  // small steps' copy, or null
  // Per row count: memory objects over the caller's x and out (their handles set per call).
  struct Args {
    dnnl::memory src, dst, pad;
    const RowPrimitive* prim = nullptr;
  };
  mutable std::vector<std::optional<Args>> args;  // [Slot(m)]

  // The primitive for m rows (m <= kRowChunk or m == kBigChunk), created on first use.
  OpStatus Get(int64_t m, int64_t n, int64_t k, bool bf16, bool has_bias, const Args** out) const {
    std::optional<Args>& a = args[Slot(m)];
    if (!a) {
      const RowPrimitive* rp;
      {
        std::lock_guard<std::mutex> lock(shape->mu);
        std::optional<RowPrimitive>& slot = shape->by_m[Slot(m)];
        if (!slot) {
          try {
            dnnl::matmul::primitive_desc pd = MakeDesc(m, n, k, bf16, has_bias, shape->packed);
            slot.emplace(RowPrimitive{dnnl::matmul(pd), pd.scratchpad_desc().get_size(),
                                      pd.impl_info_str()});
          } catch (const dnnl::error& e) {
            return OpStatus::Error("PackedLinear: oneDNN matmul for " + std::to_string(m) + "x" +
                                   std::to_string(k) + " -> " + std::to_string(n) +
                                   " failed: " + e.what());
          }
        }
        rp = &*slot;
      }
      Args made;
      made.prim = rp;
      made.src = dnnl::memory({{m, k}, bf16 ? dt::bf16 : dt::f32, tag::ab}, Engine(), nullptr);
      made.dst = dnnl::memory({{m, n}, dt::f32, tag::ab}, Engine(), nullptr);
      made.pad = dnnl::memory(
          {{static_cast<int64_t>(std::max<size_t>(rp->scratch_bytes, 1))}, dt::u8, tag::a},
          Engine(), nullptr);
      a.emplace(std::move(made));
    }
    *out = &*a;
    return OpStatus::Ok();
  }
};

PackedLinear::~PackedLinear() = default;

OpStatus PackedLinear::Create(const TensorView& weight, const TensorView& bias, DType weight_dtype,
                              std::unique_ptr<PackedLinear>* out) {
  if (weight.dtype != DType::kF32 || weight.ndim != 2 || !weight.device.is_cpu() ||
      !weight.is_contiguous() || weight.data == nullptr) {
    return OpStatus::Error("PackedLinear: weight: expected f32 [N, K] contiguous on cpu, got " +
                           Shape2(weight));
  }
  const int64_t n = weight.shape[0], k = weight.shape[1];
  if (n < 1 || k < 1) {
    return OpStatus::Error("PackedLinear: weight: expected N >= 1 and K >= 1, got " +
                           Shape2(weight));
  }
  if (bias.present() && (bias.dtype != DType::kF32 || bias.ndim != 1 || bias.shape[0] != n ||
                         !bias.device.is_cpu())) {
    return OpStatus::Error("PackedLinear: bias: expected f32 [" + std::to_string(n) +
                           "] on cpu, got " + Shape2(bias));
  }
  if (weight_dtype != DType::kF32 && weight_dtype != DType::kBF16) {
    return OpStatus::Error(std::string("PackedLinear: weight_dtype: expected f32 or bf16, got ") +
                           DTypeName(weight_dtype));
  }
  const bool bf16 = weight_dtype == DType::kBF16;
  if (bf16 && !CpuHasNativeBf16()) {
    return OpStatus::Error(
        "PackedLinear: weight_dtype: bf16 needs a CPU with AVX512_BF16 or AMX, and this one has "
        "neither");
  }
  std::unique_ptr<PackedLinear> p(new PackedLinear());
  p->n_ = n;
  p->k_ = k;
  p->weight_dtype_ = weight_dtype;
  p->has_bias_ = bias.present();
  p->impl_ = std::make_unique<Impl>();
  Impl& impl = *p->impl_;
  impl.args.resize(kNumSlots);
  try {
    impl.shape = GetShapeClass({n, k, bf16, bias.present()});
    {
      std::lock_guard<std::mutex> lock(impl.shape->mu);
      if (impl.shape->packed.is_zero()) {
        // The layout oneDNN picks for a full chunk of rows; every row count then uses it.
        const dnnl::memory::desc any({k, n}, bf16 ? dt::bf16 : dt::f32, tag::any);
        impl.shape->packed = MakeDesc(kRowChunk, n, k, bf16, bias.present(), any).weights_desc();
      }
    }
    // weight [N, K] row-major is oneDNN's weights [K, N] in format ba.
    dnnl::stream stream(Engine());
    std::vector<uint16_t> rounded;
    void* plain_data = weight.data;
    if (bf16) {
      rounded.resize(static_cast<size_t>(n * k));
      ToBf16(weight.data_as<const float>(), rounded.data(), n * k);
      plain_data = rounded.data();
    }
    if (bf16 && g_coded_weights) impl.coded = CodedBf16Matrix::Create(rounded.data(), n, k);
    dnnl::memory plain({{k, n}, bf16 ? dt::bf16 : dt::f32, tag::ba}, Engine(), plain_data);
    impl.weights = dnnl::memory(impl.shape->packed, Engine());
    dnnl::reorder(plain, impl.weights).execute(stream, plain, impl.weights);
    const dnnl_memory_desc_t& md = impl.shape->packed.data;
    if (md.format_kind == dnnl_blocked && md.ndims == 2) {
      impl.k_offsets.resize(static_cast<size_t>(k));
      for (int64_t i = 0; i < k; ++i) impl.k_offsets[i] = BlockedOffset(md, i, 0);
    }
    impl.bias = dnnl::memory({{1, n}, dt::f32, tag::ab}, Engine());
    if (bias.present()) {
      std::memcpy(impl.bias.get_data_handle(), bias.data, static_cast<size_t>(n) * 4);
    }
    stream.wait();
  } catch (const dnnl::error& e) {
    return OpStatus::Error("PackedLinear: packing the weight " + Shape2(weight) +
                           " failed: " + e.what());
  }
  *out = std::move(p);
  return OpStatus::Ok();
}

size_t PackedLinear::packed_bytes() const {
  return impl_->weights.get_desc().get_size() + (has_bias_ ? static_cast<size_t>(n_) * 4 : 0) +
         (impl_->coded != nullptr ? impl_->coded->bytes() : 0);
}

bool PackedLinear::has_coded() const { return impl_->coded != nullptr; }

size_t PackedLinear::coded_bytes() const {
  return impl_->coded != nullptr ? impl_->coded->bytes() : 0;
}

bool PackedLinear::UsesCoded(int64_t m) const {
  return impl_->coded != nullptr && m >= 1 && m <= CodedBf16Matrix::kMaxRows;
}

std::string PackedLinear::ImplementationName(int64_t m) const {
  if (m < 1) return "";
  if (UsesCoded(m)) return "coded_bf16";
  const Impl::Args* a;
  if (!impl_->Get(ChunkRows(m), n_, k_, weight_dtype_ == DType::kBF16, has_bias_, &a).ok()) {
    return "";
  }
  return a->prim->impl;
}

OpStatus PackedLinear::GatherRows(const TensorView& out, const TensorView& rows) const {
  if (rows.dtype != DType::kI32 || rows.ndim != 1 || !rows.device.is_cpu() ||
      !rows.is_contiguous()) {
    return OpStatus::Error("PackedLinear::GatherRows: rows: expected i32 [T] on cpu, got " +
                           Shape2(rows));
  }
  const int64_t t = rows.shape[0];
  if (out.dtype != DType::kF32 || out.ndim != 2 || out.shape[0] != t || out.shape[1] != k_ ||
      !out.device.is_cpu() || !out.is_contiguous()) {
    return OpStatus::Error("PackedLinear::GatherRows: out: expected f32 [" + std::to_string(t) +
                           ", " + std::to_string(k_) + "] contiguous on cpu, got " + Shape2(out));
  }
  if (impl_->k_offsets.empty()) {
    return OpStatus::Error(
        "PackedLinear::GatherRows: oneDNN packed the weight in a layout that is "
        "not blocked");
  }
  const dnnl_memory_desc_t& md = impl_->shape->packed.data;
  const int64_t* koff = impl_->k_offsets.data();
  const void* w = impl_->weights.get_data_handle();
  const int32_t* ids = rows.data_as<const int32_t>();
  float* o = out.data_as<float>();
  for (int64_t i = 0; i < t; ++i) {
    float* dst = o + i * k_;
    const int64_t row = ids[i];
    if (row < 0 || row >= n_) {
      std::memset(dst, 0, static_cast<size_t>(k_) * sizeof(float));
      continue;
    }
    const int64_t base = BlockedOffset(md, 0, row) - md.offset0;
    if (weight_dtype_ == DType::kBF16) {
      const uint16_t* src = static_cast<const uint16_t*>(w) + base;
      for (int64_t j = 0; j < k_; ++j) {
        const uint32_t bits = static_cast<uint32_t>(src[koff[j]]) << 16;
        std::memcpy(dst + j, &bits, 4);
      }
    } else {
      const float* src = static_cast<const float*>(w) + base;
      for (int64_t j = 0; j < k_; ++j) dst[j] = src[koff[j]];
    }
  }
  return OpStatus::Ok();
}

OpStatus PackedLinear::Reserve(int64_t max_m) const {
  const bool bf16 = weight_dtype_ == DType::kBF16;
  ThreadScratch& s = Scratch();
  size_t pad = 0;
  for (int64_t m = 1; m <= std::min(max_m, kRowChunk); ++m) {
    const Impl::Args* a;
    if (OpStatus st = impl_->Get(m, n_, k_, bf16, has_bias_, &a); !st.ok()) return st;
    pad = std::max(pad, a->prim->scratch_bytes);
  }
  if (max_m >= kBigChunk) {
    const Impl::Args* a;
    if (OpStatus st = impl_->Get(kBigChunk, n_, k_, bf16, has_bias_, &a); !st.ok()) return st;
    pad = std::max(pad, a->prim->scratch_bytes);
  }
  s.GrowPad(pad);
  // Capacity only: its pages become resident as steps of that many rows fill them (a worker
  // reserves for max_num_batched_tokens, which may be far more than its steps reach).
  if (bf16 && max_m > 0) s.src16.reserve(static_cast<size_t>(max_m * k_));
  return OpStatus::Ok();
}

OpStatus PackedLinear::Forward(const TensorView& out, const TensorView& x) const {
  if (x.dtype != DType::kF32 || x.ndim != 2 || x.shape[1] != k_ || !x.device.is_cpu() ||
      !x.is_contiguous()) {
    return OpStatus::Error("PackedLinear: x: expected f32 [?, " + std::to_string(k_) +
                           "] contiguous on cpu, got " + Shape2(x));
  }
  const int64_t m = x.shape[0];
  if (out.dtype != DType::kF32 || out.ndim != 2 || out.shape[0] != m || out.shape[1] != n_ ||
      !out.device.is_cpu() || !out.is_contiguous()) {
    return OpStatus::Error("PackedLinear: out: expected f32 [" + std::to_string(m) + ", " +
                           std::to_string(n_) + "] contiguous on cpu, got " + Shape2(out));
  }
  if (m == 0) return OpStatus::Ok();
  const bool bf16 = weight_dtype_ == DType::kBF16;
  ThreadScratch& s = Scratch();
  const char* src = static_cast<const char*>(x.data);
  size_t src_row_bytes = static_cast<size_t>(k_) * 4;
  if (bf16) {
    if (s.src16.size() < static_cast<size_t>(m * k_)) s.src16.resize(static_cast<size_t>(m * k_));
    // Large inputs (prefill) on the pool: alone, the calling thread's rounding left the
    // other threads waiting (about 1% of a served prefill's samples each).
    const float* x32 = x.data_as<const float>();
    uint16_t* x16 = s.src16.data();
    const int64_t count = m * k_;
    constexpr int64_t kPart = int64_t{1} << 15;  // elements per part, a multiple of 32
#pragma omp parallel for schedule(static) if (count >= 2 * kPart)
    for (int64_t p = 0; p < count; p += kPart) {
      ToBf16(x32 + p, x16 + p, std::min(kPart, count - p));
    }
    src = reinterpret_cast<const char*>(s.src16.data());
    src_row_bytes = static_cast<size_t>(k_) * 2;
  }
  if (UsesCoded(m)) {
    impl_->coded->Forward(
        s.src16.data(), static_cast<int>(m),
        has_bias_ ? static_cast<const float*>(impl_->bias.get_data_handle()) : nullptr,
        out.data_as<float>());
    return OpStatus::Ok();
  }
  char* dst = static_cast<char*>(out.data);
  const size_t dst_row_bytes = static_cast<size_t>(n_) * 4;
  for (int64_t row = 0; row < m;) {
    const int64_t rows = ChunkRows(m - row);
    const Impl::Args* a;
    if (OpStatus st = impl_->Get(rows, n_, k_, bf16, has_bias_, &a); !st.ok()) return st;
    s.GrowPad(a->prim->scratch_bytes);
    a->src.set_data_handle(const_cast<char*>(src) + row * src_row_bytes);
    a->dst.set_data_handle(dst + row * dst_row_bytes);
    a->pad.set_data_handle(s.pad_data());
    // The C API: an array of arguments (the C++ one builds a map per call).
    dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, a->src.get()},
                               {DNNL_ARG_WEIGHTS, impl_->weights.get()},
                               {DNNL_ARG_DST, a->dst.get()},
                               {DNNL_ARG_SCRATCHPAD, a->pad.get()},
                               {DNNL_ARG_BIAS, impl_->bias.get()}};
    const dnnl_status_t st =
        dnnl_primitive_execute(a->prim->prim.get(), s.stream->get(), has_bias_ ? 5 : 4, args);
    if (st != dnnl_success) {
      return OpStatus::Error("PackedLinear: oneDNN matmul failed with status " +
                             std::to_string(static_cast<int>(st)));
    }
    row += rows;
  }
  return OpStatus::Ok();
}

}  // namespace llm::cpu
