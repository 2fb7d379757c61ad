// TensorView: a non-owning view of a strided array on one device (cpu or cuda:N), the
// argument type of every op in kernels/ops.h. HostTensor: a small owning, 64-byte aligned
// host buffer with a view, for tests and the CPU worker.
//
// Only the C++ standard library: the kernels-only build (no Abseil, no glog) uses this header,
// and so do CUDA sources. Shapes and strides count elements, not bytes; a view has 0 to
// kMaxDims dimensions (0 = a scalar). A view with data == nullptr is "absent" (an optional
// argument such as a bias).
//
// Thread-safety: a view is a value; what it points to is the caller's to synchronize.
#ifndef LLM_KERNELS_TENSOR_H_
#define LLM_KERNELS_TENSOR_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>

namespace llm {

enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kI64 };

// Bytes per element: 4, 2, 2, 4, 8.
size_t DTypeSize(DType dtype);
// "f32", "f16", "bf16", "i32", "i64".
const char* DTypeName(DType dtype);

enum class DeviceType : uint8_t { kCpu, kCuda };

// Where a tensor's memory lives: the host, or CUDA device `ordinal`.
struct TensorDevice {
  DeviceType type = DeviceType::kCpu;
  int ordinal = 0;  // 0 for the host

  static TensorDevice Cpu() { return {}; }
  static TensorDevice Cuda(int ordinal) { return {DeviceType::kCuda, ordinal}; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  // "cpu" or "cuda:N".
  std::string ToString() const;
  friend bool operator==(const TensorDevice&, const TensorDevice&) = default;
};

inline constexpr int kMaxDims = 5;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  TensorDevice device;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};  // elements

  // A row-major (C-contiguous) view of `data` with the given shape. More than kMaxDims dims
  // gives ndim = -1, a view every op rejects.
  static TensorView Contiguous(void* data, DType dtype, std::span<const int64_t> shape,
                               TensorDevice device = TensorDevice::Cpu());
  static TensorView Contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               TensorDevice device = TensorDevice::Cpu()) {
    return Contiguous(data, dtype, std::span<const int64_t>(shape.begin(), shape.size()), device);
  }

  bool present() const { return data != nullptr; }
  int64_t size(int dim) const { return shape[dim]; }
  // Product of the shape; 1 for a scalar.
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype); }
  // Row-major with no gaps (dimensions of size 1 may have any stride).
  bool is_contiguous() const;
  // "[3, 4, 64]".
  std::string ShapeString() const;
  // "f32 [3, 4, 64] on cpu".
  std::string ToString() const;

  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data);
  }
};

// An owning host tensor: contiguous, 64-byte aligned, uninitialized. Move-only.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::span<const int64_t> shape);
  HostTensor(DType dtype, std::initializer_list<int64_t> shape)
      : HostTensor(dtype, std::span<const int64_t>(shape.begin(), shape.size())) {}
  HostTensor(HostTensor&&) = default;
  HostTensor& operator=(HostTensor&&) = default;
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;

  const TensorView& view() const { return view_; }
  int64_t numel() const { return view_.numel(); }
  template <typename T>
  T* data() const {
    return view_.data_as<T>();
  }

 private:
  struct FreeAligned {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, FreeAligned> buffer_;
  TensorView view_;
};

}  // namespace llm

#endif  // LLM_KERNELS_TENSOR_H_
