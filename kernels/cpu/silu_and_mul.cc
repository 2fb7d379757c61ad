// The gated MLP activation on the CPU: out[t][i] = silu(x[t][i]) * x[t][I + i].
#include <cmath>

#include "kernels/cpu/cpu_ops.h"

namespace llm::ops::cpu {

OpStatus SiluAndMul(const TensorView& out, const TensorView& x) {
  const int64_t num_tokens = out.shape[0], inter = out.shape[1];
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* gate = x.data_as<const float>() + t * 2 * inter;  // x[t][0:I]
    const float* up = gate + inter;                                // x[t][I:2I]
    float* o = out.data_as<float>() + t * inter;
    for (int64_t i = 0; i < inter; ++i) o[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  }
  return OpStatus::Ok();
}

}  // namespace llm::ops::cpu
