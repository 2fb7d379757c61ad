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
//
// Plans. The descriptors (the matmul descriptor, the three layouts) and the heuristic's
// algorithm depend only on the problem's shape and types, the alignments the heuristic was told
// and the workspace it may use, so they are built once per such key and kept in a process-wide
// cache (PlanCache below): a decode step calls Linear with a handful of shapes per layer, and
// asking the heuristic each time costs host time on every launch. The bias pointer is not part
// of the key (every layer has its own bias): it is set on the cached descriptor per call, which
// is host-side and so also right under CUDA graph capture (cublasLtMatmul reads the descriptor
// when it enqueues).
#include <cublasLt.h>

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

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

// Owns the descriptors of one plan.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtDescs() = default;
  LtDescs(const LtDescs&) = delete;
  LtDescs& operator=(const LtDescs&) = delete;
  ~LtDescs() {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

// What a plan depends on. The bias pointer is per call (see the top of this file).
struct PlanKey {
  const void* handle;
  int64_t m, n, k;
  cudaDataType_t in_type, out_type;
  cublasComputeType_t compute;
  bool has_bias;
  cudaDataType_t bias_type;
  uint32_t align_a, align_b, align_d;  // C = D
  uint64_t workspace_bytes;
  friend bool operator==(const PlanKey&, const PlanKey&) = default;
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& key) const {
    uint64_t h = reinterpret_cast<uintptr_t>(key.handle);
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001b3ull + (h >> 29); };
    for (uint64_t v : {static_cast<uint64_t>(key.m), static_cast<uint64_t>(key.n),
                       static_cast<uint64_t>(key.k), static_cast<uint64_t>(key.in_type),
                       static_cast<uint64_t>(key.out_type), static_cast<uint64_t>(key.compute),
                       static_cast<uint64_t>(key.has_bias), static_cast<uint64_t>(key.bias_type),
                       static_cast<uint64_t>(key.align_a), static_cast<uint64_t>(key.align_b),
                       static_cast<uint64_t>(key.align_d), key.workspace_bytes}) {
      mix(v);
    }
    return static_cast<size_t>(h);
  }
};

// One key's descriptors and algorithm. Immutable once built except for the bias pointer of
// descs.op, which a call sets and uses under `mu` (threads sharing a handle and a shape).
struct LinearPlan {
  LtDescs descs;
  cublasLtMatmulAlgo_t algo{};
  std::mutex mu;
};

// The plans, most recently used first, at most kMaxPlans of them: decode batches give one key
// per batch size m, so the set grows with the sizes served; past the cap the least recently
// used plan is dropped. Thread-safety: every member under mu_ (the worker calls from one thread,
// but tests run emulated ranks as threads); plans are shared_ptrs, so one dropped while another
// thread runs it lives until that call returns. Process lifetime: never destroyed (Cache() leaks
// it), so no descriptor is destroyed during static destruction, after the CUDA runtime may be
// gone; a handle's plans are dropped by ClearLinearPlans(handle), which BlasLtDestroy calls.
class PlanCache {
 public:
  static constexpr size_t kMaxPlans = 1024;

  std::shared_ptr<LinearPlan> Find(const PlanKey& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) {
      misses_.fetch_add(1, std::memory_order_relaxed);
      return nullptr;
    }
    hits_.fetch_add(1, std::memory_order_relaxed);
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
  }

  void Insert(const PlanKey& key, std::shared_ptr<LinearPlan> plan) {
    std::lock_guard<std::mutex> lock(mu_);
    if (index_.count(key) != 0) return;  // another thread built it first
    lru_.emplace_front(key, std::move(plan));
    index_.emplace(key, lru_.begin());
    if (lru_.size() > kMaxPlans) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
    plans_.store(static_cast<int64_t>(lru_.size()), std::memory_order_relaxed);
  }

  void Clear(const void* handle) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = lru_.begin(); it != lru_.end();) {
      if (handle != nullptr && it->first.handle != handle) {
        ++it;
        continue;
      }
      index_.erase(it->first);
      it = lru_.erase(it);
    }
    plans_.store(static_cast<int64_t>(lru_.size()), std::memory_order_relaxed);
  }

  LinearPlanStats Stats() const {
    return {plans_.load(std::memory_order_relaxed), hits_.load(std::memory_order_relaxed),
            misses_.load(std::memory_order_relaxed)};
  }

 private:
  using Entry = std::pair<PlanKey, std::shared_ptr<LinearPlan>>;
  std::mutex mu_;
  std::list<Entry> lru_;
  std::unordered_map<PlanKey, std::list<Entry>::iterator, PlanKeyHash> index_;
  std::atomic<int64_t> plans_{0}, hits_{0}, misses_{0};
};

PlanCache& Cache() {
  static PlanCache* cache = new PlanCache();  // never destroyed: see PlanCache
  return *cache;
}

