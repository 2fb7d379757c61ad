// cuBLAS and cuBLASLt, loaded when first called instead of when the process starts.
//
// Linked directly, libcublasLt is loaded and initialized before main in every process that links
// it, and its static initializers write much of its large zero-initialized data: every worker paid
// for it in resident memory, the cpu ones too, whose steps never call cuBLAS
// (docs/performance/results.md, "Worker memory", has the figures). This file defines
// the cuBLAS and cuBLASLt functions the project calls, each forwarding to the real one in
// libcublas.so.<major> / libcublasLt.so.<major>, which are dlopen'ed at the first call of any of
// them (found as the dynamic loader finds libraries: LD_LIBRARY_PATH, the runpath, ld.so.cache).
// The prototypes come from the toolkit's headers, so a signature that drifts does not compile.
// When the libraries cannot be loaded every call answers CUBLAS_STATUS_NOT_INITIALIZED and
// cublasGetStatusString says why (dlerror). A function the project starts calling must be added
// here (the link fails until it is).
//
// Not in the CUDA emulation's builds (cuda_emu has its own cuBLAS and cuBLASLt).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>

#include <string>

namespace {

struct Libraries {
  void* blas = nullptr;
  void* lt = nullptr;
  std::string error;  // empty when both loaded
};

const Libraries& Load() {
  static const Libraries* libs = [] {
    auto* l = new Libraries;
    const std::string major = std::to_string(CUBLAS_VER_MAJOR);
    const std::string lt = "libcublasLt.so." + major, blas = "libcublas.so." + major;
    l->lt = dlopen(lt.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (l->lt == nullptr) {
      l->error = "cannot load " + lt + ": " + dlerror();
      return l;
    }
    l->blas = dlopen(blas.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (l->blas == nullptr) l->error = "cannot load " + blas + ": " + dlerror();
    return l;
  }();
  return *libs;
}

// The address of `name` in the library (null when it is not loaded or lacks the symbol).
void* Symbol(bool lt, const char* name) {
  const Libraries& l = Load();
  void* lib = lt ? l.lt : l.blas;
  return lib != nullptr ? dlsym(lib, name) : nullptr;
}

}  // namespace

// Defines NAME(PARAMS) forwarding ARGS to the library's NAME, resolved once.
#define LLM_CUBLAS_FORWARD(LT, NAME, PARAMS, ARGS)                  \
  cublasStatus_t NAME PARAMS {                                      \
    using Fn = cublasStatus_t PARAMS;                               \
    static Fn* const fn = reinterpret_cast<Fn*>(Symbol(LT, #NAME)); \
    return fn != nullptr ? fn ARGS : CUBLAS_STATUS_NOT_INITIALIZED; \
  }

extern "C" {

// cuBLAS (cublas_v2.h names several of these as macros for their _v2 symbols).
LLM_CUBLAS_FORWARD(false, cublasCreate_v2, (cublasHandle_t * handle), (handle))
LLM_CUBLAS_FORWARD(false, cublasDestroy_v2, (cublasHandle_t handle), (handle))
LLM_CUBLAS_FORWARD(false, cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t stream),
                   (handle, stream))
LLM_CUBLAS_FORWARD(false, cublasGetStream_v2, (cublasHandle_t handle, cudaStream_t* stream),
                   (handle, stream))
LLM_CUBLAS_FORWARD(false, cublasSetPointerMode_v2,
                   (cublasHandle_t handle, cublasPointerMode_t mode), (handle, mode))
LLM_CUBLAS_FORWARD(false, cublasGetPointerMode_v2,
                   (cublasHandle_t handle, cublasPointerMode_t* mode), (handle, mode))
LLM_CUBLAS_FORWARD(false, cublasSetMathMode, (cublasHandle_t handle, cublasMath_t mode),
                   (handle, mode))
LLM_CUBLAS_FORWARD(false, cublasGetMathMode, (cublasHandle_t handle, cublasMath_t* mode),
                   (handle, mode))
LLM_CUBLAS_FORWARD(false, cublasSgemm_v2,
                   (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                    int m, int n, int k, const float* alpha, const float* A, int lda,
                    const float* B, int ldb, const float* beta, float* C, int ldc),
                   (handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc))
LLM_CUBLAS_FORWARD(false, cublasGemmEx,
                   (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                    int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                    int lda, const void* B, cudaDataType Btype, int ldb, const void* beta, void* C,
                    cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                    cublasGemmAlgo_t algo),
                   (handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C,
                    Ctype, ldc, computeType, algo))

const char* cublasGetStatusName(cublasStatus_t status) {
  using Fn = const char*(cublasStatus_t);
  static Fn* const fn = reinterpret_cast<Fn*>(Symbol(false, "cublasGetStatusName"));
  return fn != nullptr ? fn(status) : "CUBLAS_STATUS_NOT_INITIALIZED";
}

const char* cublasGetStatusString(cublasStatus_t status) {
  using Fn = const char*(cublasStatus_t);
  static Fn* const fn = reinterpret_cast<Fn*>(Symbol(false, "cublasGetStatusString"));
  return fn != nullptr ? fn(status) : Load().error.c_str();
}

// cuBLASLt.
LLM_CUBLAS_FORWARD(true, cublasLtCreate, (cublasLtHandle_t * handle), (handle))
LLM_CUBLAS_FORWARD(true, cublasLtDestroy, (cublasLtHandle_t handle), (handle))
LLM_CUBLAS_FORWARD(true, cublasLtMatmulDescCreate,
                   (cublasLtMatmulDesc_t * desc, cublasComputeType_t computeType,
                    cudaDataType_t scaleType),
                   (desc, computeType, scaleType))
LLM_CUBLAS_FORWARD(true, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
LLM_CUBLAS_FORWARD(true, cublasLtMatmulDescSetAttribute,
                   (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf,
                    size_t size),
                   (desc, attr, buf, size))
LLM_CUBLAS_FORWARD(true, cublasLtMatrixLayoutCreate,
                   (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows,
                    uint64_t cols, int64_t ld),
                   (layout, type, rows, cols, ld))
LLM_CUBLAS_FORWARD(true, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))
LLM_CUBLAS_FORWARD(true, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref),
                   (pref))
LLM_CUBLAS_FORWARD(true, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref))
LLM_CUBLAS_FORWARD(true, cublasLtMatmulPreferenceSetAttribute,
                   (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                    const void* buf, size_t size),
                   (pref, attr, buf, size))
LLM_CUBLAS_FORWARD(true, cublasLtMatmulAlgoGetHeuristic,
                   (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                    cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                    cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                    cublasLtMatmulPreference_t pref, int requestedAlgoCount,
                    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount),
                   (handle, desc, Adesc, Bdesc, Cdesc, Ddesc, pref, requestedAlgoCount,
                    heuristicResultsArray, returnAlgoCount))
LLM_CUBLAS_FORWARD(true, cublasLtMatmul,
                   (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                    const void* A, cublasLtMatrixLayout_t Adesc, const void* B,
                    cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
                    cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                    const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspaceSize,
                    cudaStream_t stream),
                   (handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo,
                    workspace, workspaceSize, stream))

}  // extern "C"
