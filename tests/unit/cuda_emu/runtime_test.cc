// The emulated runtime (cuda_emu/runtime.cc): the guarded arena, lazy streams, events,
// devices, memory limits; half and bf16 rounding (include/cuda_fp16.h, cuda_bf16.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/launch.cuh"

namespace llm::cuda_emu {
namespace {

class EmuRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cudaSetDevice(0), cudaSuccess); }
};

TEST_F(EmuRuntimeTest, DevicesAreH100Like) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_GE(count, 1);
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_EQ(prop.multiProcessorCount, 132);
  EXPECT_EQ(prop.major, 9);
  EXPECT_EQ(cudaSetDevice(count), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
}

using EmuRuntimeDeathTest = EmuRuntimeTest;

TEST_F(EmuRuntimeDeathTest, HostDereferenceOfADevicePointerDies) {
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, sizeof(int)), cudaSuccess);
  EXPECT_DEATH(
      {
        volatile int* p = d;
        *p = 1;
      },
      "host code dereferenced device pointer 0x[0-9a-f]+ of cuda:0 \\(emulated CUDA\\)");
  cudaFree(d);
}

__global__ void FillKernel(int* out, int n, int value) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value;
}

// A kernel, then an asynchronous copy to pinned memory: before the stream is synchronized the
// host sees the old bytes (as it may on a GPU), after it the kernel's.
TEST_F(EmuRuntimeTest, MissingStreamSyncIsObservable) {
  constexpr int kN = 1000;
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  int* d = nullptr;
  int* h = nullptr;
  ASSERT_EQ(cudaMalloc(&d, kN * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&h, kN * sizeof(int)), cudaSuccess);
  for (int i = 0; i < kN; ++i) h[i] = -1;
  cuda::Launch(FillKernel, (kN + 127) / 128, 128, 0, stream, d, kN, 7);
  ASSERT_EQ(cudaMemcpyAsync(h, d, kN * sizeof(int), cudaMemcpyDeviceToHost, stream), cudaSuccess);
  EXPECT_EQ(h[0], -1);  // not synchronized: not there yet
  EXPECT_EQ(h[kN - 1], -1);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(h[0], 7);
  EXPECT_EQ(h[kN - 1], 7);
  cudaFreeHost(h);
  cudaFree(d);
  cudaStreamDestroy(stream);
}

// Stream capture records a kernel, a memset and copies as a graph's nodes without running them;
// each launch of the graph runs them again, in order, on the launch stream.
TEST_F(EmuRuntimeTest, CapturedWorkRunsOnlyWhenTheGraphIsLaunched) {
  constexpr int kN = 256;
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  int *a = nullptr, *b = nullptr, *h = nullptr;
  ASSERT_EQ(cudaMalloc(&a, kN * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, kN * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&h, kN * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemset(b, 0, kN * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(a, 0xff, kN * sizeof(int), stream), cudaSuccess);
  cuda::Launch(FillKernel, (kN + 127) / 128, 128, 0, stream, a, kN / 2, 5);
  ASSERT_EQ(cudaMemcpyAsync(b, a, kN * sizeof(int), cudaMemcpyDeviceToDevice, stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(h, b, kN * sizeof(int), cudaMemcpyDeviceToHost, stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);

  size_t num_nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &num_nodes), cudaSuccess);
  ASSERT_EQ(num_nodes, 4u);
  std::vector<cudaGraphNode_t> nodes(num_nodes);
  ASSERT_EQ(cudaGraphGetNodes(graph, nodes.data(), &num_nodes), cudaSuccess);
  std::vector<cudaGraphNodeType> types;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    ASSERT_EQ(cudaGraphNodeGetType(node, &type), cudaSuccess);
    types.push_back(type);
  }
  EXPECT_EQ(types,
            (std::vector<cudaGraphNodeType>{cudaGraphNodeTypeMemset, cudaGraphNodeTypeKernel,
                                            cudaGraphNodeTypeMemcpy, cudaGraphNodeTypeMemcpy}));
  // Captured, not run: b still holds its zeros.
  ASSERT_EQ(cudaMemcpy(h, b, kN * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(h[0], 0);

  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);  // the executable graph keeps its nodes
  for (int launch = 0; launch < 2; ++launch) {
    for (int i = 0; i < kN; ++i) h[i] = 9;
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    EXPECT_EQ(h[0], 9);  // launched, not yet synchronized
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(h[0], 5) << "launch " << launch;
    EXPECT_EQ(h[kN / 2 - 1], 5);
    EXPECT_EQ(h[kN / 2], -1);  // the memset's 0xff bytes
  }
  cudaGraphExecDestroy(exec);
  cudaFreeHost(h);
  cudaFree(b);
  cudaFree(a);
  cudaStreamDestroy(stream);
}

// What a capture cannot record fails, and the capture with it; the legacy stream is not
// capturable.
TEST_F(EmuRuntimeTest, ASynchronizingCallInvalidatesTheCapture) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal),
            cudaErrorStreamCaptureUnsupported);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaStreamCaptureStatus status{};
  ASSERT_EQ(cudaStreamIsCapturing(stream, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaErrorStreamCaptureUnsupported);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
  ASSERT_EQ(cudaStreamIsCapturing(stream, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  cudaGetLastError();
  cudaStreamDestroy(stream);
}

// Two non-blocking streams: the consumer sees the producer's write only through an event.
TEST_F(EmuRuntimeTest, CrossStreamDependencyNeedsAnEvent) {
  cudaStream_t producer, consumer;
  ASSERT_EQ(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking), cudaSuccess);
  int *a = nullptr, *b = nullptr, *h = nullptr;
  ASSERT_EQ(cudaMalloc(&a, sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&h, sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(a, 0, sizeof(int), producer), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(producer), cudaSuccess);

  // Without the event: the consumer's copy of `a` runs before the producer's fill.
  cuda::Launch(FillKernel, 1, 32, 0, producer, a, 1, 5);
  ASSERT_EQ(cudaMemcpyAsync(b, a, sizeof(int), cudaMemcpyDeviceToDevice, consumer), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(h, b, sizeof(int), cudaMemcpyDeviceToHost, consumer), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(consumer), cudaSuccess);
  EXPECT_EQ(*h, 0);
  ASSERT_EQ(cudaStreamSynchronize(producer), cudaSuccess);

  // With it: the fill comes first.
  cudaEvent_t ready;
  ASSERT_EQ(cudaEventCreate(&ready), cudaSuccess);
  cuda::Launch(FillKernel, 1, 32, 0, producer, a, 1, 9);
  ASSERT_EQ(cudaEventRecord(ready, producer), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(consumer, ready, 0), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(b, a, sizeof(int), cudaMemcpyDeviceToDevice, consumer), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(h, b, sizeof(int), cudaMemcpyDeviceToHost, consumer), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(consumer), cudaSuccess);
  EXPECT_EQ(*h, 9);
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, ready, ready), cudaSuccess);
  EXPECT_EQ(ms, 0.0f);
  cudaEventDestroy(ready);
  cudaFreeHost(h);
  cudaFree(a);
  cudaFree(b);
  cudaStreamDestroy(producer);
  cudaStreamDestroy(consumer);
}

