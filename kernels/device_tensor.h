// Tensor: an owning, contiguous buffer on one device (host memory, page-locked host memory, or
// a CUDA device) with a TensorView of it. The model's weights, activations and KV cache of a
// worker are Tensors; ops take their views.
//
// Only the C++ standard library (the kernels-only build uses it). CUDA memory goes through
// kernels/cuda/runtime_api.h: allocating on cuda in a build without the CUDA backend is an
// error, never a crash.
//
// Thread-safety: a Tensor is a value owned by one thread at a time.
#ifndef LLM_KERNELS_DEVICE_TENSOR_H_
#define LLM_KERNELS_DEVICE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "kernels/tensor.h"

namespace llm {

enum class HostMemory : uint8_t {
  kPageable,  // aligned_alloc
  kPinned,    // cudaHostAlloc (needs the CUDA backend): asynchronous copies, device-readable
  // An anonymous private mapping: address space reserved, each page zero-filled and made
  // resident when first touched (the KV cache on cpu, whose blocks are written as they are used).
  kReserved,
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(Tensor&& other) noexcept { *this = std::move(other); }
  Tensor& operator=(Tensor&& other) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  ~Tensor() { Release(); }

  // An uninitialized tensor of `shape` on `device` (cuda: the calling thread's current device
  // must be device.ordinal). Empty string on success, else why (out of memory names the
  // bytes). A tensor of 0 elements still owns one byte, so that its data is never null.
  static std::string Allocate(DType dtype, std::span<const int64_t> shape, TensorDevice device,
                              Tensor* out, HostMemory host = HostMemory::kPageable);
  static std::string Allocate(DType dtype, std::initializer_list<int64_t> shape,
                              TensorDevice device, Tensor* out,
                              HostMemory host = HostMemory::kPageable) {
    return Allocate(dtype, std::span<const int64_t>(shape.begin(), shape.size()), device, out,
                    host);
  }

  bool allocated() const { return view_.data != nullptr; }
  HostMemory host_memory() const { return host_; }
  // Bytes of this host tensor's pages that are resident in memory (mincore): what it has
  // touched, for a kReserved one. Its capacity for pinned memory; 0 on a device.
  size_t ResidentBytes() const;
  const TensorView& view() const { return view_; }
  size_t capacity_bytes() const { return bytes_; }
  template <typename T>
  T* data() const {
    return view_.data_as<T>();
  }
  // A contiguous view of the first elements of this buffer with another shape (and dtype),
  // e.g. this step's rows of an activation buffer sized for the largest step. ndim = -1 (a view
  // every op rejects) when it does not fit.
  TensorView Prefix(DType dtype, std::initializer_list<int64_t> shape) const;
  TensorView Prefix(std::initializer_list<int64_t> shape) const {
    return Prefix(view_.dtype, shape);
  }

 private:
  void Release();

  TensorView view_;
  size_t bytes_ = 0;
  HostMemory host_ = HostMemory::kPageable;
};

// Copies `bytes` where `device` is the device of the copy: cpu, a memcpy (host to host); cuda,
// host <-> device or device <-> device (cudaMemcpyDefault) enqueued on `stream`. Empty string on
// success.
std::string CopyBytes(const TensorDevice& device, void* dst, const void* src, size_t bytes,
                      void* stream);

}  // namespace llm

#endif  // LLM_KERNELS_DEVICE_TENSOR_H_
