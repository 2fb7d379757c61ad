// SwapBlocks on CUDA against the CPU op: swap out to pinned and to pageable host memory, swap
// in, and device to device. Bit-equal.
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "tests/gpu/gpu_test_util.h"

namespace llm::ops {
namespace {

using gpu_testing::CaptureAndRun;
using gpu_testing::NodeCounts;

using gpu_testing::BitEqual;
using gpu_testing::Clone;
using gpu_testing::CudaTest;
using gpu_testing::DeviceTensor;
using gpu_testing::Random;
using gpu_testing::RoundedThroughHalf;
using gpu_testing::ToHalf;

class CudaSwapBlocks : public CudaTest {};

// A host cache in pinned memory (cudaHostAlloc), as the worker's CPU swap space is.
class PinnedTensor {
 public:
  explicit PinnedTensor(const HostTensor& like) {
    bytes_ = like.view().nbytes();
    EXPECT_EQ(cudaHostAlloc(&data_, bytes_, cudaHostAllocDefault), cudaSuccess);
    std::memcpy(data_, like.view().data, bytes_);
    view_ = like.view();
    view_.data = data_;
  }
  ~PinnedTensor() { cudaFreeHost(data_); }
  PinnedTensor(const PinnedTensor&) = delete;
  PinnedTensor& operator=(const PinnedTensor&) = delete;
  const TensorView& view() const { return view_; }
  HostTensor Copy() const {
    HostTensor t(view_.dtype, std::span<const int64_t>(view_.shape.data(), view_.ndim));
    std::memcpy(t.view().data, data_, bytes_);
    return t;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  TensorView view_;
};

TEST_F(CudaSwapBlocks, SwapOutSwapInAndDeviceToDeviceMatchCpu) {
  std::mt19937 rng(801);
  HostTensor gpu_cache = Random({10, 16, 8, 128}, rng);
  HostTensor cpu_cache = Random({6, 16, 8, 128}, rng);
  const std::vector<BlockPair> out_pairs = {{9, 0}, {2, 5}, {4, 3}};
  const std::vector<BlockPair> in_pairs = {{5, 1}, {0, 7}};

  // Swap out into pinned memory, then into pageable memory.
  {
    DeviceTensor d_gpu(gpu_cache);
    PinnedTensor pinned(cpu_cache);
    HostTensor pageable = Clone(cpu_cache);
    HostTensor want = Clone(cpu_cache);
    ASSERT_TRUE(SwapBlocks({}, gpu_cache.view(), want.view(), out_pairs).ok());
    OpStatus s = SwapBlocks({}, d_gpu.view(), pinned.view(), out_pairs);
    ASSERT_TRUE(s.ok()) << s.message;
    s = SwapBlocks({}, d_gpu.view(), pageable.view(), out_pairs);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(Sync(), "");
    EXPECT_TRUE(BitEqual(pinned.Copy(), want));
    EXPECT_TRUE(BitEqual(pageable, want));
  }
  // Swap in from pinned memory.
  {
    DeviceTensor d_gpu(gpu_cache);
    PinnedTensor pinned(cpu_cache);
    HostTensor want = Clone(gpu_cache);
    ASSERT_TRUE(SwapBlocks({}, cpu_cache.view(), want.view(), in_pairs).ok());
    const OpStatus s = SwapBlocks({}, pinned.view(), d_gpu.view(), in_pairs);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(Sync(), "");
    EXPECT_TRUE(BitEqual(d_gpu.Download(), want));
  }
  // Device to device, between two caches.
  {
    DeviceTensor d_src(gpu_cache), d_dst(cpu_cache);
    HostTensor want = Clone(cpu_cache);
    ASSERT_TRUE(SwapBlocks({}, gpu_cache.view(), want.view(), out_pairs).ok());
    const OpStatus s = SwapBlocks({}, d_src.view(), d_dst.view(), out_pairs);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(Sync(), "");
    EXPECT_TRUE(BitEqual(d_dst.Download(), want));
  }
}

// A bf16 / f16 cache swaps out to and back in from pinned memory of its dtype.
TEST_F(CudaSwapBlocks, HalfCachesSwapOutAndInMatchCpu) {
  std::mt19937 rng(803);
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    HostTensor gpu_cache = RoundedThroughHalf(Random({5, 32, 8, 128}, rng), dtype);
    HostTensor cpu_cache = RoundedThroughHalf(Random({4, 32, 8, 128}, rng), dtype);
    const std::vector<BlockPair> out_pairs = {{4, 0}, {1, 2}};
    const std::vector<BlockPair> in_pairs = {{2, 3}};
    DeviceTensor d_gpu(ToHalf(gpu_cache, dtype));
    PinnedTensor pinned(ToHalf(cpu_cache, dtype));
    ASSERT_TRUE(SwapBlocks({}, gpu_cache.view(), cpu_cache.view(), out_pairs).ok());
    ASSERT_TRUE(SwapBlocks({}, cpu_cache.view(), gpu_cache.view(), in_pairs).ok());
    OpStatus s = SwapBlocks({}, d_gpu.view(), pinned.view(), out_pairs);
    ASSERT_TRUE(s.ok()) << s.message;
    s = SwapBlocks({}, pinned.view(), d_gpu.view(), in_pairs);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(Sync(), "");
    EXPECT_TRUE(BitEqual(pinned.Copy(), ToHalf(cpu_cache, dtype)));
    EXPECT_TRUE(BitEqual(d_gpu.Download(), ToHalf(gpu_cache, dtype)));
  }
}

TEST_F(CudaSwapBlocks, BlockOutsideEitherCacheIsAnError) {
  std::mt19937 rng(802);
  DeviceTensor d_gpu(Random({4, 16, 1, 64}, rng));
  HostTensor host = Random({2, 16, 1, 64}, rng);
  const std::vector<BlockPair> bad_dst = {{0, 2}};
  EXPECT_EQ(SwapBlocks({}, d_gpu.view(), host.view(), bad_dst).message,
            "SwapBlocks: pairs[0].dst = 2 is outside [0, 2)");
  const std::vector<BlockPair> bad_src = {{4, 0}};
  EXPECT_EQ(SwapBlocks({}, d_gpu.view(), host.view(), bad_src).message,
            "SwapBlocks: pairs[0].src = 4 is outside [0, 4)");
}

// 8 layers' K and V caches (16) swapped out to pinned host caches and back in, in one call each:
// the 6 pairs form 3 runs of consecutive block ids once sorted, so 3 copies per cache; every
// cache bit-equal to the CPU op's.
TEST_F(CudaSwapBlocks, AllCachesInOneCallWithRunsCoalesced) {
  std::mt19937 rng(803);
  constexpr int kCaches = 16;
  const std::vector<BlockPair> out_pairs = {{10, 7}, {4, 1}, {0, 11}, {3, 0}, {11, 8}, {5, 2}};
  const std::vector<BlockPair> in_pairs = {{7, 15}, {8, 16}, {11, 19}, {0, 1}, {1, 2}, {2, 3}};
  std::vector<HostTensor> gpu_want, cpu_want;
  std::vector<DeviceTensor> d_gpu;
  std::vector<std::unique_ptr<PinnedTensor>> pinned;
  std::vector<TensorView> gw, cw, dg, pc;
  for (int i = 0; i < kCaches; ++i) {
    gpu_want.push_back(Random({20, 4, 1, 8}, rng));
    cpu_want.push_back(Random({12, 4, 1, 8}, rng));
    d_gpu.emplace_back(gpu_want.back());
    pinned.push_back(std::make_unique<PinnedTensor>(cpu_want.back()));
  }
  for (int i = 0; i < kCaches; ++i) {
    gw.push_back(gpu_want[i].view());
    cw.push_back(cpu_want[i].view());
    dg.push_back(d_gpu[i].view());
    pc.push_back(pinned[i]->view());
  }
  ASSERT_TRUE(SwapBlocks({}, gw, cw, out_pairs).ok());
  NodeCounts counts = CaptureAndRun([&](cudaStream_t stream) {
    OpContext ctx;
    ctx.stream = stream;
    const OpStatus s = SwapBlocks(ctx, dg, pc, out_pairs);
    EXPECT_TRUE(s.ok()) << s.message;
  });
  EXPECT_EQ(counts.memcpys, 3u * kCaches);
  EXPECT_EQ(counts.kernels, 0u);
  for (int i = 0; i < kCaches; ++i) EXPECT_TRUE(BitEqual(pinned[i]->Copy(), cpu_want[i])) << i;
  // Back in: runs 7-8 -> 15-16, 11 -> 19, 0-2 -> 1-3.
  ASSERT_TRUE(SwapBlocks({}, cw, gw, in_pairs).ok());
  counts = CaptureAndRun([&](cudaStream_t stream) {
    OpContext ctx;
    ctx.stream = stream;
    const OpStatus s = SwapBlocks(ctx, pc, dg, in_pairs);
    EXPECT_TRUE(s.ok()) << s.message;
  });
  EXPECT_EQ(counts.memcpys, 3u * kCaches);
  for (int i = 0; i < kCaches; ++i) EXPECT_TRUE(BitEqual(d_gpu[i].Download(), gpu_want[i])) << i;
}

TEST_F(CudaSwapBlocks, SpansMustMatch) {
  std::mt19937 rng(804);
  DeviceTensor a(Random({4, 4, 1, 8}, rng)), b(Random({4, 4, 1, 8}, rng));
  HostTensor h = Random({4, 4, 1, 8}, rng);
  HostTensor h16 = ToHalf(h, DType::kBF16);
  const std::vector<TensorView> two = {a.view(), b.view()}, one = {h.view()};
  EXPECT_EQ(SwapBlocks({}, two, one, {}).message, "SwapBlocks: src has 2 caches but dst has 1");
  const std::vector<TensorView> mixed = {h.view(), h16.view()};
  EXPECT_EQ(SwapBlocks({}, two, mixed, {}).message,
            "SwapBlocks: dst[1]: expected f32 [4, 4, 1, 8], got bf16 [4, 4, 1, 8] on cpu");
  const std::vector<TensorView> devices = {h.view(), a.view()};
  EXPECT_EQ(SwapBlocks({}, two, devices, {}).message,
            "SwapBlocks: dst[1]: on cuda:0 but dst[0] is on cpu");
}

}  // namespace
}  // namespace llm::ops
