// Dynamic shared memory (kernels/cuda/shared_memory.cuh) and cp.async (kernels/cuda/async_copy.cuh)
// as a kernel sees them, on a device and under the emulation alike:
//   * 64 KB, 100 KB and the device's opt-in maximum (227 KB on an H100) filled by the block's
//     threads together and read back, after a barrier, by other threads than their writers;
//   * the launch limit: above 48 KB only after cudaFuncAttributeMaxDynamicSharedMemorySize, and
//     that attribute only up to cudaDevAttrMaxSharedMemoryPerBlockOptin;
//   * the blocks of a grid running at once each have their own buffer;
//   * a tiled copy through a 2-stage cp.async pipeline (4-, 8- and 16-byte copies, the last tile
//     partial and zero-filled), each thread storing elements that other threads copied.
// What only the emulation can promise (poison, a copy invisible before its wait) is in
// tests/unit/cuda_emu/. Built as CUDA for the device run (a .cu wrapper,
// tests/gpu/CMakeLists.txt) and as C++ for the emulated one.
#include "kernels/cuda/shared_memory.cuh"

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/launch.cuh"
#include "tests/gpu/gpu_test_util.h"

namespace llm::cuda {
namespace {

using ops::gpu_testing::CudaTest;

// The word block b writes at index i.
__host__ __device__ constexpr uint32_t Word(uint32_t block, uint32_t i) {
  return block * 0x9e3779b9u + i * 2654435761u + 1u;
}

// Fills `words` of dynamic shared memory (thread t writes words t, t + blockDim.x, ...), then
// after a barrier stores them reversed: out[block][i] = shared[words - 1 - i], a word another
// thread wrote. kTag only makes distinct kernels, for attributes set on one and not the other.
template <int kTag>
__global__ void FillReversedKernel(uint32_t* out, int words) {
  uint32_t* s = DynamicSharedMemory<uint32_t>();
  for (int i = threadIdx.x; i < words; i += blockDim.x) s[i] = Word(blockIdx.x, i);
  __syncthreads();
  for (int i = threadIdx.x; i < words; i += blockDim.x) {
    out[static_cast<size_t>(blockIdx.x) * words + i] = s[words - 1 - i];
  }
}

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&data_, n_ * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(data_, 0, n_ * sizeof(T)), cudaSuccess);
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    EXPECT_EQ(cudaMemcpy(data_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return data_; }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  T* data_ = nullptr;
  size_t n_;
};

class CudaDynamicSharedMemory : public CudaTest {
 protected:
  static int OptinBytes() {
    int bytes = 0;
    EXPECT_EQ(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0),
              cudaSuccess);
    return bytes;
  }

  // Launches FillReversedKernel<kTag> with `bytes` of dynamic shared memory and checks every
  // word of every block.
  template <int kTag>
  static void FillAndCheck(int bytes, int blocks, int threads) {
    SCOPED_TRACE(::testing::Message() << bytes << " bytes, " << blocks << " blocks");
    const int words = bytes / 4;
    DeviceBuffer<uint32_t> out(static_cast<size_t>(blocks) * words);
    Launch(FillReversedKernel<kTag>, blocks, threads, bytes, nullptr, out.get(), words);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    ASSERT_EQ(Sync(), "");
    const std::vector<uint32_t> host = out.Download();
    for (int b = 0; b < blocks; ++b) {
      for (int i = 0; i < words; ++i) {
        ASSERT_EQ(host[static_cast<size_t>(b) * words + i], Word(b, words - 1 - i))
            << "block " << b << " word " << i;
      }
    }
  }
};

TEST_F(CudaDynamicSharedMemory, UpTo48KbNeedsNoAttribute) {
  FillAndCheck<1>(4 * 1024, 2, 128);
  FillAndCheck<1>(48 * 1024, 2, 256);
}

TEST_F(CudaDynamicSharedMemory, LargeBuffersAfterTheAttribute) {
  const int optin = OptinBytes();
  ASSERT_GE(optin, 100 * 1024);
  ASSERT_EQ(cudaFuncSetAttribute(FillReversedKernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 optin),
            cudaSuccess);
  FillAndCheck<0>(64 * 1024, 2, 256);
  FillAndCheck<0>(100 * 1024, 2, 1024);
  FillAndCheck<0>(optin, 2, 512);
}

TEST_F(CudaDynamicSharedMemory, TheBlocksOfAGridEachHaveTheirOwnBuffer) {
  ASSERT_EQ(cudaFuncSetAttribute(FillReversedKernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 64 * 1024),
            cudaSuccess);
  // More blocks than an SM holds at 64 KB, and than the emulation's OS threads: shared
  // buffers would mix two blocks' words.
  FillAndCheck<0>(64 * 1024, 24, 128);
}

TEST_F(CudaDynamicSharedMemory, Above48KbTheLaunchFailsWithoutTheAttribute) {
  DeviceBuffer<uint32_t> out((48 * 1024 + 16) / 4);
  cudaGetLastError();
  Launch(FillReversedKernel<2>, 1, 128, 48 * 1024 + 16, nullptr, out.get(), 16);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  // The launch error is not sticky: the next launch is fine.
  FillAndCheck<2>(48 * 1024, 1, 128);
}

