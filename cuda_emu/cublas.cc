// The emulated cuBLAS subset (include/cublas_v2.h): handles, and GEMM as an emulated kernel.
#include <cublas_v2.h>

#include <algorithm>
#include <bit>
#include <cstdint>

#include "kernels/cuda/launch.cuh"

struct cublasContext {
  int device = 0;
  cudaStream_t stream = nullptr;  // the legacy default stream
  cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
  cublasMath_t math_mode = CUBLAS_DEFAULT_MATH;
};

namespace llm::cuda_emu {
namespace {

struct GemmArgs {
  bool a_transposed = false;
  bool b_transposed = false;
  bool tf32 = false;
  int m = 0, n = 0, k = 0;
  float alpha = 1, beta = 0;
  const float* device_alpha = nullptr;  // CUBLAS_POINTER_MODE_DEVICE: read when the kernel runs
  const float* device_beta = nullptr;
  const float* a = nullptr;
  int lda = 0;
  const float* b = nullptr;
  int ldb = 0;
  float* c = nullptr;
  int ldc = 0;
};

// An fp32 value as tensor cores read it in TF32: 10 mantissa bits, round to nearest with ties
// away from zero (cvt.rna.tf32.f32).
float RoundToTf32(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0x7f800000u) == 0x7f800000u) return x;  // inf, NaN
  bits = (bits + 0x1000u) & 0xffffe000u;
  return std::bit_cast<float>(bits);
}

// C[i + j ldc] = alpha sum_l op(A)[i][l] op(B)[l][j] + beta C[i + j ldc]; one thread per element
// of C, threadIdx.x along its rows.
__global__ void GemmKernel(GemmArgs g) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
  if (i >= g.m || j >= g.n) return;
  const float alpha = g.device_alpha != nullptr ? *g.device_alpha : g.alpha;
  const float beta = g.device_beta != nullptr ? *g.device_beta : g.beta;
  float acc = 0;
  for (int64_t l = 0; l < g.k; ++l) {
    float a = g.a_transposed ? g.a[l + i * g.lda] : g.a[i + l * g.lda];
    float b = g.b_transposed ? g.b[j + l * g.ldb] : g.b[l + j * g.ldb];
    if (g.tf32) {
      a = RoundToTf32(a);
      b = RoundToTf32(b);
    }
    acc += a * b;
  }
  float* c = g.c + i + j * g.ldc;
  // beta == 0: C is output only (its old contents, NaN included, are never read).
  *c = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;
}

}  // namespace
}  // namespace llm::cuda_emu

using llm::cuda_emu::GemmArgs;

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return CUBLAS_STATUS_NOT_INITIALIZED;
  *handle = new cublasContext{device};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (stream == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  handle->pointer_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetPointerMode(cublasHandle_t handle, cublasPointerMode_t* mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->pointer_mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->math_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->math_mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType_t a_type, int lda, const void* B,
                            cudaDataType_t b_type, int ldb, const void* beta, void* C,
                            cudaDataType_t c_type, int ldc, cublasComputeType_t compute_type,
                            cublasGemmAlgo_t) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  auto is_op = [](cublasOperation_t op) {
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
  };
  if (!is_op(transa) || !is_op(transb) || m < 0 || n < 0 || k < 0 || alpha == nullptr ||
      beta == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  // Leading dimensions: at least the stored matrix's rows (column-major), and 1.
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  if (lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) || ldc < std::max(1, m)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (a_type != CUDA_R_32F || b_type != CUDA_R_32F || c_type != CUDA_R_32F) {
    return CUBLAS_STATUS_NOT_SUPPORTED;  // the emulation has fp32 GEMMs only
  }
  bool tf32 = false;
  switch (compute_type) {
    case CUBLAS_COMPUTE_32F_PEDANTIC:
      break;
    case CUBLAS_COMPUTE_32F:
      tf32 = handle->math_mode == CUBLAS_TF32_TENSOR_OP_MATH;
      break;
    case CUBLAS_COMPUTE_32F_FAST_TF32:
      tf32 = true;
      break;
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  GemmArgs g;
  g.a_transposed = ta;
  g.b_transposed = tb;
  g.tf32 = tf32;
  g.m = m;
  g.n = n;
  g.k = k;
  if (handle->pointer_mode == CUBLAS_POINTER_MODE_HOST) {
    g.alpha = *static_cast<const float*>(alpha);
    g.beta = *static_cast<const float*>(beta);
  } else {
    g.device_alpha = static_cast<const float*>(alpha);
    g.device_beta = static_cast<const float*>(beta);
  }
  g.a = static_cast<const float*>(A);
  g.lda = lda;
  g.b = static_cast<const float*>(B);
  g.ldb = ldb;
  g.c = static_cast<float*>(C);
  g.ldc = ldc;
  // Rows of C along threadIdx.x: a block spans min(m, 16) rows (a power of two) and the rest of
  // 256 threads along its columns.
  unsigned bx = 1;
  while (bx < 16 && bx < static_cast<unsigned>(m)) bx *= 2;
  const dim3 block(bx, 256 / bx);
  const dim3 grid((m + block.x - 1) / block.x, (n + block.y - 1) / block.y);
  if (grid.y > 65535) return CUBLAS_STATUS_NOT_SUPPORTED;
  cudaGetLastError();  // this call's launch error only
  ::llm::cuda::Launch(llm::cuda_emu::GemmKernel, grid, block, 0, handle->stream, g);
  return cudaGetLastError() == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc) {
  return cublasGemmEx(handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F,
                      ldb, beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported (emulated cuBLAS: fp32 GEMM only)";
  }
  return "unknown status";
}
