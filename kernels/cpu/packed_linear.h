// Linear layers on the CPU through oneDNN matmul on weights packed once, at load.
//
// A PackedLinear holds one weight [N, K] (HF layout; out = x weight^T + bias) reordered into
// the blocked layout oneDNN's matmul prefers for this CPU (the primitive descriptor is created
// with format_tag::any for the weights, then the weight is reordered into what it picked), in
// f32 or bf16. Forward() never packs a weight: it runs a cached matmul primitive on the packed
// weight with the bias fused (no separate pass). Primitives are created per shape class and
// shared by every PackedLinear of the same (N, K, weight dtype, bias or not): one per row count
// M < kRowChunk, one for kRowChunk rows and one for kBigChunk rows; a step with M >= kBigChunk
// (a prefill) first runs M / kBigChunk chunks of kBigChunk rows, then the rest in chunks of
// kRowChunk rows (the rows of x and out are contiguous) and one remainder. Larger chunks mean
// fewer passes over the weight and fewer parallel regions per prefill, up to the size that most
// prefill steps still fill (docs/performance/results.md, "GEMMs"). Reserve(M) creates the
// primitives for every M up to it and grows the calling thread's scratch, so that a step
// allocates nothing (another thread grows its own scratch at its first step); without it the
// primitives are created at first use.
//
// Dtypes: x and out are f32. With bf16 weights (CPUs with native bf16 dot products: AVX512_BF16
// or AMX, see CpuHasNativeBf16), x is rounded to bf16 (nearest even) into a per-thread scratch
// before the matmul, products are summed in fp32, the f32 bias is added in fp32 and out is f32.
// With f32 weights everything is fp32 (oneDNN's default strict fp32 math: no implicit bf16 or
// tf32).
//
// Small M (decode): with bf16 weights whose K is a multiple of 64, on CPUs with AVX512_VBMI,
// Create also keeps the weight coded in 12 bits per weight, losslessly (kernels/cpu/coded_gemv.h),
// and Forward runs steps of 1 to CodedBf16Matrix::kMaxRows rows on it instead of oneDNN: such a
// step reads each weight once and is bound by memory bandwidth, so reading 3/4 of the bytes
// makes it faster than oneDNN on the packed weight (bench_cpu_gemv; docs/performance/results.md,
// "Decode GEMMs on 12-bit weights"). The result is the same bf16 matmul (same weights, same x
// rounding, vdpbf16ps), up to the order of the fp32 sums. The cost is memory: the coded copy is
// 3/4 of the bf16 weight's bytes on top of it. SetCodedWeights(false) (llm-worker
// --coded-weights=false) turns it off for the PackedLinears created after.
//
// Threads: oneDNN runs on the OpenMP pool (Debian's oneDNN is built with OpenMP), sized and
// pinned by kernels/cpu/thread_pool.h.
//
// Thread-safety: one thread at a time per PackedLinear (it keeps oneDNN memory objects whose
// data handles each call sets); different PackedLinears, even of one shape class, may run on
// different threads at once (the shared primitives are created under a lock; scratch and the
// oneDNN stream are per thread).
#ifndef LLM_KERNELS_CPU_PACKED_LINEAR_H_
#define LLM_KERNELS_CPU_PACKED_LINEAR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace llm::cpu {

// True when this CPU has native bf16 dot products (AVX512_BF16, or AMX-BF16), checked once with
// cpuid at run time. bf16 weights are refused without them (emulated bf16 is slower than fp32).
bool CpuHasNativeBf16();

// Whether PackedLinears created from now on keep the coded copy for small steps where they can
// (see above; default true). Process-wide, like the thread pool's size.
void SetCodedWeights(bool on);

class PackedLinear {
 public:
  // Rows per chunk of a large step (see above).
  static constexpr int64_t kRowChunk = 64;
  // Rows per chunk of a prefill-sized step, before the kRowChunk ones.
  static constexpr int64_t kBigChunk = 128;

  // Packs `weight` (f32 [N, K], contiguous, on cpu) and copies `bias` (f32 [N] or absent: data
  // == nullptr) as `weight_dtype` (kF32 or kBF16; kBF16 rounds each weight to nearest even).
  // The weight's memory can be freed afterwards. Errors (in *out's stead) name the argument:
  // a wrong shape or dtype, bf16 on a CPU without native bf16, or oneDNN's failure.
  static ops::OpStatus Create(const TensorView& weight, const TensorView& bias, DType weight_dtype,
                              std::unique_ptr<PackedLinear>* out);

  ~PackedLinear();
  PackedLinear(const PackedLinear&) = delete;
  PackedLinear& operator=(const PackedLinear&) = delete;

  // out[m][n] = sum_k x[m][k] * weight[n][k] + bias[n]. x f32 [M, K], out f32 [M, N], both
  // contiguous on cpu, not overlapping. M = 0 is a no-op.
  ops::OpStatus Forward(const TensorView& out, const TensorView& x) const;

  // out[t][k] = weight[rows[t]][k] as f32 (bf16 weights widened, exactly), read from the packed
  // layout; a row outside [0, N) gives zeros. The embedding lookup of a tied LM head, so that the
  // table is held once (vocab-parallel ranks map other ranks' tokens outside their rows). rows
  // i32 [T], out f32 [T, K] contiguous on cpu.
  ops::OpStatus GatherRows(const TensorView& out, const TensorView& rows) const;

  // Creates the primitives for every row count up to max_m and grows the calling thread's
  // scratch for them, so that Forward on this thread allocates nothing for such steps.
  ops::OpStatus Reserve(int64_t max_m) const;

  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  DType weight_dtype() const { return weight_dtype_; }
  bool has_bias() const { return has_bias_; }
  // Bytes of the packed weight and bias, and of the coded copy if any.
  size_t packed_bytes() const;
  // Whether steps of 1 to CodedBf16Matrix::kMaxRows rows run on the coded copy.
  bool has_coded() const;
  // Bytes of the coded copy (0 without one); part of packed_bytes().
  size_t coded_bytes() const;
  // The implementation for `m` rows: oneDNN's (e.g. "brg:avx512_core_bf16") or "coded_bf16",
  // for tests and benches.
  std::string ImplementationName(int64_t m) const;

  struct Impl;

 private:
  PackedLinear() = default;
  // Whether a step of m rows runs on the coded copy.
  bool UsesCoded(int64_t m) const;
  int64_t n_ = 0, k_ = 0;
  DType weight_dtype_ = DType::kF32;
  bool has_bias_ = false;
  std::unique_ptr<Impl> impl_;
};

}  // namespace llm::cpu

#endif  // LLM_KERNELS_CPU_PACKED_LINEAR_H_
