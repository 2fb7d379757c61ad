// DeviceContext: where one worker rank computes, and the handles every op of its step uses:
// for cuda:N one non-blocking stream, one cuBLAS handle bound to it, one cuBLASLt handle and
// its workspace, all created once (Create) and destroyed with the context; for cpu nothing
// (ops run on the calling thread).
//
// Every kernel, copy and collective of a rank's step is enqueued on stream(), in order, and the
// host waits once per step (Synchronize, or the communicator's WaitForCollectives). The CUDA
// runtime's current device is per thread: a worker calls MakeCurrent() on every thread (gRPC
// handlers) before touching the device.
//
// Thread-safety: the handles are used by one thread at a time (the worker's step).
#ifndef LLM_WORKER_SERVICE_MODEL_DEVICE_CONTEXT_H_
#define LLM_WORKER_SERVICE_MODEL_DEVICE_CONTEXT_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device_tensor.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace llm {

class DeviceContext {
 public:
  // Bytes of cuBLASLt workspace (what vLLM and PyTorch give Hopper: 32 MiB; a device with less
  // than 4 GiB gets 1/128 of its memory).
  static constexpr size_t kBlasWorkspaceBytes = 32u << 20;

  // cpu, or cuda:N: then UNAVAILABLE when the build has no CUDA backend, there is no such
  // device, or its handles cannot be created (with CUDA's reason).
  static absl::StatusOr<std::unique_ptr<DeviceContext>> Create(TensorDevice device);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  const TensorDevice& device() const { return device_; }
  bool is_cuda() const { return device_.is_cuda(); }
  void* stream() const { return stream_; }
  // stream, cuBLAS and cuBLASLt handles and the Lt workspace (ops' OpContext); the caller adds
  // an op's own workspace.
  ops::OpContext op_context() const;

  // Makes the device current on the calling thread (cpu: nothing).
  absl::Status MakeCurrent() const;
  // Waits for everything enqueued on the stream (cpu: nothing).
  absl::Status Synchronize() const;
  // Bytes free and in total on the device (cudaMemGetInfo); cpu: UNIMPLEMENTED.
  absl::Status MemoryInfo(size_t* free_bytes, size_t* total_bytes) const;

 private:
  explicit DeviceContext(TensorDevice device) : device_(device) {}

  TensorDevice device_;
  void* stream_ = nullptr;
  void* blas_ = nullptr;
  void* blas_lt_ = nullptr;
  Tensor blas_workspace_;
};

// INTERNAL naming what failed, from a CUDA helper's error string; OK when it is empty.
absl::Status CudaStatus(const std::string& error);

}  // namespace llm

#endif  // LLM_WORKER_SERVICE_MODEL_DEVICE_CONTEXT_H_
