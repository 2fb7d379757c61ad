// Emulated CUDA (LLM_CUDA_EMU): the subset of cuBLASLt this project calls, with cuBLASLt's
// names, enum values and semantics (cuda_emu/cublaslt.cc):
//
// - cublasLtCreate / cublasLtDestroy: a handle (the device current at creation).
// - Descriptors: cublasLtMatmulDescCreate(compute type, scale type) with TRANSA, TRANSB (int32_t),
//   EPILOGUE (uint32_t: DEFAULT or BIAS), BIAS_POINTER (const void*) and BIAS_DATA_TYPE (int32_t,
//   -1 = D's type) settable; cublasLtMatrixLayoutCreate(type, rows, cols, ld), column-major;
//   cublasLtMatmulPreferenceCreate with MAX_WORKSPACE_BYTES (uint64_t) and MIN_ALIGNMENT_{A,B,C,D}
//   _BYTES (uint32_t, default 256, as cuBLASLt's). A SetAttribute whose
//   sizeInBytes is not the attribute's size, or an attribute the emulation lacks, is
//   CUBLAS_STATUS_INVALID_VALUE (resp. NOT_SUPPORTED).
// - cublasLtMatmulAlgoGetHeuristic: one algorithm (workspace 0) for a supported problem; it
//   assumes the preference's minimum alignments of A, B, C and D, as a real algorithm may, and
//   cublasLtMatmul with that algorithm and a pointer less aligned is CUBLAS_STATUS_INVALID_VALUE
//   (a null algo assumes nothing).
// - cublasLtMatmul: D = alpha op(A) op(B) + beta C (+ bias[row] with CUBLASLT_EPILOGUE_BIAS),
//   column-major, op N or T, on `stream` as an emulated kernel (ordered and lazy like every
//   kernel; a null algo runs the heuristic's). Type combinations (A = B; C = D; scale f32):
//   f32 -> f32 with CUBLAS_COMPUTE_32F (TF32 inputs never: Lt has no math mode),
//   CUBLAS_COMPUTE_32F_PEDANTIC, or CUBLAS_COMPUTE_32F_FAST_TF32 (inputs rounded to TF32);
//   bf16 -> bf16 or f32 and f16 -> f16 or f32 with CUBLAS_COMPUTE_32F(_PEDANTIC). Products and
//   sums in fp32 (k ascending; the device's order differs: compare with a tolerance), the
//   result rounded to D's type to nearest even. Other combinations: NOT_SUPPORTED. Shapes
//   checked as cuBLASLt does: op(A) m x k, op(B) k x n, C and D m x n, ld >= max(1, rows);
//   otherwise CUBLAS_STATUS_INVALID_VALUE. With beta == 0, C is not read.
//
// Thread-safety: as cuBLASLt: a handle may be shared; descriptors are used by one thread at a
// time.
#ifndef LLM_CUDA_EMU_INCLUDE_CUBLASLT_H_
#define LLM_CUDA_EMU_INCLUDE_CUBLASLT_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <library_types.h>

#include <cstddef>
#include <cstdint>

struct cublasLtContext;
using cublasLtHandle_t = cublasLtContext*;

struct cublasLtMatmulDescOpaque_t;
using cublasLtMatmulDesc_t = cublasLtMatmulDescOpaque_t*;
struct cublasLtMatrixLayoutOpaque_t;
using cublasLtMatrixLayout_t = cublasLtMatrixLayoutOpaque_t*;
struct cublasLtMatmulPreferenceOpaque_t;
using cublasLtMatmulPreference_t = cublasLtMatmulPreferenceOpaque_t*;

struct cublasLtMatmulAlgo_t {
  uint64_t data[8];
};

struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};

enum cublasLtOrder_t { CUBLASLT_ORDER_COL = 0, CUBLASLT_ORDER_ROW = 1 };

enum cublasLtMatrixLayoutAttribute_t {
  CUBLASLT_MATRIX_LAYOUT_TYPE = 0,
  CUBLASLT_MATRIX_LAYOUT_ORDER = 1,
  CUBLASLT_MATRIX_LAYOUT_ROWS = 2,
  CUBLASLT_MATRIX_LAYOUT_COLS = 3,
  CUBLASLT_MATRIX_LAYOUT_LD = 4,
  CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,
};

enum cublasLtMatmulDescAttributes_t {
  CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,
  CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,
  CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,
  CUBLASLT_MATMUL_DESC_TRANSA = 3,
  CUBLASLT_MATMUL_DESC_TRANSB = 4,
  CUBLASLT_MATMUL_DESC_TRANSC = 5,
  CUBLASLT_MATMUL_DESC_FILL_MODE = 6,
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
  CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE = 10,
  CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,
};

enum cublasLtEpilogue_t {
  CUBLASLT_EPILOGUE_DEFAULT = 1,
  CUBLASLT_EPILOGUE_RELU = 2,
  CUBLASLT_EPILOGUE_BIAS = 4,
};

enum cublasLtMatmulPreferenceAttributes_t {
  CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t* light_handle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t light_handle);

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmul_desc,
                                        cublasComputeType_t compute_type,
                                        cudaDataType_t scale_type);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmul_desc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmul_desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size_in_bytes);

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* mat_layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t mat_layout);

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size_in_bytes);

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t light_handle, cublasLtMatmulDesc_t operation_desc,
    cublasLtMatrixLayout_t a_desc, cublasLtMatrixLayout_t b_desc, cublasLtMatrixLayout_t c_desc,
    cublasLtMatrixLayout_t d_desc, cublasLtMatmulPreference_t preference, int requested_algo_count,
    cublasLtMatmulHeuristicResult_t heuristic_results_array[], int* return_algo_count);

cublasStatus_t cublasLtMatmul(cublasLtHandle_t light_handle, cublasLtMatmulDesc_t compute_desc,
                              const void* alpha, const void* A, cublasLtMatrixLayout_t a_desc,
                              const void* B, cublasLtMatrixLayout_t b_desc, const void* beta,
                              const void* C, cublasLtMatrixLayout_t c_desc, void* D,
                              cublasLtMatrixLayout_t d_desc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspace_size_in_bytes, cudaStream_t stream);

#endif  // LLM_CUDA_EMU_INCLUDE_CUBLASLT_H_
