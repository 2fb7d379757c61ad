// A linear layer on the CPU through OpenBLAS: out = x weight^T + bias, weight [N, K] as in HF.
#include <cblas.h>

#include "kernels/cpu/cpu_ops.h"

namespace llm::ops::cpu {

OpStatus Linear(const TensorView& out, const TensorView& x, const TensorView& weight,
                const TensorView& bias) {
  const int64_t m = x.shape[0], k = x.shape[1], n = weight.shape[0];
  float* o = out.data_as<float>();
  if (m == 0 || n == 0) return OpStatus::Ok();
  float beta = 0.0f;
  if (bias.present()) {
    // out[t][:] = bias[:], then accumulate the product into it.
    const float* b = bias.data_as<const float>();
    for (int64_t t = 0; t < m; ++t) {
      for (int64_t j = 0; j < n; ++j) o[t * n + j] = b[j];
    }
    beta = 1.0f;
  }
  if (k == 0) {
    if (!bias.present()) {
      for (int64_t i = 0; i < m * n; ++i) o[i] = 0.0f;
    }
    return OpStatus::Ok();
  }
  // One row (a decode step at batch 1) is a matrix-vector product: sgemv streams the weight
  // once, where sgemm's packing for m = 1 reaches a fraction of the memory bandwidth.
  if (m == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<blasint>(n), static_cast<blasint>(k), 1.0f,
                weight.data_as<const float>(), static_cast<blasint>(k), x.data_as<const float>(), 1,
                beta, o, 1);
    return OpStatus::Ok();
  }
  // out[m][n] = sum_k x[m][k] * weight[n][k] (+ out)
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, x.data_as<const float>(),
              static_cast<blasint>(k), weight.data_as<const float>(), static_cast<blasint>(k), beta,
              o, static_cast<blasint>(n));
  return OpStatus::Ok();
}

}  // namespace llm::ops::cpu
