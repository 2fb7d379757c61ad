// A linear layer on CUDA through cuBLASLt: out = x weight^T + bias, weight [N, K] as in HF.
//
// cuBLASLt is column-major. A row-major [R, C] matrix is the column-major [C, R] matrix (its
// transpose) with leading dimension C, so the row-major product
//   out[T][N] = x[T][K] weight[N][K]^T
// is, column-major, out^T [N, T] = weight^T [N, K] . x^T [K, T]: A = the weight buffer as a
// column-major [K, N] matrix (ld K) transposed (TRANSA = T), B = the x buffer as a column-major
// [K, T] matrix (ld K, TRANSB = N), D = the out buffer as a column-major [N, T] matrix (ld N).
// The bias has one entry per row of D (n), which is what CUBLASLT_EPILOGUE_BIAS broadcasts.
//
// Compute: fp32 accumulation always. For f32 inputs CUBLAS_COMPUTE_32F_PEDANTIC: plain
// CUBLAS_COMPUTE_32F may be lowered to TF32 tensor-core math (a 10-bit mantissa per product)
// when NVIDIA_TF32_OVERRIDE or the library decides so; the pedantic type never is. For bf16 /
// f16 inputs CUBLAS_COMPUTE_32F (tensor cores, fp32 accumulation), output rounded to out's
// dtype (or kept f32). Scale type f32; alpha 1, beta 0 (out's NaN poison is never read).
#include <cublasLt.h>

#include "kernels/cuda/cublas_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.cuh"

// Evaluates a cuBLAS(Lt) call; on failure returns OpStatus "op: file:line: expr failed: <status>".
#define LLM_CUBLAS_OP_RETURN_IF_ERROR(op, expr)                                           \
  do {                                                                                    \
    std::string _msg = ::llm::cuda::BlasErrorMessage((expr), #expr, __FILE__, __LINE__);  \
    if (!_msg.empty()) return ::llm::ops::OpStatus::Error(std::string(op) + ": " + _msg); \
  } while (0)

namespace llm::ops::cuda {
namespace {

// out[t][n] = bias[n] (or 0 without one): the K = 0 case, which cuBLASLt does not take. One
// thread block per row.
template <typename T>
__global__ void FillRowsKernel(T* __restrict__ out, const T* __restrict__ bias, int64_t n) {
  T* o = out + static_cast<int64_t>(blockIdx.x) * n;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    o[j] = bias != nullptr ? bias[j] : cuda_internal::FromFloat<T>(0.0f);
  }
}

// The largest power of two (at most 256, cuBLASLt's default assumption) dividing p's address:
// the heuristic must not pick an algorithm that needs more (views may start anywhere in a buffer).
uint32_t Alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && a % alignment != 0) alignment /= 2;
  return alignment;
}

