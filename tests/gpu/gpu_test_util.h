// Helpers for the CUDA op tests: a fixture that skips (with the reason) where no device is,
// device tensors uploaded from / downloaded to host tensors, NaN poisoning before each launch,
// and comparisons against the CPU reference op.
//
// Tolerances: data movement (embedding, cache writes, block copies) must be bit-exact;
// arithmetic ops are compared with |got - want| <= atol + rtol |want|, the bounds stated in each
// test next to the reason for them. 16-bit (bf16 / f16) activations exist on cuda only: their
// tests run the CPU op (f32) on the same values (RoundedThroughHalf) and allow the one output
// rounding on top (HalfRtol).
#ifndef LLM_TESTS_GPU_GPU_TEST_UTIL_H_
#define LLM_TESTS_GPU_GPU_TEST_UTIL_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"
#include "tests/unit/kernels/test_util.h"

namespace llm::ops::gpu_testing {

using testing::AllClose;
using testing::Indices;
using testing::Poisoned;
using testing::Random;

// Skips every test of a suite where this process has no usable CUDA device.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why_none;
    if (::llm::cuda::DeviceCount(&why_none) == 0)
      GTEST_SKIP() << "no usable CUDA device: " << why_none;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
  // Waits for the default stream (the one the ops run on when OpContext.stream is null) and
  // returns the first asynchronous error, if any.
  static std::string Sync() {
    const cudaError_t err = cudaDeviceSynchronize();
    return err == cudaSuccess ? std::string() : cudaGetErrorString(err);
  }
};

