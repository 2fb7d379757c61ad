// CopyBlocks on CUDA against the CPU op: bit-equal caches, two layers and many (one arena: one
// launch per 256 pairs, observed as graph nodes).
#include <algorithm>
#include <numeric>
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

class CudaCopyBlocks : public CudaTest {};

TEST_F(CudaCopyBlocks, MatchesCpuOnEveryLayer) {
  std::mt19937 rng(701);
  constexpr int kLayers = 2;
  for (const int64_t block_size : {16, 32}) {
    std::vector<HostTensor> host;
    std::vector<DeviceTensor> device;
    for (int i = 0; i < 2 * kLayers; ++i) {  // key 0, value 0, key 1, value 1
      host.push_back(Random({9, block_size, 8, 128}, rng));
      device.emplace_back(host.back());
    }
    std::vector<TensorView> hk, hv, dk, dv;
    for (int l = 0; l < kLayers; ++l) {
      hk.push_back(host[2 * l].view());
      hv.push_back(host[2 * l + 1].view());
      dk.push_back(device[2 * l].view());
      dv.push_back(device[2 * l + 1].view());
    }
    const std::vector<BlockPair> pairs = {{0, 8}, {3, 1}, {5, 5}, {8, 2}};
    ASSERT_TRUE(CopyBlocks({}, hk, hv, pairs).ok());
    const OpStatus s = CopyBlocks({}, dk, dv, pairs);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(Sync(), "");
    for (int i = 0; i < 2 * kLayers; ++i) EXPECT_TRUE(BitEqual(device[i].Download(), host[i])) << i;
  }
}

// f16 / bf16 caches copy whole blocks too: the CPU op on the f32 values, converted, is the
// reference.
TEST_F(CudaCopyBlocks, HalfCachesMatchCpu) {
  std::mt19937 rng(703);
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    HostTensor k = RoundedThroughHalf(Random({7, 16, 8, 64}, rng), dtype);
    HostTensor v = RoundedThroughHalf(Random({7, 16, 8, 64}, rng), dtype);
    DeviceTensor dk(ToHalf(k, dtype)), dv(ToHalf(v, dtype));
    const std::vector<BlockPair> pairs = {{6, 0}, {1, 3}};
    const std::vector<TensorView> hks = {k.view()}, hvs = {v.view()};
    const std::vector<TensorView> dks = {dk.view()}, dvs = {dv.view()};
    ASSERT_TRUE(CopyBlocks({}, hks, hvs, pairs).ok());
    const OpStatus s = CopyBlocks({}, dks, dvs, pairs);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(Sync(), "");
    EXPECT_TRUE(BitEqual(dk.Download(), ToHalf(k, dtype))) << DTypeName(dtype);
    EXPECT_TRUE(BitEqual(dv.Download(), ToHalf(v, dtype))) << DTypeName(dtype);
  }
}

TEST_F(CudaCopyBlocks, BlockOutsideTheCacheIsAnError) {
  std::mt19937 rng(702);
  DeviceTensor k(Random({4, 16, 1, 64}, rng)), v(Random({4, 16, 1, 64}, rng));
  const std::vector<TensorView> ks = {k.view()}, vs = {v.view()};
  const std::vector<BlockPair> pairs = {{0, 1}, {2, 4}};
  EXPECT_EQ(CopyBlocks({}, ks, vs, pairs).message,
            "CopyBlocks: pairs[1] = (2, 4) is outside [0, 4)");
}