// A blocking stream waits for the legacy default stream's earlier work.
TEST_F(EmuRuntimeTest, LegacyDefaultStreamOrdersBlockingStreams) {
  cudaStream_t blocking;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  int *d = nullptr, *h = nullptr;
  ASSERT_EQ(cudaMalloc(&d, sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&h, sizeof(int)), cudaSuccess);
  cuda::Launch(FillKernel, 1, 32, 0, nullptr, d, 1, 3);  // legacy stream
  ASSERT_EQ(cudaMemcpyAsync(h, d, sizeof(int), cudaMemcpyDeviceToHost, blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(blocking), cudaSuccess);
  EXPECT_EQ(*h, 3);
  cudaFreeHost(h);
  cudaFree(d);
  cudaStreamDestroy(blocking);
}

TEST_F(EmuRuntimeTest, OutOfMemoryAndMemGetInfo) {
  size_t free0 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, total + 1), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  ASSERT_EQ(cudaMalloc(&p, 1 << 20), cudaSuccess);
  size_t free1 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  EXPECT_EQ(free0 - free1, size_t{1} << 20);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaErrorInvalidValue);  // double free
}

TEST_F(EmuRuntimeTest, CopyOutsideAnAllocationFails) {
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 256), cudaSuccess);
  std::vector<char> h(512);
  EXPECT_EQ(cudaMemcpy(h.data(), d, 512, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(h.data(), d, 256, cudaMemcpyHostToDevice), cudaErrorInvalidMemcpyDirection);
  cudaGetLastError();
  cudaFree(d);
}

uint16_t HalfBits(float f) { return __half_as_ushort(__float2half_rn(f)); }
uint16_t Bf16Bits(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

TEST(EmuHalfTest, RoundsToNearestEven) {
  EXPECT_EQ(HalfBits(1.0f), 0x3c00);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: to the even one, 1.
  EXPECT_EQ(HalfBits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9: to the even, up.
  EXPECT_EQ(HalfBits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(HalfBits(65504.0f), 0x7bff);
  EXPECT_EQ(HalfBits(65520.0f), 0x7c00);  // halfway to the next: rounds to inf
  EXPECT_EQ(HalfBits(-0.0f), 0x8000);
  EXPECT_EQ(HalfBits(std::ldexp(1.0f, -24)), 0x0001);  // the smallest subnormal
  EXPECT_EQ(HalfBits(std::ldexp(1.0f, -25)), 0x0000);  // halfway to it: to even, 0
  EXPECT_EQ(HalfBits(NAN), 0x7fff);
  EXPECT_EQ(__half2float(__ushort_as_half(0x0001)), std::ldexp(1.0f, -24));
  EXPECT_EQ(__half2float(__ushort_as_half(0xc000)), -2.0f);
  EXPECT_TRUE(std::isinf(__half2float(__ushort_as_half(0x7c00))));
}

TEST(EmuBf16Test, RoundsToNearestEven) {
  EXPECT_EQ(Bf16Bits(1.0f), 0x3f80);
  EXPECT_EQ(Bf16Bits(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // halfway, even below
  EXPECT_EQ(Bf16Bits(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // halfway, even above
  EXPECT_EQ(Bf16Bits(std::bit_cast<float>(0x3f808001u)), 0x3f81);  // above halfway
  EXPECT_EQ(Bf16Bits(std::bit_cast<float>(0x7f7fffffu)), 0x7f80);  // max float: inf
  EXPECT_EQ(Bf16Bits(NAN), 0x7fff);
  EXPECT_EQ(__bfloat162float(__ushort_as_bfloat16(0xc040)), -3.0f);
}

}  // namespace
}  // namespace llm::cuda_emu
