// Matrix products on GGUF-quantized weights as they are stored: the blocks of ggml's Q8_0, Q4_0,
// Q4_1, Q5_0 (32 weights a block) and Q4_K, Q5_K, Q6_K (256 weights a super-block), with the
// layouts of ggml-common.h. A weight row of K inputs is K / block_elems consecutive blocks; a
// matrix is N such rows (HF [out, in] layout: blocks run along the input dimension).
//
// The activations are quantized first, as llama.cpp's decode does (its q8_0 / q8_1): every 32
// consecutive values of a row x become a Q8Block, d = max|x| / 127, q = round(x / d) (nearest
// even), with s = d * sum(q) kept for the types whose weights carry an offset (Q4_1's m, the
// K-quants' mins). Every type, the K-quants included, takes these per-32 blocks (llama.cpp's
// q8_K has one scale per 256 values; one per 32 is as cheap here, where the weight scales are
// combined in fp32 per 32 anyway, and follows the activations' range more closely). A weight
// block and an activation block then meet in an integer dot product (unsigned 8-bit weights
// times signed 8-bit activations, summed into 32 bits: AVX2's maddubs + madd), scaled in fp32.
// So the result differs from the dequantized weights times x in fp32 by the activations'
// rounding only: at most d / 2 per value, that is |x_i - d q_i| <= max|x_block| / 254.
//
// Dispatch: AVX2 + FMA + F16C where the CPU has them (checked once at run time), else portable
// loops with the same arithmetic up to the order of the fp32 sums.
//
// Thread-safety: the functions are pure; they run on the calling thread (QuantizedLinear
// spreads the rows of a product over the pool).
#ifndef LLM_KERNELS_CPU_QUANT_GEMV_H_
#define LLM_KERNELS_CPU_QUANT_GEMV_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace llm::cpu {

// The weight formats, with ggml's names. The values are ggml's type ids.
enum class QuantType : int {
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
};

// Whether ggml type id `ggml_type` is one of the above.
bool IsQuantType(int ggml_type);
// "Q4_1", ...
std::string_view QuantTypeName(QuantType type);
// Weights per block: 32, or 256 for the K-quants.
int64_t QuantBlockElems(QuantType type);
// Bytes per block (ggml's sizeof(block_q4_1), ...).
int64_t QuantBlockBytes(QuantType type);
// Bytes of a row of k weights (k a multiple of QuantBlockElems).
inline int64_t QuantRowBytes(QuantType type, int64_t k) {
  return k / QuantBlockElems(type) * QuantBlockBytes(type);
}

// 32 activations quantized to 8 bits: x[i] ~ d * qs[i]; s = d * sum(qs).
struct Q8Block {
  float d;
  float s;
  int8_t qs[32];
};
inline constexpr int64_t kQ8BlockElems = 32;

// Quantizes a row of k values (k a multiple of 32) into k / 32 blocks.
void QuantizeRowQ8(const float* x, int64_t k, Q8Block* out);
// The portable version (the reference the tests quantize with; the AVX2 version gives the same
// blocks).
void QuantizeRowQ8Portable(const float* x, int64_t k, Q8Block* out);

// Dequantizes n_rows rows of k weights (row_bytes apart, from `rows`) into f32, row after row.
// The values are ggml's dequantize_row_* (d * q - m in fp32).
void DequantizeRows(QuantType type, const uint8_t* rows, int64_t row_bytes, int64_t n_rows,
                    int64_t k, float* out);

// The same up to fp32 rounding (w = a q - b in one FMA, Q4_0's and Q5_0's offsets folded into
// b), in AVX2 where the CPU has it: the prefill path's tiles, where the bits do not matter and
// the speed does.
void DequantizeRowsFast(QuantType type, const uint8_t* rows, int64_t row_bytes, int64_t n_rows,
                        int64_t k, float* out);

// The product of n_rows weight rows (from `w`, row_bytes apart, k weights each) with m
// quantized activation rows (x, k / 32 blocks each, x_stride blocks apart):
//   out[i * out_stride + j] = sum_k w[j][k] * x[i][k]   for i < m, j < n_rows.
// Each weight row is read once for every 4 activation rows.
void QuantGemm(QuantType type, const uint8_t* w, int64_t row_bytes, int64_t n_rows, int64_t k,
               const Q8Block* x, int64_t x_stride, int64_t m, float* out, int64_t out_stride);
// The same in portable loops (the reference of the dispatch tests).
void QuantGemmPortable(QuantType type, const uint8_t* w, int64_t row_bytes, int64_t n_rows,
                       int64_t k, const Q8Block* x, int64_t x_stride, int64_t m, float* out,
                       int64_t out_stride);

// Whether QuantGemm / QuantizeRowQ8 run the AVX2 kernels on this CPU.
bool QuantKernelsUseAvx2();

}  // namespace llm::cpu

#endif  // LLM_KERNELS_CPU_QUANT_GEMV_H_
