// TensorView helpers and the aligned host buffer.
#include "kernels/tensor.h"

#include <cstdlib>
#include <new>

namespace llm {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kI64:
      return 8;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
  }
  return "?";
}

std::string TensorDevice::ToString() const {
  if (is_cpu()) return "cpu";
  return "cuda:" + std::to_string(ordinal);
}

TensorView TensorView::Contiguous(void* data, DType dtype, std::span<const int64_t> shape,
                                  TensorDevice device) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  if (shape.size() > kMaxDims) {
    v.ndim = -1;  // not representable: every op rejects it
    return v;
  }
  v.ndim = static_cast<int>(shape.size());
  int d = 0;
  for (int64_t s : shape) v.shape[d++] = s;
  int64_t stride = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    v.strides[i] = stride;
    stride *= v.shape[i];
  }
  return v;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

std::string TensorView::ShapeString() const {
  if (ndim < 0) return "[more than " + std::to_string(kMaxDims) + " dims]";
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string TensorView::ToString() const {
  return std::string(DTypeName(dtype)) + " " + ShapeString() + " on " + device.ToString();
}

void HostTensor::FreeAligned::operator()(void* p) const { std::free(p); }

HostTensor::HostTensor(DType dtype, std::span<const int64_t> shape) {
  view_ = TensorView::Contiguous(nullptr, dtype, shape);
  constexpr size_t kAlign = 64;
  // aligned_alloc wants a multiple of the alignment; never 0 bytes, so data is never null.
  const size_t bytes = (view_.nbytes() + kAlign - 1) / kAlign * kAlign + kAlign;
  void* p = std::aligned_alloc(kAlign, bytes);
  if (p == nullptr) throw std::bad_alloc();
  buffer_.reset(p);
  view_.data = p;
}

}  // namespace llm
