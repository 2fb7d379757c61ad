// A linear layer on CUDA through cuBLAS: out = x weight^T + bias, weight [N, K] as in HF.
//
// cuBLAS is column-major. A row-major [R, C] matrix is the column-major [C, R] matrix (its
// transpose) with leading dimension C, so the row-major product
//   out[T][N] = x[T][K] weight[N][K]^T
// is, column-major, out^T [N, T] = weight^T [N, K] . x^T [K, T], where weight^T is the
// column-major [K, N] buffer transposed (CUBLAS_OP_T, lda K) and x^T the column-major [K, T]
// buffer as is (CUBLAS_OP_N, ldb K); ldc N.
//
// fp32 in, fp32 out, fp32 accumulation: CUBLAS_COMPUTE_32F_PEDANTIC. Plain CUBLAS_COMPUTE_32F
// is lowered to TF32 tensor-core math (a 10-bit mantissa per product) when the handle's math
// mode is CUBLAS_TF32_TENSOR_OP_MATH (or NVIDIA_TF32_OVERRIDE says so); the pedantic compute
// type ignores the math mode, so the caller's handle cannot change our numerics. The bias is
// broadcast into out first and accumulated with beta = 1.
#include <cublas_v2.h>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.cuh"

// Evaluates a cuBLAS call; on failure returns OpStatus "op: file:line: expr failed: <status>".
#define LLM_CUBLAS_OP_RETURN_IF_ERROR(op, expr)                                              \
  do {                                                                                       \
    const cublasStatus_t _st = (expr);                                                       \
    if (_st != CUBLAS_STATUS_SUCCESS) {                                                      \
      return ::llm::ops::OpStatus::Error(std::string(op) + ": " + __FILE__ + ":" +           \
                                         std::to_string(__LINE__) +                          \
                                         ": " #expr " failed: " + cublasGetStatusName(_st) + \
                                         " (" + cublasGetStatusString(_st) + ")");           \
    }                                                                                        \
  } while (0)

namespace llm::ops::cuda {
namespace {

// out[t][n] = bias[n]. One thread block per row.
__global__ void BroadcastBiasKernel(float* __restrict__ out, const float* __restrict__ bias,
                                    int64_t n) {
  float* o = out + static_cast<int64_t>(blockIdx.x) * n;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) o[j] = bias[j];
}

}  // namespace

OpStatus Linear(void* stream, void* blas_handle, const TensorView& out, const TensorView& x,
                const TensorView& weight, const TensorView& bias) {
  constexpr const char* kOp = "Linear";
  if (blas_handle == nullptr) {
    return cuda_internal::Error(
        kOp, "OpContext.blas_handle is null: cuda tensors need a cuBLAS handle (cublasCreate)");
  }
  if (OpStatus st = cuda_internal::StartOp(kOp, out.device); !st.ok()) return st;
  // ops.cc has checked that every dimension is below 2^31.
  const int64_t m = x.shape[0], k = x.shape[1], n = weight.shape[0];
  if (m == 0 || n == 0) return OpStatus::Ok();
  if (m > cuda_internal::kMaxGridX) {
    return cuda_internal::Error(kOp, "x has " + std::to_string(m) + " rows, above a grid's limit");
  }
  const cudaStream_t s = cuda_internal::AsStream(stream);
  float* o = out.data_as<float>();
  if (bias.present()) {
    const int threads = cuda_internal::RowThreads(n > 256 ? 256 : n);
    ::llm::cuda::Launch(BroadcastBiasKernel, static_cast<unsigned>(m), threads, 0, s, o,
                        bias.data_as<const float>(), n);
    LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  }
  if (k == 0) {
    // An empty sum: out = bias, or 0.
    if (!bias.present()) {
      LLM_CUDA_OP_RETURN_IF_ERROR(
          kOp, cudaMemsetAsync(o, 0, static_cast<size_t>(m * n) * sizeof(float), s));
    }
    return OpStatus::Ok();
  }
  cublasHandle_t handle = static_cast<cublasHandle_t>(blas_handle);
  // The handle runs on the op's stream from here on (the caller owns it and its stream).
  LLM_CUBLAS_OP_RETURN_IF_ERROR(kOp, cublasSetStream(handle, s));
  // alpha and beta are host values, whatever mode an earlier user left the handle in.
  LLM_CUBLAS_OP_RETURN_IF_ERROR(kOp, cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));
  const float alpha = 1.0f;
  const float beta = bias.present() ? 1.0f : 0.0f;  // beta 0: out's NaN poison is never read
  // out^T[N][T] = weight^T . x^T, column-major (see the top of this file).
  LLM_CUBLAS_OP_RETURN_IF_ERROR(
      kOp, cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                        static_cast<int>(k), &alpha, weight.data_as<const float>(), CUDA_R_32F,
                        static_cast<int>(k), x.data_as<const float>(), CUDA_R_32F,
                        static_cast<int>(k), &beta, o, CUDA_R_32F, static_cast<int>(n),
                        CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
  return OpStatus::Ok();
}

}  // namespace llm::ops::cuda