// An owning, contiguous device buffer on cuda:0 with a view. Move-only.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  // A copy of `host`'s contents.
  explicit DeviceTensor(const HostTensor& host) {
    Allocate(host.view());
    if (bytes_ > 0) {
      EXPECT_EQ(cudaMemcpy(view_.data, host.view().data, bytes_, cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }
  DeviceTensor(DeviceTensor&& o) noexcept : view_(o.view_), bytes_(o.bytes_) {
    o.view_.data = nullptr;
  }
  DeviceTensor& operator=(DeviceTensor&& o) noexcept {
    std::swap(view_, o.view_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  ~DeviceTensor() {
    if (view_.data != nullptr) cudaFree(view_.data);
  }

  const TensorView& view() const { return view_; }

  // Every byte 0xFF: NaN as f32, -1 as an index. Done before each launch, so that whatever
  // the kernel does not write fails the comparison.
  void Poison() {
    if (bytes_ > 0) {
      EXPECT_EQ(cudaMemset(view_.data, 0xFF, bytes_), cudaSuccess);
    }
  }

  // The contents, copied back (after the default stream's work).
  HostTensor Download() const {
    HostTensor host(view_.dtype, std::span<const int64_t>(view_.shape.data(), view_.ndim));
    if (bytes_ > 0) {
      EXPECT_EQ(cudaMemcpy(host.view().data, view_.data, bytes_, cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    return host;
  }

 private:
  void Allocate(const TensorView& like) {
    view_ = like;
    view_.data = nullptr;
    view_.device = TensorDevice::Cuda(0);
    bytes_ = like.nbytes();
    // At least one byte, so that an empty tensor still has non-null data.
    EXPECT_EQ(cudaMalloc(&view_.data, bytes_ > 0 ? bytes_ : 1), cudaSuccess);
  }

  TensorView view_;
  size_t bytes_ = 0;
};

// A host tensor with the same contents as `t` (a deep copy).
inline HostTensor Clone(const HostTensor& t) {
  HostTensor c(t.view().dtype, std::span<const int64_t>(t.view().shape.data(), t.view().ndim));
  std::memcpy(c.view().data, t.view().data, t.view().nbytes());
  return c;
}

inline std::vector<double> AsDoubles(const HostTensor& t) {
  const float* p = t.data<float>();
  return std::vector<double>(p, p + t.numel());
}

// got matches want within atol + rtol |want| everywhere; NaN in got never passes.
inline ::testing::AssertionResult Close(const HostTensor& got, const HostTensor& want, double atol,
                                        double rtol) {
  if (got.numel() != want.numel()) {
    return ::testing::AssertionFailure()
           << "sizes differ: " << got.numel() << " vs " << want.numel();
  }
  return AllClose(got.data<float>(), AsDoubles(want), atol, rtol);
}

// Bit-for-bit equal, element by element (NaN positions included: both NaN with the same bits
// count as equal, so untouched poisoned regions can be compared too).
inline ::testing::AssertionResult BitEqual(const HostTensor& got, const HostTensor& want) {
  if (got.view().dtype != want.view().dtype || got.numel() != want.numel()) {
    return ::testing::AssertionFailure() << "dtypes or sizes differ: " << got.view().ToString()
                                         << " vs " << want.view().ToString();
  }
  const size_t size = DTypeSize(got.view().dtype);
  const char* g = static_cast<const char*>(got.view().data);
  const char* w = static_cast<const char*>(want.view().data);
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (std::memcmp(g + i * size, w + i * size, size) != 0) {
      return ::testing::AssertionFailure()
             << "first difference at element " << i << " of " << got.numel() << " ("
             << DTypeName(got.view().dtype) << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// f32 `t` converted to f16 or bf16, rounding to nearest (as the CUDA cache writes do).
inline HostTensor ToHalf(const HostTensor& t, DType dtype) {
  HostTensor h(dtype, std::span<const int64_t>(t.view().shape.data(), t.view().ndim));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = t.data<float>()[i];
    if (dtype == DType::kF16) {
      h.data<__half>()[i] = __float2half_rn(v);
    } else {
      h.data<__nv_bfloat16>()[i] = __float2bfloat16_rn(v);
    }
  }
  return h;
}

// f32 `t` with every element rounded through f16 or bf16: the values a half cache holds, as
// f32 for the CPU reference.
inline HostTensor RoundedThroughHalf(const HostTensor& t, DType dtype) {
  HostTensor r = Clone(t);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = t.data<float>()[i];
    r.data<float>()[i] = dtype == DType::kF16 ? __half2float(__float2half_rn(v))
                                              : __bfloat162float(__float2bfloat16_rn(v));
  }
  return r;
}

// A f16 or bf16 tensor's values as f32 (exact), e.g. a downloaded 16-bit output to compare with
// the CPU reference.
inline HostTensor HalfToF32(const HostTensor& h) {
  HostTensor f(DType::kF32, std::span<const int64_t>(h.view().shape.data(), h.view().ndim));
  for (int64_t i = 0; i < h.numel(); ++i) {
    f.data<float>()[i] = h.view().dtype == DType::kF16
                             ? __half2float(h.data<__half>()[i])
                             : __bfloat162float(h.data<__nv_bfloat16>()[i]);
  }
  return f;
}

// Tolerances of a 16-bit output against the fp32 CPU op on the same (16-bit) inputs: the
// kernels compute in fp32 and round once when storing, to nearest even, a relative error of at
// most 2^-8 (bf16: 8 significant bits) or 2^-11 (f16: 11). Ops that round an intermediate they
// store and reuse (FusedAddRmsNorm's residual) double it.
inline double HalfRtol(DType dtype) { return dtype == DType::kBF16 ? 1.0 / 256 : 1.0 / 2048; }

// Captures what `enqueue` queues on a fresh non-blocking stream into a graph, counts its kernel
// and memcpy nodes, then runs the graph and waits for it.
struct NodeCounts {
  size_t kernels = 0, memcpys = 0;
};
template <typename F>
inline NodeCounts CaptureAndRun(F enqueue) {
  NodeCounts counts;
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // uploads on the legacy default stream
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  enqueue(stream);
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  size_t num_nodes = 0;
  EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &num_nodes), cudaSuccess);
  std::vector<cudaGraphNode_t> nodes(num_nodes);
  EXPECT_EQ(cudaGraphGetNodes(graph, nodes.data(), &num_nodes), cudaSuccess);
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    EXPECT_EQ(cudaGraphNodeGetType(node, &type), cudaSuccess);
    if (type == cudaGraphNodeTypeKernel) ++counts.kernels;
    if (type == cudaGraphNodeTypeMemcpy) ++counts.memcpys;
  }
  cudaGraphExec_t exec = nullptr;
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return counts;
}

// The row counts every op is tried with: one token, odd sizes around a 16-wide tile, many.
inline constexpr int64_t kTokenCounts[] = {1, 15, 17, 1000};

}  // namespace llm::ops::gpu_testing

#endif  // LLM_TESTS_GPU_GPU_TEST_UTIL_H_
