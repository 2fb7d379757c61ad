#include "kernels/device_tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

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
