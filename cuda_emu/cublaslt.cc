// The emulated cuBLASLt subset (include/cublasLt.h): handles, descriptors, the heuristic, and
// cublasLtMatmul as an emulated kernel on the caller's stream.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/launch.cuh"

struct cublasLtContext {
  int device = 0;
};

struct cublasLtMatmulDescOpaque_t {
  cublasComputeType_t compute_type = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale_type = CUDA_R_32F;
  int32_t transa = CUBLAS_OP_N;
  int32_t transb = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = -1;  // D's type
};

struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType_t type = CUDA_R_32F;
  uint64_t rows = 0;
  uint64_t cols = 0;
  int64_t ld = 0;
};

struct cublasLtMatmulPreferenceOpaque_t {
  uint64_t max_workspace_bytes = 0;
  uint32_t min_alignment[4] = {256, 256, 256, 256};  // A, B, C, D
};

namespace llm::cuda_emu {
namespace {

enum class Elem : uint8_t { kF32, kF16, kBF16 };

bool ToElem(cudaDataType_t t, Elem* e) {
  switch (t) {
    case CUDA_R_32F:
      *e = Elem::kF32;
      return true;
    case CUDA_R_16F:
      *e = Elem::kF16;
      return true;
    case CUDA_R_16BF:
      *e = Elem::kBF16;
      return true;
    default:
      return false;
  }
}

float Load(const void* p, Elem e, int64_t i) {
  switch (e) {
    case Elem::kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case Elem::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

void Store(void* p, Elem e, int64_t i, float v) {
  switch (e) {
    case Elem::kF16:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    case Elem::kBF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
  }
}

// As cublas.cc: cvt.rna.tf32.f32.
float RoundToTf32(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0x7f800000u) == 0x7f800000u) return x;
  bits = (bits + 0x1000u) & 0xffffe000u;
  return std::bit_cast<float>(bits);
}

struct LtArgs {
  bool a_transposed = false, b_transposed = false, tf32 = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1, beta = 0;
  Elem ab = Elem::kF32, cd = Elem::kF32, bias_elem = Elem::kF32;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  const void* c = nullptr;
  int64_t ldc = 0;
  void* d = nullptr;
  int64_t ldd = 0;
  const void* bias = nullptr;  // length m, or null
};

// One thread per element of D, threadIdx.x along its rows.
__global__ void LtMatmulKernel(LtArgs g) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
  if (i >= g.m || j >= g.n) return;
  float acc = 0;
  for (int64_t l = 0; l < g.k; ++l) {
    float a = Load(g.a, g.ab, g.a_transposed ? l + i * g.lda : i + l * g.lda);
    float b = Load(g.b, g.ab, g.b_transposed ? j + l * g.ldb : l + j * g.ldb);
    if (g.tf32) {
      a = RoundToTf32(a);
      b = RoundToTf32(b);
    }
    acc += a * b;
  }
  float v = g.alpha * acc;
  // beta == 0: C is not read (its contents, NaN included, never reach D).
  if (g.beta != 0.0f) v += g.beta * Load(g.c, g.cd, i + j * g.ldc);
  if (g.bias != nullptr) v += Load(g.bias, g.bias_elem, i);
  Store(g.d, g.cd, i + j * g.ldd, v);
}

bool ValidLayout(const cublasLtMatrixLayoutOpaque_t* l) {
  return l != nullptr && l->ld >= std::max<int64_t>(1, static_cast<int64_t>(l->rows));
}

// The checks cublasLtMatmul and the heuristic share; fills `g` but its pointers and scalars.
cublasStatus_t CheckProblem(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                            cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                            cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, LtArgs* g) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (desc == nullptr || !ValidLayout(a) || !ValidLayout(b) || !ValidLayout(c) || !ValidLayout(d)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool ta = desc->transa != CUBLAS_OP_N, tb = desc->transb != CUBLAS_OP_N;
  const uint64_t m = d->rows, n = d->cols;
  const uint64_t k = ta ? a->rows : a->cols;
  if ((ta ? a->cols : a->rows) != m || (tb ? b->cols : b->rows) != k ||
      (tb ? b->rows : b->cols) != n || c->rows != m || c->cols != n) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) return CUBLAS_STATUS_NOT_SUPPORTED;
  Elem ea, eb, ec, ed;
  if (!ToElem(a->type, &ea) || !ToElem(b->type, &eb) || !ToElem(c->type, &ec) ||
      !ToElem(d->type, &ed) || ea != eb || ec != ed || desc->scale_type != CUDA_R_32F) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // f32 in: f32 out only; 16-bit in: the same type or f32 out.
  if (ea == Elem::kF32 ? ed != Elem::kF32 : (ed != Elem::kF32 && ed != ea)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  bool tf32 = false;
  switch (desc->compute_type) {
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
      break;
    case CUBLAS_COMPUTE_32F_FAST_TF32:
      if (ea != Elem::kF32) return CUBLAS_STATUS_NOT_SUPPORTED;
      tf32 = true;
      break;
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  Elem bias_elem = ed;
  if (desc->epilogue == CUBLASLT_EPILOGUE_BIAS) {
    if (desc->bias == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    if (desc->bias_type != -1 &&
        !ToElem(static_cast<cudaDataType_t>(desc->bias_type), &bias_elem)) {
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
  } else if (desc->epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    return CUBLAS_STATUS_NOT_SUPPORTED;  // the emulation has no other epilogue
  }
  g->a_transposed = ta;
  g->b_transposed = tb;
  g->tf32 = tf32;
  g->m = static_cast<int64_t>(m);
  g->n = static_cast<int64_t>(n);
  g->k = static_cast<int64_t>(k);
  g->ab = ea;
  g->cd = ed;
  g->bias_elem = bias_elem;
  g->lda = a->ld;
  g->ldb = b->ld;
  g->ldc = c->ld;
  g->ldd = d->ld;
  g->bias = desc->epilogue == CUBLASLT_EPILOGUE_BIAS ? desc->bias : nullptr;
  return CUBLAS_STATUS_SUCCESS;
}

template <typename T>
cublasStatus_t ReadAttr(const void* buf, size_t size, T* out) {
  if (buf == nullptr || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(out, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

constexpr uint64_t kAlgoMagic = 0x656d752d6c74616cull;  // "emu-ltal"

}  // namespace
}  // namespace llm::cuda_emu

using llm::cuda_emu::LtArgs;
using llm::cuda_emu::ReadAttr;

cublasStatus_t cublasLtCreate(cublasLtHandle_t* light_handle) {
  if (light_handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return CUBLAS_STATUS_NOT_INITIALIZED;
  *light_handle = new cublasLtContext{device};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t light_handle) {
  if (light_handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete light_handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmul_desc,
                                        cublasComputeType_t compute_type,
                                        cudaDataType_t scale_type) {
  if (matmul_desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *matmul_desc = new cublasLtMatmulDescOpaque_t{compute_type, scale_type};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmul_desc) {
  delete matmul_desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmul_desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size_in_bytes) {
  if (matmul_desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
      int32_t op = 0;
      if (cublasStatus_t s = ReadAttr(buf, size_in_bytes, &op); s != CUBLAS_STATUS_SUCCESS) {
        return s;
      }
      if (op != CUBLAS_OP_N && op != CUBLAS_OP_T && op != CUBLAS_OP_C) {
        return CUBLAS_STATUS_INVALID_VALUE;
      }
      (attr == CUBLASLT_MATMUL_DESC_TRANSA ? matmul_desc->transa : matmul_desc->transb) = op;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return ReadAttr(buf, size_in_bytes, &matmul_desc->epilogue);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return ReadAttr(buf, size_in_bytes, &matmul_desc->bias);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      return ReadAttr(buf, size_in_bytes, &matmul_desc->bias_type);
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;  // not emulated
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* mat_layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (mat_layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mat_layout = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t mat_layout) {
  delete mat_layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = new cublasLtMatmulPreferenceOpaque_t{};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size_in_bytes) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return ReadAttr(buf, size_in_bytes, &pref->max_workspace_bytes);
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: {
      uint32_t mode = 0;
      return ReadAttr(buf, size_in_bytes, &mode);
    }
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return ReadAttr(buf, size_in_bytes,
                      &pref->min_alignment[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES]);
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t light_handle, cublasLtMatmulDesc_t operation_desc,
    cublasLtMatrixLayout_t a_desc, cublasLtMatrixLayout_t b_desc, cublasLtMatrixLayout_t c_desc,
    cublasLtMatrixLayout_t d_desc, cublasLtMatmulPreference_t preference, int requested_algo_count,
    cublasLtMatmulHeuristicResult_t heuristic_results_array[], int* return_algo_count) {
  if (requested_algo_count <= 0 || heuristic_results_array == nullptr ||
      return_algo_count == nullptr || preference == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  LtArgs g;
  const cublasStatus_t s =
      llm::cuda_emu::CheckProblem(light_handle, operation_desc, a_desc, b_desc, c_desc, d_desc, &g);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  cublasLtMatmulHeuristicResult_t r{};
  r.algo.data[0] = llm::cuda_emu::kAlgoMagic;
  // The alignments the algorithm assumes (A, B, C, D).
  for (int i = 0; i < 4; ++i) r.algo.data[1 + i] = preference->min_alignment[i];
  r.workspaceSize = 0;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  heuristic_results_array[0] = r;
  *return_algo_count = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t light_handle, cublasLtMatmulDesc_t compute_desc,
                              const void* alpha, const void* A, cublasLtMatrixLayout_t a_desc,
                              const void* B, cublasLtMatrixLayout_t b_desc, const void* beta,
                              const void* C, cublasLtMatrixLayout_t c_desc, void* D,
                              cublasLtMatrixLayout_t d_desc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspace_size_in_bytes,
                              cudaStream_t stream) {
  LtArgs g;
  const cublasStatus_t s =
      llm::cuda_emu::CheckProblem(light_handle, compute_desc, a_desc, b_desc, c_desc, d_desc, &g);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (algo != nullptr && algo->data[0] != llm::cuda_emu::kAlgoMagic) {
    return CUBLAS_STATUS_INVALID_VALUE;  // not one the heuristic returned
  }
  if (workspace == nullptr && workspace_size_in_bytes > 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (algo != nullptr) {
    // A pointer less aligned than the algorithm was chosen for.
    const void* ptrs[4] = {A, B, C, D};
    for (int i = 0; i < 4; ++i) {
      const uint64_t alignment = algo->data[1 + i];
      if (ptrs[i] != nullptr && alignment > 1 &&
          reinterpret_cast<uintptr_t>(ptrs[i]) % alignment != 0) {
        return CUBLAS_STATUS_INVALID_VALUE;
      }
    }
  }
  // C and D may be the same matrix only with the same layout (in place).
  if (C == D && (c_desc->ld != d_desc->ld || c_desc->type != d_desc->type)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  g.alpha = *static_cast<const float*>(alpha);
  g.beta = *static_cast<const float*>(beta);
  if (g.m == 0 || g.n == 0) return CUBLAS_STATUS_SUCCESS;
  if ((g.k > 0 && (A == nullptr || B == nullptr)) || D == nullptr ||
      (g.beta != 0.0f && C == nullptr)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  g.a = A;
  g.b = B;
  g.c = C;
  g.d = D;
  unsigned bx = 1;
  while (bx < 16 && bx < static_cast<unsigned>(g.m)) bx *= 2;
  const dim3 block(bx, 256 / bx);
  const dim3 grid(static_cast<unsigned>((g.m + block.x - 1) / block.x),
                  static_cast<unsigned>((g.n + block.y - 1) / block.y));
  if (grid.y > 65535) return CUBLAS_STATUS_NOT_SUPPORTED;
  cudaGetLastError();  // this call's launch error only
  ::llm::cuda::Launch(llm::cuda_emu::LtMatmulKernel, grid, block, 0, stream, g);
  return cudaGetLastError() == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
