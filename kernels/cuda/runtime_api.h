// The CUDA runtime calls a GPU worker makes outside the ops: memory, streams, copies, the
// cuBLAS handles and CUDA graphs, behind a host-only header (no CUDA headers), so that the
// worker's sources stay plain C++ and build against real CUDA or the emulation alike.
//
// Every function returns an empty string on success, else "<file>:<line>: <call> failed: <error>".
// Streams, handles and graphs are opaque pointers (cudaStream_t, cublasHandle_t,
// cublasLtHandle_t, cudaGraphExec_t). Calls act on the calling thread's current device
// (SetDevice); a worker sets it on every thread that touches the device.
//
// Thread-safety: as the CUDA runtime's (thread-safe; a stream's work is ordered).
#ifndef LLM_KERNELS_CUDA_RUNTIME_API_H_
#define LLM_KERNELS_CUDA_RUNTIME_API_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace llm::cuda {

std::string SetDevice(int ordinal);

// Device memory (cudaMalloc / cudaFree) and page-locked host memory (cudaHostAlloc, portable
// and mapped: device kernels may read it under unified addressing).
std::string Malloc(size_t bytes, void** ptr);
std::string Free(void* ptr);
std::string HostAlloc(size_t bytes, void** ptr);
std::string HostFree(void* ptr);
// Free and total bytes of the current device (cudaMemGetInfo).
std::string MemGetInfo(size_t* free_bytes, size_t* total_bytes);

std::string StreamCreate(void** stream);  // non-blocking with respect to the legacy stream
std::string StreamDestroy(void* stream);
std::string StreamSynchronize(void* stream);
// Empty when the stream is idle; "busy" when work is pending; else the error.
std::string StreamQuery(void* stream);

// cudaMemcpyAsync with cudaMemcpyDefault (the direction from the pointers).
std::string MemcpyAsync(void* dst, const void* src, size_t bytes, void* stream);
std::string MemsetAsync(void* ptr, int value, size_t bytes, void* stream);
// height rows of width bytes from src (rows spitch bytes apart) to dst (dpitch apart), both on
// the device: one kernel (it may be captured into a graph).
std::string Copy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                        size_t height, void* stream);

// A cuBLAS handle on the current device bound to `stream`, and a cuBLASLt handle.
// BlasLtDestroy first drops ops::Linear's cached plans for the handle.
std::string BlasCreate(void* stream, void** handle);
std::string BlasDestroy(void* handle);
std::string BlasLtCreate(void** handle);
std::string BlasLtDestroy(void* handle);

// Stream capture into an instantiated graph (thread-local capture mode), its replay and its
// release.
std::string BeginCapture(void* stream);
std::string EndCapture(void* stream, void** graph_exec);
std::string GraphLaunch(void* graph_exec, void* stream);
std::string GraphExecDestroy(void* graph_exec);

}  // namespace llm::cuda

#endif  // LLM_KERNELS_CUDA_RUNTIME_API_H_
