// A Linear layer on the CPU whose weight stays in GGUF's quantized blocks
// (kernels/cpu/quant_gemv.h): out = x weight^T + bias, the weight [N, K] held as N rows of K /
// block_elems blocks, as the file stores them.
//
// A weight is one or more parts stacked along N, each of its own type: the model's fused q/k/v
// and gate/up weights are the rows of two or three GGUF tensors, and a Q4_K_M file mixes Q4_K and
// Q6_K among them (part p covers output columns [n_p, n_p + rows_p)).
//
// Forward(out, x), x f32 [M, K]:
//   M < kDequantMinRows   x is quantized per 32 values to 8 bits (Q8Block) and every tile of
//                         weight rows is multiplied by it with integer dot products, read once
//                         for every 4 rows of x (QuantGemm).
//   M >= kDequantMinRows  each tile of weight rows is dequantized to f32 into per-thread scratch
//                         and multiplied by x in fp32 (OpenBLAS sgemm, one thread per tile): at
//                         prefill sizes the fp32 GEMM's arithmetic beats the integer path's
//                         per-row overhead (the crossover is measured by bench_cpu_quant_gemv;
//                         docs/performance/results.md, "GEMMs on GGUF blocks").
// Tiles of weight rows are spread over the OpenMP pool (kernels/cpu/thread_pool.h).
//
// Thread-safety: Forward and GatherRows may run on several threads at once (the scratch is per
// thread, kept for the thread's life and shared by all instances); the weight is immutable after
// Create.
#ifndef LLM_KERNELS_CPU_QUANTIZED_LINEAR_H_
#define LLM_KERNELS_CPU_QUANTIZED_LINEAR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/quant_gemv.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace llm::cpu {

class QuantizedLinear {
 public:
  // Steps of this many rows or more run on dequantized tiles (see above).
  static constexpr int64_t kDequantMinRows = 64;

  // Rows of one type, row after row: rows * QuantRowBytes(type, k) bytes.
  struct Part {
    QuantType type = QuantType::kQ8_0;
    int64_t rows = 0;
    std::vector<uint8_t> blocks;
  };

  // Takes the parts (their rows stacked make N) and copies `bias` (f32 [N], or absent: data ==
  // nullptr). Errors name the argument: K not a multiple of a part's block, a part whose bytes
  // do not match its rows, no rows, a bias of the wrong shape.
  static ops::OpStatus Create(int64_t k, std::vector<Part> parts, const TensorView& bias,
                              std::unique_ptr<QuantizedLinear>* out);

  QuantizedLinear(const QuantizedLinear&) = delete;
  QuantizedLinear& operator=(const QuantizedLinear&) = delete;

  // out[m][n] = sum_k x[m][k] * weight[n][k] + bias[n]. x f32 [M, K], out f32 [M, N], both
  // contiguous on cpu, not overlapping. M = 0 is a no-op.
  ops::OpStatus Forward(const TensorView& out, const TensorView& x) const;

  // out[t][k] = weight[rows[t]][k] dequantized to f32; a row outside [0, N) gives zeros (the
  // embedding lookup of a tied head on a quantized table). rows i32 [T], out f32 [T, K].
  ops::OpStatus GatherRows(const TensorView& out, const TensorView& rows) const;

  // Sets the row count from which Forward dequantizes tiles (default kDequantMinRows), for the
  // benchmark that measures the crossover and for tests of both paths.
  void set_dequant_min_rows(int64_t m) { dequant_min_rows_ = m; }

  // Grows the scratch of Forward for steps of up to max_m rows: the calling thread's quantized
  // activations and, when max_m reaches the dequantized path, the tile of every thread in the
  // calling thread's OpenMP team. Call it on the thread that runs the steps, before serving:
  // a Forward within the reserved size allocates nothing.
  void Reserve(int64_t max_m) const;

  // Bytes of the scratch that every thread of the process holds for Forward (all instances).
  static size_t ScratchBytes();

  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  bool has_bias() const { return !bias_.empty(); }
  const std::vector<Part>& parts() const { return parts_; }
  // Bytes of the blocks and the bias.
  size_t bytes() const;
  // "quant:Q4_1" (or "quant:Q4_K+Q6_K"), with ":dequant" for steps of m rows that dequantize.
  std::string ImplementationName(int64_t m) const;

 private:
  QuantizedLinear() = default;
  struct Tile {
    int part;
    int64_t row0, rows;  // rows of the part
    int64_t col0;        // its first output column
  };
  int64_t n_ = 0, k_ = 0;
  int64_t dequant_min_rows_ = kDequantMinRows;
  std::vector<Part> parts_;
  std::vector<Tile> tiles_;
  std::vector<float> bias_;
};

}  // namespace llm::cpu

#endif  // LLM_KERNELS_CPU_QUANTIZED_LINEAR_H_
