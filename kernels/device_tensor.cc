#include "kernels/device_tensor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#ifdef LLM_WITH_CUDA
#include "kernels/cuda/runtime_api.h"
#endif

namespace llm {

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    Release();
    view_ = std::exchange(other.view_, TensorView{});
    bytes_ = std::exchange(other.bytes_, 0);
    host_ = other.host_;
  }
  return *this;
}

std::string Tensor::Allocate(DType dtype, std::span<const int64_t> shape, TensorDevice device,
                             Tensor* out, HostMemory host) {
  out->Release();
  TensorView view = TensorView::Contiguous(nullptr, dtype, shape, device);
  if (view.ndim < 0) return "Tensor: too many dimensions";
  for (int i = 0; i < view.ndim; ++i) {
    if (view.shape[i] < 0) return "Tensor: negative size in " + view.ShapeString();
  }
  const size_t bytes = std::max<size_t>(view.nbytes(), 1);
  void* data = nullptr;
  if (device.is_cpu() && host == HostMemory::kPageable) {
    data = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (data == nullptr)
      return "Tensor: out of host memory for " + std::to_string(bytes) + " bytes";
  } else if (device.is_cpu() && host == HostMemory::kReserved) {
    // MAP_NORESERVE: no swap is set aside for pages never touched (overcommit still applies).
    data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                -1, 0);
    if (data == MAP_FAILED) {
      return "Tensor: cannot reserve " + std::to_string(bytes) +
             " bytes of host memory: " + std::strerror(errno);
    }
  } else {
#ifdef LLM_WITH_CUDA
    const std::string err =
        device.is_cpu() ? cuda::HostAlloc(bytes, &data) : cuda::Malloc(bytes, &data);
    if (!err.empty()) {
      return "Tensor: " + std::to_string(bytes) + " bytes on " +
             (device.is_cpu() ? std::string("pinned host memory") : device.ToString()) + ": " + err;
    }
#else
    return "Tensor: " + device.ToString() + (device.is_cpu() ? " pinned memory" : "") +
           " needs the CUDA backend, not built";
#endif
  }
  view.data = data;
  out->view_ = view;
  out->bytes_ = bytes;
  out->host_ = host;
  return {};
}

TensorView Tensor::Prefix(DType dtype, std::initializer_list<int64_t> shape) const {
  TensorView v = TensorView::Contiguous(
      view_.data, dtype, std::span<const int64_t>(shape.begin(), shape.size()), view_.device);
  if (v.ndim >= 0 && v.nbytes() > bytes_) v.ndim = -1;
  return v;
}

void Tensor::Release() {
  if (view_.data == nullptr) return;
  if (view_.device.is_cpu() && host_ == HostMemory::kPageable) {
    std::free(view_.data);
  } else if (view_.device.is_cpu() && host_ == HostMemory::kReserved) {
    munmap(view_.data, bytes_);
  } else {
#ifdef LLM_WITH_CUDA
    if (view_.device.is_cpu()) {
      (void)cuda::HostFree(view_.data);
    } else {
      (void)cuda::Free(view_.data);
    }
#endif
  }
  view_ = TensorView{};
  bytes_ = 0;
}

size_t Tensor::ResidentBytes() const {
  if (view_.data == nullptr || !view_.device.is_cpu()) return 0;
  if (host_ == HostMemory::kPinned) return bytes_;
  // mincore wants a page-aligned start: count the pages the buffer overlaps, then clip.
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(view_.data);
  const uintptr_t first = begin / page * page;
  const uintptr_t end = begin + bytes_;
  std::vector<unsigned char> resident((end - first + page - 1) / page);
  if (mincore(reinterpret_cast<void*>(first), end - first, resident.data()) != 0) return 0;
  size_t total = 0;
  for (size_t i = 0; i < resident.size(); ++i) {
    if ((resident[i] & 1) == 0) continue;
    const uintptr_t lo = std::max(first + i * page, begin);
    const uintptr_t hi = std::min(first + (i + 1) * page, end);
    total += hi - lo;
  }
  return total;
}

std::string CopyBytes(const TensorDevice& device, void* dst, const void* src, size_t bytes,
                      void* stream) {
  if (bytes == 0) return {};
  if (device.is_cpu()) {
    std::memmove(dst, src, bytes);
    return {};
  }
#ifdef LLM_WITH_CUDA
  return cuda::MemcpyAsync(dst, src, bytes, stream);
#else
  (void)stream;
  return "CopyBytes: " + device.ToString() + " needs the CUDA backend, not built";
#endif
}

}  // namespace llm