TEST_F(CudaDynamicSharedMemory, TheAttributeStopsAtTheOptinMaximum) {
  const int optin = OptinBytes();
  EXPECT_EQ(cudaFuncSetAttribute(FillReversedKernel<3>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 optin + 1),
            cudaErrorInvalidValue);
  cudaGetLastError();
  ASSERT_EQ(cudaFuncSetAttribute(FillReversedKernel<3>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 64 * 1024),
            cudaSuccess);
  // Up to the kernel's own limit, not the device's.
  DeviceBuffer<uint32_t> out(16);
  Launch(FillReversedKernel<3>, 1, 128, 64 * 1024 + 16, nullptr, out.get(), 16);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  FillAndCheck<3>(64 * 1024, 1, 128);
}

// dst[i] = src[i] for i < n, 0 for n <= i < num_tiles * tile, through shared memory: tile k of
// the block is copied by cp.async into stage k % 2 while the block stores tile k - 1 from the
// other stage. Thread t copies kBytes at t * kBytes of a tile and stores floats t, t + blockDim.x,
// ... from shared memory in reverse order, so most of what it stores another thread copied.
template <int kBytes>
__device__ void IssueTile(const float* src, int n, float* stage, int tile) {
  constexpr int kFloats = kBytes / 4;
  const int tile_floats = blockDim.x * kFloats;
  const int first = tile * tile_floats + threadIdx.x * kFloats;
  const int valid = first < n ? min(n - first, kFloats) : 0;
  CpAsync<kBytes>(stage + threadIdx.x * kFloats, src + (valid > 0 ? first : 0), valid * 4);
}

template <int kBytes>
__global__ void PipelinedCopyKernel(const float* src, int n, float* dst, int num_tiles) {
  const int tile_floats = blockDim.x * (kBytes / 4);
  float* stages = DynamicSharedMemory<float>();  // [2][tile_floats]
  int tile = blockIdx.x;
  if (tile < num_tiles) IssueTile<kBytes>(src, n, stages, tile);
  CpAsyncCommitGroup();
  for (int k = 0; tile < num_tiles; tile += gridDim.x, ++k) {
    const int next = tile + gridDim.x;
    if (next < num_tiles) IssueTile<kBytes>(src, n, stages + ((k + 1) & 1) * tile_floats, next);
    CpAsyncCommitGroup();   // a group, empty or not, per tile: the wait below counts them
    CpAsyncWaitGroup<1>();  // this tile's copies are done; the next tile's may still run
    __syncthreads();        // and so are the other threads'
    const float* stage = stages + (k & 1) * tile_floats;
    for (int i = threadIdx.x; i < tile_floats; i += blockDim.x) {
      const int j = tile_floats - 1 - i;
      dst[tile * tile_floats + j] = stage[j];
    }
    __syncthreads();  // every thread is done with this stage before it is refilled
  }
}

class CudaAsyncCopy : public CudaTest {
 protected:
  template <int kBytes>
  static void CheckPipelinedCopy(int n, int blocks, int threads) {
    SCOPED_TRACE(::testing::Message() << kBytes << "-byte copies, n " << n);
    const int tile_floats = threads * kBytes / 4;
    const int num_tiles = (n + tile_floats - 1) / tile_floats;
    std::vector<float> src(n);
    for (int i = 0; i < n; ++i) src[i] = static_cast<float>(i) * 0.5f + 1.0f;
    DeviceBuffer<float> d_src(src);
    DeviceBuffer<float> d_dst(static_cast<size_t>(num_tiles) * tile_floats);
    ASSERT_EQ(cudaMemset(d_dst.get(), 0xff, static_cast<size_t>(num_tiles) * tile_floats * 4),
              cudaSuccess);  // NaN, so that a tile never stored shows
    Launch(PipelinedCopyKernel<kBytes>, blocks, threads, 2 * tile_floats * sizeof(float), nullptr,
           d_src.get(), n, d_dst.get(), num_tiles);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    ASSERT_EQ(Sync(), "");
    const std::vector<float> dst = d_dst.Download();
    for (int i = 0; i < num_tiles * tile_floats; ++i) {
      ASSERT_EQ(dst[i], i < n ? src[i] : 0.0f) << "float " << i;
    }
  }
};

TEST_F(CudaAsyncCopy, TwoStagePipelineCopies16ByteVectors) {
  CheckPipelinedCopy<16>(128 * 4 * 10, 3, 128);  // whole tiles, several per block
}

TEST_F(CudaAsyncCopy, PartialLastTileIsZeroFilled) {
  CheckPipelinedCopy<16>(128 * 4 * 5 + 37, 2, 128);  // a partial vector in the last tile
  CheckPipelinedCopy<8>(64 * 2 * 7 + 3, 2, 64);
  CheckPipelinedCopy<4>(96 * 9 + 50, 4, 96);
}

}  // namespace
}  // namespace llm::cuda
