// Rotary position embedding (NeoX style: rotate halves) on the CPU, in place on q and k, which
// may be token-strided: token t's heads start at data + t * TokenStride.
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/op_check.h"

namespace llm::ops::cpu {
namespace {

// Rotates the first 2 * half dims of each of num_heads heads of one token:
//   x[hd][i], x[hd][i + half] <- x[i] cos - x[i + half] sin, x[i + half] cos + x[i] sin
void RotateHeads(float* x, int64_t num_heads, int64_t head_size, int64_t half, const float* cos,
                 const float* sin) {
  for (int64_t hd = 0; hd < num_heads; ++hd) {
    float* v = x + hd * head_size;
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = v[i], x2 = v[i + half];
      v[i] = x1 * cos[i] - x2 * sin[i];
      v[i + half] = x2 * cos[i] + x1 * sin[i];
    }
  }
}

}  // namespace

OpStatus RotaryEmbedding(const TensorView& positions, const TensorView& query,
                         const TensorView& key, std::span<const double> inv_freq, int rotary_dim) {
  const int64_t num_tokens = positions.shape[0];
  const int64_t num_heads = query.shape[1], num_kv_heads = key.shape[1];
  const int64_t head_size = query.shape[2];
  const int64_t q_stride = internal::TokenStride(query), k_stride = internal::TokenStride(key);
  const int64_t half = rotary_dim / 2;
  std::vector<float> cos(half), sin(half);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const double pos = static_cast<double>(internal::IndexAt(positions, t));
    for (int64_t i = 0; i < half; ++i) {
      const double angle = pos * inv_freq[i];  // in double: positions reach 10^5 and more
      cos[i] = static_cast<float>(std::cos(angle));
      sin[i] = static_cast<float>(std::sin(angle));
    }
    // q[t][h][d], k[t][h][d]
    RotateHeads(query.data_as<float>() + t * q_stride, num_heads, head_size, half, cos.data(),
                sin.data());
    RotateHeads(key.data_as<float>() + t * k_stride, num_kv_heads, head_size, half, cos.data(),
                sin.data());
  }
  return OpStatus::Ok();
}

OpStatus RotaryEmbeddingCached(const TensorView& positions, const TensorView& query,
                               const TensorView& key, const TensorView& cos_sin_cache) {
  const int64_t num_tokens = positions.shape[0];
  const int64_t num_heads = query.shape[1], num_kv_heads = key.shape[1];
  const int64_t head_size = query.shape[2];
  const int64_t q_stride = internal::TokenStride(query), k_stride = internal::TokenStride(key);
  const int64_t max_position = cos_sin_cache.shape[0], rotary_dim = cos_sin_cache.shape[1];
  const int64_t half = rotary_dim / 2;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t pos = internal::IndexAt(positions, t);
    if (pos < 0 || pos >= max_position) {
      return internal::Error("RotaryEmbeddingCached", "positions[" + std::to_string(t) +
                                                          "] = " + std::to_string(pos) +
                                                          " is outside the cos_sin_cache's [0, " +
                                                          std::to_string(max_position) + ")");
    }
  }
  for (int64_t t = 0; t < num_tokens; ++t) {
    // cache[pos][0 .. half-1] = cos, cache[pos][half .. rotary_dim-1] = sin
    const float* row =
        cos_sin_cache.data_as<const float>() + internal::IndexAt(positions, t) * rotary_dim;
    RotateHeads(query.data_as<float>() + t * q_stride, num_heads, head_size, half, row, row + half);
    RotateHeads(key.data_as<float>() + t * k_stride, num_kv_heads, head_size, half, row,
                row + half);
  }
  return OpStatus::Ok();
}

}  // namespace llm::ops::cpu
