// Shared by the CUDA op files: error returns that name the op, file and line; index loads of
// i32 / i64 tensors; KV-cache element conversions; warp and block reductions.
#ifndef LLM_KERNELS_CUDA_CUDA_UTIL_CUH_
#define LLM_KERNELS_CUDA_CUDA_UTIL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/ops.h"
#include "kernels/tensor.h"

// Evaluates a CUDA call; on failure returns OpStatus "op: file:line: expr failed: <error>"
// from the enclosing launcher.
#define LLM_CUDA_OP_RETURN_IF_ERROR(op, expr)                                             \
  do {                                                                                    \
    std::string _msg = ::llm::cuda::ErrorMessage((expr), #expr, __FILE__, __LINE__);      \
    if (!_msg.empty()) return ::llm::ops::OpStatus::Error(std::string(op) + ": " + _msg); \
  } while (0)

// After a <<<...>>> launch: the launch's own error (bad configuration, no kernel image for
// this device), with file and line. cudaGetLastError returns the last error of ANY runtime call
// of this thread, so a launcher calls StartOp (below) before its first launch: then each check
// reports the launch it follows (or a sticky error, which fails every call anyway).
#define LLM_CUDA_OP_CHECK_LAUNCH(op) LLM_CUDA_OP_RETURN_IF_ERROR(op, cudaGetLastError())

namespace llm::ops::cuda_internal {

// 16 bytes moved as one load or store (LDG.E.128 / STG.E.128): CUDA's uint4 under nvcc; the
// emulation's headers have no vector types.
#ifdef LLM_CUDA_EMU
struct alignas(16) Vec16 {
  uint32_t x, y, z, w;
};
#else
using Vec16 = uint4;
#endif

inline cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

inline OpStatus Error(const char* op, const std::string& message) {
  return OpStatus::Error(std::string(op) + ": " + message);
}

// Every launcher's first CUDA step, before any launch:
// - clears the thread's last error, left by an earlier call (one that already returned it to
//   its own caller, e.g. a failed cudaMalloc), so that LLM_CUDA_OP_CHECK_LAUNCH reports this
//   op's launches only. A sticky error (a faulted context) cannot be cleared and fails the
//   launch itself.
// - checks that the calling thread's current device is the tensors' (launches and copies go to
//   the current device; a kernel reading another device's memory would fault instead of
//   failing).
inline OpStatus StartOp(const char* op, const TensorDevice& device) {
  cudaGetLastError();
  int current = -1;
  LLM_CUDA_OP_RETURN_IF_ERROR(op, cudaGetDevice(&current));
  if (current == device.ordinal) return OpStatus::Ok();
  return Error(op, "tensors are on cuda:" + std::to_string(device.ordinal) +
                       " but the calling thread's current device is cuda:" +
                       std::to_string(current) + " (cudaSetDevice first)");
}

// An index tensor's data, read as i64 whatever its width.
struct IndexPtr {
  const void* data;
  bool is_i64;
  __device__ __forceinline__ int64_t operator[](int64_t i) const {
    return is_i64 ? static_cast<const int64_t*>(data)[i]
                  : static_cast<int64_t>(static_cast<const int32_t*>(data)[i]);
  }
};

inline IndexPtr AsIndex(const TensorView& t) { return {t.data, t.dtype == DType::kI64}; }

// Bytes per element (tensor.h's DTypeSize lives in llm_kernels, which links this library).
inline size_t ElementSize(DType dtype) {
  switch (dtype) {
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kI64:
      return 8;
    default:
      return 4;
  }
}

// Activation and KV-cache elements: f32, f16 or bf16 in memory, f32 in registers. Stores round
// to nearest even.
__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Calls f(T()) with T the element type of a floating dtype: float (f32), __nv_bfloat16 (bf16) or
// __half (f16), so that a launcher instantiates its kernel once per activation dtype. Returns
// false (f not called) for any other dtype.
template <typename F>
bool DispatchFloat(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      f(float());
      return true;
    case DType::kBF16:
      f(__nv_bfloat16());
      return true;
    case DType::kF16:
      f(__half());
      return true;
    default:
      return false;
  }
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// The sum of `v` over the thread block (blockDim.x a multiple of 32, at most 1024), returned
// to every thread. `scratch`: 32 floats of shared memory, free again when this returns.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int num_warps = blockDim.x / 32;
  v = WarpSum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = lane < num_warps ? scratch[lane] : 0.0f;
  total = WarpSum(total);
  __syncthreads();  // scratch may be reused right after
  return total;
}

__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int num_warps = blockDim.x / 32;
  v = WarpMax(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = lane < num_warps ? scratch[lane] : -INFINITY;
  m = WarpMax(m);
  __syncthreads();
  return m;
}

// Threads per block for a row of n elements: a multiple of 32 in [32, 1024].
inline int RowThreads(int64_t n) {
  int64_t t = (n + 31) / 32 * 32;
  if (t < 32) t = 32;
  if (t > 1024) t = 1024;
  return static_cast<int>(t);
}

// CUDA grids take at most 2^31 - 1 blocks in x and 65535 in y and z.
inline constexpr int64_t kMaxGridX = 2147483647;
inline constexpr int64_t kMaxGridYZ = 65535;

}  // namespace llm::ops::cuda_internal

#endif  // LLM_KERNELS_CUDA_CUDA_UTIL_CUH_
