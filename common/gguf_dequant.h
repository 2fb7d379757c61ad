// Dequantization of GGUF tensor data into fp32: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS, with the block layouts of ggml (ggml-common.h)
// and the arithmetic of its reference dequantize_row_* (ggml-quants.c), which gguf-py's quants.py
// reproduces: the results equal gguf.quants.dequantize bit for bit (this file is compiled without
// floating-point contraction so that `d * q - m` stays two roundings).
#ifndef LLM_COMMON_GGUF_DEQUANT_H_
#define LLM_COMMON_GGUF_DEQUANT_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "common/gguf.h"

namespace llm {

// The types DequantizeToF32 takes, for messages: "F32, F16, BF16, ...".
inline constexpr char kGgmlDequantizableTypes[] =
    "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS";

// Whether DequantizeToF32 takes this type.
bool GgmlTypeCanDequantize(GgmlType type);

// Converts out.size() elements (a multiple of the type's block size) stored as `type` in `src`
// into `out`. INVALID_ARGUMENT when the type is not supported (naming it and the supported
// ones), or the sizes do not match (naming both).
absl::Status DequantizeToF32(GgmlType type, std::span<const std::byte> src, std::span<float> out);

}  // namespace llm

#endif  // LLM_COMMON_GGUF_DEQUANT_H_