cudaDataType_t CudaType(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// Owns the descriptors of one call.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescs() {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

OpStatus Linear(const OpContext& ctx, const TensorView& out, const TensorView& x,
                const TensorView& weight, const TensorView& bias) {
  constexpr const char* kOp = "Linear";
  if (ctx.blaslt_handle == nullptr) {
    return cuda_internal::Error(kOp,
                                "OpContext.blaslt_handle is null: cuda tensors need a cuBLASLt "
                                "handle (cublasLtCreate)");
  }
  if (OpStatus st = cuda_internal::StartOp(kOp, out.device); !st.ok()) return st;
  // ops.cc has checked that every dimension is below 2^31.
  const int64_t m = x.shape[0], k = x.shape[1], n = weight.shape[0];
  if (m == 0 || n == 0) return OpStatus::Ok();
  const cudaStream_t s = cuda_internal::AsStream(ctx.stream);
  if (k == 0) {
    // An empty sum: out = bias, or 0.
    const int threads = cuda_internal::RowThreads(n > 256 ? 256 : n);
    switch (out.dtype) {
      case DType::kBF16:
        ::llm::cuda::Launch(FillRowsKernel<__nv_bfloat16>, static_cast<unsigned>(m), threads, 0, s,
                            out.data_as<__nv_bfloat16>(), bias.data_as<const __nv_bfloat16>(), n);
        break;
      case DType::kF16:
        ::llm::cuda::Launch(FillRowsKernel<__half>, static_cast<unsigned>(m), threads, 0, s,
                            out.data_as<__half>(), bias.data_as<const __half>(), n);
        break;
      default:
        ::llm::cuda::Launch(FillRowsKernel<float>, static_cast<unsigned>(m), threads, 0, s,
                            out.data_as<float>(), bias.data_as<const float>(), n);
    }
    LLM_CUDA_OP_CHECK_LAUNCH(kOp);
    return OpStatus::Ok();
  }
  cublasLtHandle_t handle = static_cast<cublasLtHandle_t>(ctx.blaslt_handle);
  const cudaDataType_t in_type = CudaType(x.dtype), out_type = CudaType(out.dtype);
  const cublasComputeType_t compute =
      x.dtype == DType::kF32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  LtDescs descs;
  LLM_CUBLAS_OP_RETURN_IF_ERROR(kOp, cublasLtMatmulDescCreate(&descs.op, compute, CUDA_R_32F));
  const int32_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  LLM_CUBLAS_OP_RETURN_IF_ERROR(
      kOp, cublasLtMatmulDescSetAttribute(descs.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                          sizeof(trans_a)));
  LLM_CUBLAS_OP_RETURN_IF_ERROR(
      kOp, cublasLtMatmulDescSetAttribute(descs.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                          sizeof(trans_b)));
  if (bias.present()) {
    const uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const void* bias_ptr = bias.data;
    const int32_t bias_type = out_type;  // bias in out's dtype (cuBLASLt's default: D's type)
    LLM_CUBLAS_OP_RETURN_IF_ERROR(
        kOp, cublasLtMatmulDescSetAttribute(descs.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                            sizeof(epilogue)));
    LLM_CUBLAS_OP_RETURN_IF_ERROR(
        kOp, cublasLtMatmulDescSetAttribute(descs.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr,
                                            sizeof(bias_ptr)));
    LLM_CUBLAS_OP_RETURN_IF_ERROR(
        kOp, cublasLtMatmulDescSetAttribute(descs.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                            &bias_type, sizeof(bias_type)));
  }
  // A: weight as column-major [K, N]; B: x as column-major [K, T]; C = D: out as [N, T].
  LLM_CUBLAS_OP_RETURN_IF_ERROR(kOp, cublasLtMatrixLayoutCreate(&descs.a, in_type, k, n, k));
  LLM_CUBLAS_OP_RETURN_IF_ERROR(kOp, cublasLtMatrixLayoutCreate(&descs.b, in_type, k, m, k));
  LLM_CUBLAS_OP_RETURN_IF_ERROR(kOp, cublasLtMatrixLayoutCreate(&descs.d, out_type, n, m, n));
  LLM_CUBLAS_OP_RETURN_IF_ERROR(kOp, cublasLtMatmulPreferenceCreate(&descs.pref));
  const uint64_t max_workspace = ctx.blas_workspace != nullptr ? ctx.blas_workspace_bytes : 0;
  LLM_CUBLAS_OP_RETURN_IF_ERROR(kOp, cublasLtMatmulPreferenceSetAttribute(
                                         descs.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &max_workspace, sizeof(max_workspace)));
  const uint32_t align_a = Alignment(weight.data), align_b = Alignment(x.data);
  const uint32_t align_d = Alignment(out.data);
  LLM_CUBLAS_OP_RETURN_IF_ERROR(
      kOp, cublasLtMatmulPreferenceSetAttribute(
               descs.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
  LLM_CUBLAS_OP_RETURN_IF_ERROR(
      kOp, cublasLtMatmulPreferenceSetAttribute(
               descs.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
  LLM_CUBLAS_OP_RETURN_IF_ERROR(
      kOp, cublasLtMatmulPreferenceSetAttribute(
               descs.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
  LLM_CUBLAS_OP_RETURN_IF_ERROR(
      kOp, cublasLtMatmulPreferenceSetAttribute(
               descs.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int num_results = 0;
  LLM_CUBLAS_OP_RETURN_IF_ERROR(
      kOp, cublasLtMatmulAlgoGetHeuristic(handle, descs.op, descs.a, descs.b, descs.d, descs.d,
                                          descs.pref, 1, &heuristic, &num_results));
  if (num_results == 0 || heuristic.state != CUBLAS_STATUS_SUCCESS) {
    return cuda_internal::Error(kOp, "cuBLASLt has no algorithm for x " + x.ToString() +
                                         ", weight " + weight.ToString() + ", out " +
                                         out.ToString() + " within " +
                                         std::to_string(max_workspace) + " bytes of workspace");
  }
  const float alpha = 1.0f, beta = 0.0f;
  // out^T[N][T] = weight^T . x^T (+ bias), column-major (see the top of this file).
  LLM_CUBLAS_OP_RETURN_IF_ERROR(
      kOp, cublasLtMatmul(handle, descs.op, &alpha, weight.data, descs.a, x.data, descs.b, &beta,
                          out.data, descs.d, out.data, descs.d, &heuristic.algo,
                          max_workspace > 0 ? ctx.blas_workspace : nullptr, max_workspace, s));
  return OpStatus::Ok();
}

}  // namespace llm::ops::cuda
