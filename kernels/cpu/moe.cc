// Mixture-of-experts routing and combination on the CPU: the reference loops of kernels/ops.h's
// MoeRoute and MoeCombine. MoeRoute's arithmetic is worker_service/model/moe_routing.cc's (the
// CPU model routes there, on its host buffers; these ops are what the CUDA kernels are checked
// against).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace llm::ops::cpu {

OpStatus MoeRoute(const TensorView& offsets, const TensorView& sorted_tokens,
                  const TensorView& experts, const TensorView& weights, const TensorView& positions,
                  const TensorView& logits, int k, bool normalize) {
  const int64_t t = logits.shape[0], e = logits.shape[1];
  const float* in = logits.data_as<const float>();
  int32_t* off = offsets.data_as<int32_t>();
  float* w = weights.data_as<float>();
  int32_t* pos = positions.data_as<int32_t>();
  int32_t* chosen_all = experts.data_as<int32_t>();
  std::vector<float> p(static_cast<size_t>(e));
  std::fill_n(off, e + 1, 0);
  for (int64_t i = 0; i < t; ++i) {
    const float* row = in + i * e;
    const float max = *std::max_element(row, row + e);
    float sum = 0.0f;
    for (int64_t x = 0; x < e; ++x) sum += p[x] = std::exp(row[x] - max);
    for (int64_t x = 0; x < e; ++x) p[x] /= sum;
    int32_t* ex = chosen_all + i * k;
    float picked = 0.0f;
    for (int j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t x = 0; x < e; ++x) {
        if (std::find(ex, ex + j, x) != ex + j) continue;
        if (best < 0 || p[x] > p[best]) best = x;
      }
      ex[j] = static_cast<int32_t>(best);
      w[i * k + j] = p[best];
      picked += p[best];
      ++off[best + 1];
    }
    if (normalize) {
      for (int j = 0; j < k; ++j) w[i * k + j] /= picked;
    }
  }
  for (int64_t x = 0; x < e; ++x) off[x + 1] += off[x];
  std::vector<int32_t> fill(off, off + e);
  int32_t* tokens = sorted_tokens.data_as<int32_t>();
  for (int64_t i = 0; i < t * k; ++i) {
    const int32_t at = fill[chosen_all[i]]++;
    tokens[at] = static_cast<int32_t>(i / k);
    pos[i] = at;
  }
  return OpStatus::Ok();
}

OpStatus MoeCombine(const TensorView& out, const TensorView& expert_out, const TensorView& weights,
                    const TensorView& positions, const TensorView& shared,
                    const TensorView& shared_gate) {
  const int64_t t = out.shape[0], h = out.shape[1], k = weights.shape[1];
  const float* y = expert_out.data_as<const float>();
  const float* w = weights.data_as<const float>();
  const int32_t* pos = positions.data_as<const int32_t>();
  float* o = out.data_as<float>();
  for (int64_t i = 0; i < t; ++i) {
    float* dst = o + i * h;
    std::fill_n(dst, h, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const float* src = y + static_cast<int64_t>(pos[i * k + j]) * h;
      const float wj = w[i * k + j];
      for (int64_t c = 0; c < h; ++c) dst[c] += wj * src[c];
    }
    if (shared.present()) {
      const float g = 1.0f / (1.0f + std::exp(-shared_gate.data_as<const float>()[i]));
      const float* s = shared.data_as<const float>() + i * h;
      for (int64_t c = 0; c < h; ++c) dst[c] += g * s[c];
    }
  }
  return OpStatus::Ok();
}

}  // namespace llm::ops::cpu