// All layers' caches as views of one device allocation, cache i at `offsets[i]` bytes.
struct Arena {
  void* data = nullptr;
  std::vector<TensorView> keys, values;
  Arena(const std::vector<HostTensor>& caches, const std::vector<size_t>& offsets, size_t bytes) {
    EXPECT_EQ(cudaMalloc(&data, bytes), cudaSuccess);
    for (size_t i = 0; i < caches.size(); ++i) {
      TensorView v = caches[i].view();
      v.data = static_cast<char*>(data) + offsets[i];
      v.device = TensorDevice::Cuda(0);
      EXPECT_EQ(cudaMemcpy(v.data, caches[i].view().data, v.nbytes(), cudaMemcpyHostToDevice),
                cudaSuccess);
      (i % 2 == 0 ? keys : values).push_back(v);  // K0, V0, K1, V1, ...
    }
  }
  ~Arena() { cudaFree(data); }
  HostTensor Download(const TensorView& v) const {
    HostTensor h(v.dtype, std::span<const int64_t>(v.shape.data(), v.ndim));
    EXPECT_EQ(cudaMemcpy(h.view().data, v.data, v.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

// 16 layers, 300 pairs (two chunks of at most 256): caches in one arena at a uniform stride take
// one launch per chunk for all 32 caches; at irregular offsets, one per cache per chunk. Either
// way every cache matches the CPU op bit for bit (f32 with 16-byte words; bf16 blocks of 30
// bytes, copied in 2-byte words).
TEST_F(CudaCopyBlocks, ManyLayersInOneLaunchPerChunkFromAnArena) {
  std::mt19937 rng(704);
  constexpr int kLayers = 16;
  constexpr int64_t kBlocks = 700;
  std::vector<int64_t> ids(kBlocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<BlockPair> pairs;
  for (int i = 0; i < 300; ++i) pairs.push_back({ids[i], ids[300 + i]});  // distinct blocks
  pairs.push_back({ids[650], ids[650]});                                  // a no-op
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    const std::vector<int64_t> shape = dtype == DType::kF32
                                           ? std::vector<int64_t>{kBlocks, 4, 1, 8}
                                           : std::vector<int64_t>{kBlocks, 3, 1, 5};
    for (const bool uniform : {true, false}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << ", uniform " << uniform);
      std::vector<HostTensor> host;
      std::vector<TensorView> hk, hv;
      for (int i = 0; i < 2 * kLayers; ++i) {
        HostTensor t = Random({shape[0], shape[1], shape[2], shape[3]}, rng);
        host.push_back(dtype == DType::kF32 ? std::move(t)
                                            : ToHalf(RoundedThroughHalf(t, dtype), dtype));
        (i % 2 == 0 ? hk : hv).push_back(host.back().view());
      }
      const size_t cache_bytes = host[0].view().nbytes();
      std::vector<size_t> offsets;
      size_t end = 0;
      for (int i = 0; i < 2 * kLayers; ++i) {
        offsets.push_back(uniform ? i * (cache_bytes + 64) : end);
        end = offsets.back() + cache_bytes + (uniform ? 64 : 32 * (i % 3 + 1));
      }
      Arena arena(host, offsets, end + 64);
      // The CPU reference on f32 values (the bf16 caches through f32).
      std::vector<HostTensor> want;
      std::vector<TensorView> wk, wv;
      for (int i = 0; i < 2 * kLayers; ++i) {
        want.push_back(dtype == DType::kF32 ? Clone(host[i]) : gpu_testing::HalfToF32(host[i]));
        (i % 2 == 0 ? wk : wv).push_back(want.back().view());
      }
      ASSERT_TRUE(CopyBlocks({}, wk, wv, pairs).ok());
      const NodeCounts counts = CaptureAndRun([&](cudaStream_t stream) {
        OpContext ctx;
        ctx.stream = stream;
        const OpStatus s = CopyBlocks(ctx, arena.keys, arena.values, pairs);
        EXPECT_TRUE(s.ok()) << s.message;
      });
      EXPECT_EQ(counts.kernels, uniform ? 2u : 2u * 2 * kLayers);
      EXPECT_EQ(counts.memcpys, 0u);
      for (int l = 0; l < kLayers; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
          const TensorView& got = kv == 0 ? arena.keys[l] : arena.values[l];
          const HostTensor& w = want[2 * l + kv];
          HostTensor expected = dtype == DType::kF32 ? Clone(w) : ToHalf(w, dtype);
          EXPECT_TRUE(BitEqual(arena.Download(got), expected)) << "layer " << l << ", kv " << kv;
        }
      }
    }
  }
}

// A block written by one pair and read by a later one: the pairs run in order, as on the CPU
// (a cudaMemcpyAsync per pair and cache instead of the concurrent kernel).
TEST_F(CudaCopyBlocks, DependentPairsRunInOrder) {
  std::mt19937 rng(705);
  HostTensor k = Random({6, 16, 1, 64}, rng), v = Random({6, 16, 1, 64}, rng);
  DeviceTensor dk(k), dv(v);
  const std::vector<BlockPair> pairs = {{0, 1}, {1, 2}, {3, 1}};
  const std::vector<TensorView> hks = {k.view()}, hvs = {v.view()};
  const std::vector<TensorView> dks = {dk.view()}, dvs = {dv.view()};
  ASSERT_TRUE(CopyBlocks({}, hks, hvs, pairs).ok());
  const NodeCounts counts = CaptureAndRun([&](cudaStream_t stream) {
    OpContext ctx;
    ctx.stream = stream;
    EXPECT_TRUE(CopyBlocks(ctx, dks, dvs, pairs).ok());
  });
  EXPECT_EQ(counts.kernels, 0u);
  EXPECT_EQ(counts.memcpys, 6u);
  EXPECT_TRUE(BitEqual(dk.Download(), k));
  EXPECT_TRUE(BitEqual(dv.Download(), v));
}

}  // namespace
}  // namespace llm::ops
