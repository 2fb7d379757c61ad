// kernels/cuda/runtime_api.h over the CUDA runtime, cuBLAS and cuBLASLt.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cublas_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/runtime_api.h"

namespace llm::cuda {
namespace {

cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

// dst row r = src row r, for `height` rows of `width` bytes; 16-byte words when everything is
// 16-byte aligned, else bytes. One thread per word, rows on blockIdx.y (strided).
template <typename Word>
__global__ void Copy2DKernel(char* dst, size_t dpitch, const char* src, size_t spitch, size_t words,
                             size_t height) {
  for (size_t r = blockIdx.y; r < height; r += gridDim.y) {
    const Word* s = reinterpret_cast<const Word*>(src + r * spitch);
    Word* d = reinterpret_cast<Word*>(dst + r * dpitch);
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < words;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
      d[i] = s[i];
    }
  }
}

using ::llm::ops::cuda_internal::Vec16;

}  // namespace

std::string SetDevice(int ordinal) {
  LLM_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  return {};
}

std::string Malloc(size_t bytes, void** ptr) {
  *ptr = nullptr;
  LLM_CUDA_RETURN_IF_ERROR(cudaMalloc(ptr, bytes > 0 ? bytes : 1));
  return {};
}

std::string Free(void* ptr) {
  if (ptr != nullptr) LLM_CUDA_RETURN_IF_ERROR(cudaFree(ptr));
  return {};
}

std::string HostAlloc(size_t bytes, void** ptr) {
  *ptr = nullptr;
  LLM_CUDA_RETURN_IF_ERROR(
      cudaHostAlloc(ptr, bytes > 0 ? bytes : 1, cudaHostAllocPortable | cudaHostAllocMapped));
  return {};
}

std::string HostFree(void* ptr) {
  if (ptr != nullptr) LLM_CUDA_RETURN_IF_ERROR(cudaFreeHost(ptr));
  return {};
}

std::string MemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  LLM_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(free_bytes, total_bytes));
  return {};
}

std::string StreamCreate(void** stream) {
  cudaStream_t s = nullptr;
  LLM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  *stream = s;
  return {};
}

std::string StreamDestroy(void* stream) {
  if (stream != nullptr) LLM_CUDA_RETURN_IF_ERROR(cudaStreamDestroy(AsStream(stream)));
  return {};
}

std::string StreamSynchronize(void* stream) {
  LLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(AsStream(stream)));
  return {};
}

std::string StreamQuery(void* stream) {
  const cudaError_t e = cudaStreamQuery(AsStream(stream));
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return "busy";
  }
  LLM_CUDA_RETURN_IF_ERROR(e);
  return {};
}

std::string MemcpyAsync(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return {};
  LLM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, AsStream(stream)));
  return {};
}

std::string MemsetAsync(void* ptr, int value, size_t bytes, void* stream) {
  if (bytes == 0) return {};
  LLM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ptr, value, bytes, AsStream(stream)));
  return {};
}

std::string Copy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                        size_t height, void* stream) {
  if (width == 0 || height == 0) return {};
  const bool wide = (reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | dpitch |
                     spitch | width) %
                        16 ==
                    0;
  const size_t words = wide ? width / 16 : width;
  constexpr unsigned kThreads = 256;
  const dim3 grid(static_cast<unsigned>(std::min<size_t>((words + kThreads - 1) / kThreads, 64)),
                  static_cast<unsigned>(std::min<size_t>(height, 65535)));
  cudaGetLastError();
  if (wide) {
    Launch(Copy2DKernel<Vec16>, grid, kThreads, 0, AsStream(stream), static_cast<char*>(dst),
           dpitch, static_cast<const char*>(src), spitch, words, height);
  } else {
    Launch(Copy2DKernel<char>, grid, kThreads, 0, AsStream(stream), static_cast<char*>(dst), dpitch,
           static_cast<const char*>(src), spitch, words, height);
  }
  LLM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return {};
}

std::string BlasCreate(void* stream, void** handle) {
  cublasHandle_t h = nullptr;
  LLM_CUBLAS_RETURN_IF_ERROR(cublasCreate(&h));
  LLM_CUBLAS_RETURN_IF_ERROR(cublasSetStream(h, AsStream(stream)));
  *handle = h;
  return {};
}

std::string BlasDestroy(void* handle) {
  if (handle != nullptr)
    LLM_CUBLAS_RETURN_IF_ERROR(cublasDestroy(static_cast<cublasHandle_t>(handle)));
  return {};
}

std::string BlasLtCreate(void** handle) {
  cublasLtHandle_t h = nullptr;
  LLM_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&h));
  *handle = h;
  return {};
}

std::string BlasLtDestroy(void* handle) {
  if (handle != nullptr) {
    ops::cuda::ClearLinearPlans(handle);  // Linear's plans keyed by this handle
    LLM_CUBLAS_RETURN_IF_ERROR(cublasLtDestroy(static_cast<cublasLtHandle_t>(handle)));
  }
  return {};
}

std::string BeginCapture(void* stream) {
  LLM_CUDA_RETURN_IF_ERROR(
      cudaStreamBeginCapture(AsStream(stream), cudaStreamCaptureModeThreadLocal));
  return {};
}

std::string EndCapture(void* stream, void** graph_exec) {
  *graph_exec = nullptr;
  cudaGraph_t graph = nullptr;
  LLM_CUDA_RETURN_IF_ERROR(cudaStreamEndCapture(AsStream(stream), &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  LLM_CUDA_RETURN_IF_ERROR(e);
  *graph_exec = exec;
  return {};
}

std::string GraphLaunch(void* graph_exec, void* stream) {
  LLM_CUDA_RETURN_IF_ERROR(
      cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph_exec), AsStream(stream)));
  return {};
}

std::string GraphExecDestroy(void* graph_exec) {
  if (graph_exec != nullptr) {
    LLM_CUDA_RETURN_IF_ERROR(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph_exec)));
  }
  return {};
}

}  // namespace llm::cuda