// Builds the descriptors of `key` and asks the heuristic for its best algorithm, with this
// call's bias pointer set (the heuristic sees the problem as before caching; later calls set
// their own). OK with *out set; OK with *out null when the heuristic has no algorithm; or the
// error of a failed cuBLASLt call.
OpStatus BuildPlan(const PlanKey& key, cublasLtHandle_t handle, const void* bias_ptr,
                   std::shared_ptr<LinearPlan>* out) {
  constexpr const char* kOp = "Linear";
  auto plan = std::make_shared<LinearPlan>();
  LtDescs& descs = plan->descs;
  LLM_CUBLAS_OP_RETURN_IF_ERROR(kOp, cublasLtMatmulDescCreate(&descs.op, key.compute, CUDA_R_32F));
  const int32_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  LLM_CUBLAS_OP_RETURN_IF_ERROR(
      kOp, cublasLtMatmulDescSetAttribute(descs.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                          sizeof(trans_a)));
  LLM_CUBLAS_OP_RETURN_IF_ERROR(
      kOp, cublasLtMatmulDescSetAttribute(descs.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                          sizeof(trans_b)));
  if (key.has_bias) {
    const uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = key.bias_type;  // bias in out's dtype (cuBLASLt's default)
    LLM_CUBLAS_OP_RETURN_IF_ERROR(
        kOp, cublasLtMatmulDescSetAttribute(descs.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                            sizeof(epilogue)));
    LLM_CUBLAS_OP_RETURN_IF_ERROR(
        kOp, cublasLtMatmulDescSetAttribute(descs.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                            &bias_type, sizeof(bias_type)));
    LLM_CUBLAS_OP_RETURN_IF_ERROR(
        kOp, cublasLtMatmulDescSetAttribute(descs.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr,
                                            sizeof(bias_ptr)));
  }
  // A: weight as column-major [K, N]; B: x as column-major [K, T]; C = D: out as [N, T].
  const int64_t m = key.m, n = key.n, k = key.k;
  LLM_CUBLAS_OP_RETURN_IF_ERROR(kOp, cublasLtMatrixLayoutCreate(&descs.a, key.in_type, k, n, k));
  LLM_CUBLAS_OP_RETURN_IF_ERROR(kOp, cublasLtMatrixLayoutCreate(&descs.b, key.in_type, k, m, k));
  LLM_CUBLAS_OP_RETURN_IF_ERROR(kOp, cublasLtMatrixLayoutCreate(&descs.d, key.out_type, n, m, n));
  LLM_CUBLAS_OP_RETURN_IF_ERROR(kOp, cublasLtMatmulPreferenceCreate(&descs.pref));
  const uint64_t max_workspace = key.workspace_bytes;
  LLM_CUBLAS_OP_RETURN_IF_ERROR(kOp, cublasLtMatmulPreferenceSetAttribute(
                                         descs.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &max_workspace, sizeof(max_workspace)));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}};
  for (const auto& [attr, alignment] : alignments) {
    LLM_CUBLAS_OP_RETURN_IF_ERROR(
        kOp, cublasLtMatmulPreferenceSetAttribute(descs.pref, attr, &alignment, sizeof(alignment)));
  }
  cublasLtMatmulHeuristicResult_t heuristic{};
  int num_results = 0;
  LLM_CUBLAS_OP_RETURN_IF_ERROR(
      kOp, cublasLtMatmulAlgoGetHeuristic(handle, descs.op, descs.a, descs.b, descs.d, descs.d,
                                          descs.pref, 1, &heuristic, &num_results));
  if (num_results == 0 || heuristic.state != CUBLAS_STATUS_SUCCESS) return OpStatus::Ok();
  // The preference is only the heuristic's input.
  cublasLtMatmulPreferenceDestroy(descs.pref);
  descs.pref = nullptr;
  plan->algo = heuristic.algo;
  *out = std::move(plan);
  return OpStatus::Ok();
}

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
  const uint64_t max_workspace = ctx.blas_workspace != nullptr ? ctx.blas_workspace_bytes : 0;
  PlanKey key{};
  key.handle = handle;
  key.m = m;
  key.n = n;
  key.k = k;
  key.in_type = CudaType(x.dtype);
  key.out_type = CudaType(out.dtype);
  key.compute = x.dtype == DType::kF32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  key.has_bias = bias.present();
  key.bias_type = bias.present() ? CudaType(bias.dtype) : CUDA_R_32F;
  key.align_a = Alignment(weight.data);
  key.align_b = Alignment(x.data);
  key.align_d = Alignment(out.data);
  key.workspace_bytes = max_workspace;
  std::shared_ptr<LinearPlan> plan = Cache().Find(key);
  if (plan == nullptr) {
    if (OpStatus st = BuildPlan(key, handle, bias.data, &plan); !st.ok()) return st;
    if (plan == nullptr) {
      return cuda_internal::Error(kOp, "cuBLASLt has no algorithm for x " + x.ToString() +
                                           ", weight " + weight.ToString() + ", out " +
                                           out.ToString() + " within " +
                                           std::to_string(max_workspace) + " bytes of workspace");
    }
    Cache().Insert(key, plan);
  }
  const float alpha = 1.0f, beta = 0.0f;
  const LtDescs& descs = plan->descs;
  // The bias pointer is the plan's one mutable part: set and enqueued under its lock (without
  // a bias the descriptors are only read).
  std::unique_lock<std::mutex> lock(plan->mu, std::defer_lock);
  if (bias.present()) {
    lock.lock();
    const void* bias_ptr = bias.data;
    LLM_CUBLAS_OP_RETURN_IF_ERROR(
        kOp, cublasLtMatmulDescSetAttribute(descs.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr,
                                            sizeof(bias_ptr)));
  }
  // out^T[N][T] = weight^T . x^T (+ bias), column-major (see the top of this file).
  LLM_CUBLAS_OP_RETURN_IF_ERROR(
      kOp, cublasLtMatmul(handle, descs.op, &alpha, weight.data, descs.a, x.data, descs.b, &beta,
                          out.data, descs.d, out.data, descs.d, &plan->algo,
                          max_workspace > 0 ? ctx.blas_workspace : nullptr, max_workspace, s));
  return OpStatus::Ok();
}

LinearPlanStats GetLinearPlanStats() { return Cache().Stats(); }

void ClearLinearPlans(void* blaslt_handle) { Cache().Clear(blaslt_handle); }

}  // namespace llm::ops::cuda
