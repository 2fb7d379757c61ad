// Emulated CUDA (LLM_CUDA_EMU): the subset of cuBLAS this project calls, with cuBLAS's
// semantics (cuda_emu/cublas.cc):
//
// - A handle belongs to the device current at cublasCreate and holds a stream (default: the
//   legacy default stream), a pointer mode and a math mode.
// - cublasGemmEx / cublasSgemm: C = alpha op(A) op(B) + beta C, column-major, op N or T,
//   fp32 matrices only (other types: CUBLAS_STATUS_NOT_SUPPORTED). Arguments are checked as
//   cuBLAS does (m, n, k >= 0; lda >= max(1, rows of A as stored); ldb likewise; ldc >=
//   max(1, m)): CUBLAS_STATUS_INVALID_VALUE. With beta == 0, C is not read. The product runs
//   as an emulated kernel on the handle's stream, so it is ordered and lazy like every kernel.
// - Compute types: CUBLAS_COMPUTE_32F_PEDANTIC is fp32 products with fp32 accumulation;
//   CUBLAS_COMPUTE_32F is the same unless the handle's math mode is CUBLAS_TF32_TENSOR_OP_MATH,
//   when each input is rounded to TF32 (10-bit mantissa, round to nearest, ties away, as
//   cvt.rna.tf32.f32) first, as tensor cores would; CUBLAS_COMPUTE_32F_FAST_TF32 always does.
//   The order of summation is k ascending (the device's differs: compare with a tolerance).
//
// Thread-safety: as cuBLAS: a handle is used by one host thread at a time.
#ifndef LLM_CUDA_EMU_INCLUDE_CUBLAS_V2_H_
#define LLM_CUDA_EMU_INCLUDE_CUBLAS_V2_H_

#include <cuda_runtime.h>
#include <library_types.h>

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};

enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };
enum cublasPointerMode_t { CUBLAS_POINTER_MODE_HOST = 0, CUBLAS_POINTER_MODE_DEVICE = 1 };
enum cublasMath_t {
  CUBLAS_DEFAULT_MATH = 0,
  CUBLAS_TENSOR_OP_MATH = 1,
  CUBLAS_PEDANTIC_MATH = 2,
  CUBLAS_TF32_TENSOR_OP_MATH = 3,
};
enum cublasComputeType_t {
  CUBLAS_COMPUTE_16F = 64,
  CUBLAS_COMPUTE_16F_PEDANTIC = 65,
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_PEDANTIC = 69,
  CUBLAS_COMPUTE_64F = 70,
  CUBLAS_COMPUTE_32F_FAST_16F = 74,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
};
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };

struct cublasContext;
using cublasHandle_t = cublasContext*;

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream);
cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode);
cublasStatus_t cublasGetPointerMode(cublasHandle_t handle, cublasPointerMode_t* mode);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode);

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType_t a_type, int lda, const void* B,
                            cudaDataType_t b_type, int ldb, const void* beta, void* C,
                            cudaDataType_t c_type, int ldc, cublasComputeType_t compute_type,
                            cublasGemmAlgo_t algo);
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc);

const char* cublasGetStatusName(cublasStatus_t status);
const char* cublasGetStatusString(cublasStatus_t status);

#endif  // LLM_CUDA_EMU_INCLUDE_CUBLAS_V2_H_
