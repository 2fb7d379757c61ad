// RotaryEmbedding on CUDA against the CPU op: full and partial rotary dims, no scaling,
// linear and llama3 scaling, positions up to 131071. Tolerance: atol 2e-6, rtol 1e-5 (both
// compute the angles and their cos / sin in double; the GPU may fuse the float rotation into
// FMAs).
#include <algorithm>
#include <cmath>
#include <random>

#include "tests/gpu/gpu_test_util.h"

namespace llm::ops {
namespace {

using gpu_testing::Close;
using gpu_testing::CudaTest;
using gpu_testing::DeviceTensor;
using gpu_testing::Indices;
using gpu_testing::Random;

class CudaRotaryEmbedding : public CudaTest {};

// ComputeRopeCosSinCache's table for `config` (rotary_dim set), f32 [max_position, rotary_dim].
HostTensor CosSinTable(const RopeConfig& config, int64_t max_position) {
  std::vector<float> table(max_position * config.rotary_dim);
  EXPECT_TRUE(ComputeRopeCosSinCache(config, max_position, table).ok());
  HostTensor h_table(DType::kF32, {max_position, config.rotary_dim});
  std::copy(table.begin(), table.end(), h_table.data<float>());
  return h_table;
}

struct Shape {
  int64_t num_heads, num_kv_heads, head_size;
  int rotary_dim;  // 0 = head_size
};

TEST_F(CudaRotaryEmbedding, MatchesCpuForEveryShapeScalingAndTokenCount) {
  std::mt19937 rng(401);
  RopeConfig llama3;
  llama3.theta = 500000.0;
  llama3.scaling = {RopeScaling::Type::kLlama3, 8.0, 1.0, 4.0, 8192};
  RopeConfig linear;
  linear.scaling.type = RopeScaling::Type::kLinear;
  linear.scaling.factor = 4.0;
  for (const Shape shape : {Shape{32, 8, 128, 0}, Shape{8, 8, 64, 32}, Shape{4, 1, 128, 64}}) {
    for (RopeConfig config : {RopeConfig{}, linear, llama3}) {
      config.rotary_dim = shape.rotary_dim;
      for (const int64_t num_tokens : gpu_testing::kTokenCounts) {
        const DType index_type = num_tokens % 2 == 0 ? DType::kI64 : DType::kI32;
        SCOPED_TRACE(::testing::Message()
                     << "heads " << shape.num_heads << "/" << shape.num_kv_heads << ", head "
                     << shape.head_size << ", rotary_dim " << shape.rotary_dim << ", scaling "
                     << static_cast<int>(config.scaling.type) << ", tokens " << num_tokens);
        std::vector<int64_t> pos(num_tokens);
        std::uniform_int_distribution<int64_t> pos_dist(0, 131071);
        for (int64_t& p : pos) p = pos_dist(rng);
        pos[0] = 0;
        HostTensor positions = Indices(pos, index_type);
        HostTensor q = Random({num_tokens, shape.num_heads, shape.head_size}, rng);
        HostTensor k = Random({num_tokens, shape.num_kv_heads, shape.head_size}, rng);
        DeviceTensor d_pos(positions), d_q(q), d_k(k);
        ASSERT_TRUE(RotaryEmbedding({}, positions.view(), q.view(), k.view(), config).ok());
        const OpStatus s = RotaryEmbedding({}, d_pos.view(), d_q.view(), d_k.view(), config);
        ASSERT_TRUE(s.ok()) << s.message;
        ASSERT_EQ(Sync(), "");
        EXPECT_TRUE(Close(d_q.Download(), q, 2e-6, 1e-5));
        EXPECT_TRUE(Close(d_k.Download(), k, 2e-6, 1e-5));
      }
    }
  }
}

// 16-bit query and key: the CPU op on the same values as f32. The GPU rotates in fp32 and rounds
// each result once: rtol 2^-8 (bf16) / 2^-11 (f16) of the result, plus the fp32 bound above
// (atol covers rounded results near 0 after cancellation: |x1 cos - x2 sin| small).
TEST_F(CudaRotaryEmbedding, HalfMatchesCpuOnTheRoundedInputs) {
  std::mt19937 rng(402);
  RopeConfig config;
  config.theta = 500000.0;
  config.rotary_dim = 64;
  const int64_t max_position = 4096;
  const HostTensor h_table = CosSinTable(config, max_position);
  DeviceTensor d_table(h_table);
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const double rtol = gpu_testing::HalfRtol(dtype);
    for (const bool cached : {false, true}) {
      for (const int64_t num_tokens : {int64_t{1}, int64_t{17}}) {
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(dtype) << ", cached " << cached << ", tokens " << num_tokens);
        std::vector<int64_t> pos(num_tokens);
        std::uniform_int_distribution<int64_t> pos_dist(0, max_position - 1);
        for (int64_t& p : pos) p = pos_dist(rng);
        HostTensor positions = Indices(pos, DType::kI64);
        HostTensor q = gpu_testing::RoundedThroughHalf(Random({num_tokens, 8, 128}, rng), dtype);
        HostTensor k = gpu_testing::RoundedThroughHalf(Random({num_tokens, 2, 128}, rng), dtype);
        DeviceTensor d_pos(positions), d_q(gpu_testing::ToHalf(q, dtype));
        DeviceTensor d_k(gpu_testing::ToHalf(k, dtype));
        OpStatus s =
            cached ? RotaryEmbeddingCached({}, positions.view(), q.view(), k.view(), h_table.view())
                   : RotaryEmbedding({}, positions.view(), q.view(), k.view(), config);
        ASSERT_TRUE(s.ok()) << s.message;
        s = cached ? RotaryEmbeddingCached({}, d_pos.view(), d_q.view(), d_k.view(), d_table.view())
                   : RotaryEmbedding({}, d_pos.view(), d_q.view(), d_k.view(), config);
        ASSERT_TRUE(s.ok()) << s.message;
        ASSERT_EQ(Sync(), "");
        EXPECT_TRUE(Close(gpu_testing::HalfToF32(d_q.Download()), q, 1e-5, rtol + 1e-5));
        EXPECT_TRUE(Close(gpu_testing::HalfToF32(d_k.Download()), k, 1e-5, rtol + 1e-5));
      }
    }
  }
}

// The table lookup against the computed angles, on the CPU (the f32 table holds the same
// double-computed cos / sin, rounded once: equal up to the f32 rotation, 1e-5) and the CUDA
// op against the CPU op (same table, same fp32 rotation: 2e-6 + 1e-5 relative, as above).
TEST_F(CudaRotaryEmbedding, CachedMatchesComputedAndCudaMatchesCpu) {
  std::mt19937 rng(403);
  RopeConfig config;
  config.theta = 500000.0;
  config.scaling = {RopeScaling::Type::kLlama3, 8.0, 1.0, 4.0, 8192};
  for (const Shape shape : {Shape{32, 8, 128, 128}, Shape{4, 1, 128, 64}}) {
    config.rotary_dim = shape.rotary_dim;
    const int64_t max_position = 131072;
    const HostTensor h_table = CosSinTable(config, max_position);
    DeviceTensor d_table(h_table);
    for (const int64_t num_tokens : gpu_testing::kTokenCounts) {
      SCOPED_TRACE(::testing::Message()
                   << "rotary_dim " << shape.rotary_dim << ", tokens " << num_tokens);
      std::vector<int64_t> pos(num_tokens);
      std::uniform_int_distribution<int64_t> pos_dist(0, max_position - 1);
      for (int64_t& p : pos) p = pos_dist(rng);
      pos[0] = max_position - 1;
      HostTensor positions = Indices(pos, num_tokens % 2 == 0 ? DType::kI64 : DType::kI32);
      HostTensor q = Random({num_tokens, shape.num_heads, shape.head_size}, rng);
      HostTensor k = Random({num_tokens, shape.num_kv_heads, shape.head_size}, rng);
      HostTensor q2 = gpu_testing::Clone(q), k2 = gpu_testing::Clone(k);
      DeviceTensor d_pos(positions), d_q(q), d_k(k);
      ASSERT_TRUE(RotaryEmbedding({}, positions.view(), q.view(), k.view(), config).ok());
      const OpStatus cpu =
          RotaryEmbeddingCached({}, positions.view(), q2.view(), k2.view(), h_table.view());
      ASSERT_TRUE(cpu.ok()) << cpu.message;
      EXPECT_TRUE(Close(q2, q, 1e-5, 0.0));
      EXPECT_TRUE(Close(k2, k, 1e-5, 0.0));
      const OpStatus s =
          RotaryEmbeddingCached({}, d_pos.view(), d_q.view(), d_k.view(), d_table.view());
      ASSERT_TRUE(s.ok()) << s.message;
      ASSERT_EQ(Sync(), "");
      EXPECT_TRUE(Close(d_q.Download(), q2, 2e-6, 1e-5));
      EXPECT_TRUE(Close(d_k.Download(), k2, 2e-6, 1e-5));
    }
  }
}

// A position outside the table: an error on the CPU; on CUDA (no synchronization to check it)
// a NaN row for that token's query and key heads, the other tokens still right.
// The model's q and k: token-strided views of the q and k columns of fused qkv rows (the v
// columns and a pad after them poisoned), f32, bf16 and f16, computed and cached angles: the same
// bytes as the contiguous tensors rotated on the device (which the tests above compare with the
// CPU op), and nothing else written.
TEST_F(CudaRotaryEmbedding, TokenStridedViewsOfQkvRowsRotateInPlace) {
  std::mt19937 rng(405);
  const int64_t hq = 8, hkv = 2, d = 128, row = (hq + 2 * hkv) * d + 8;
  RopeConfig config;
  config.theta = 500000.0;
  config.rotary_dim = 64;
  const int64_t max_position = 4096;
  const HostTensor h_table = CosSinTable(config, max_position);
  DeviceTensor d_table(h_table);
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const bool cached : {false, true}) {
      for (const int64_t num_tokens : {int64_t{1}, int64_t{17}}) {
        SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << (cached ? ", cached" : "")
                                          << ", tokens " << num_tokens);
        auto in_dtype = [dtype](const HostTensor& t) {
          return dtype == DType::kF32 ? gpu_testing::Clone(t) : gpu_testing::ToHalf(t, dtype);
        };
        std::vector<int64_t> pos(num_tokens);
        std::uniform_int_distribution<int64_t> pos_dist(0, max_position - 1);
        for (int64_t& p : pos) p = pos_dist(rng);
        HostTensor positions = Indices(pos, DType::kI32);
        HostTensor q = in_dtype(Random({num_tokens, hq, d}, rng));
        HostTensor k = in_dtype(Random({num_tokens, hkv, d}, rng));
        HostTensor qkv = testing::PoisonedRows(dtype, num_tokens, row);
        testing::PutHeads(qkv, 0, q);
        testing::PutHeads(qkv, hq * d, k);
        DeviceTensor d_pos(positions), d_q(q), d_k(k), d_qkv(qkv);
        const TensorView q_view = testing::HeadsView(d_qkv.view(), 0, hq, d);
        const TensorView k_view = testing::HeadsView(d_qkv.view(), hq * d, hkv, d);
        OpStatus strided, contiguous;
        if (cached) {
          strided = RotaryEmbeddingCached({}, d_pos.view(), q_view, k_view, d_table.view());
          contiguous =
              RotaryEmbeddingCached({}, d_pos.view(), d_q.view(), d_k.view(), d_table.view());
        } else {
          strided = RotaryEmbedding({}, d_pos.view(), q_view, k_view, config);
          contiguous = RotaryEmbedding({}, d_pos.view(), d_q.view(), d_k.view(), config);
        }
        ASSERT_TRUE(strided.ok()) << strided.message;
        ASSERT_TRUE(contiguous.ok()) << contiguous.message;
        ASSERT_EQ(Sync(), "");
        HostTensor want = testing::PoisonedRows(dtype, num_tokens, row);
        testing::PutHeads(want, 0, d_q.Download());
        testing::PutHeads(want, hq * d, d_k.Download());
        EXPECT_TRUE(gpu_testing::BitEqual(d_qkv.Download(), want));
      }
    }
  }
}

TEST_F(CudaRotaryEmbedding, CachedPositionOutsideTheTable) {
  std::mt19937 rng(404);
  RopeConfig config;
  config.rotary_dim = 64;
  const HostTensor h_table = CosSinTable(config, 10);
  HostTensor positions = Indices({3, 10, 9}, DType::kI32);
  HostTensor q = Random({3, 2, 64}, rng), k = Random({3, 1, 64}, rng);
  EXPECT_EQ(RotaryEmbeddingCached({}, positions.view(), q.view(), k.view(), h_table.view()).message,
            "RotaryEmbeddingCached: positions[1] = 10 is outside the cos_sin_cache's [0, 10)");
  HostTensor good = Indices({3, 3, 9}, DType::kI32);
  HostTensor q_want = gpu_testing::Clone(q), k_want = gpu_testing::Clone(k);
  ASSERT_TRUE(
      RotaryEmbeddingCached({}, good.view(), q_want.view(), k_want.view(), h_table.view()).ok());
  DeviceTensor d_pos(positions), d_q(q), d_k(k), d_table(h_table);
  ASSERT_TRUE(RotaryEmbeddingCached({}, d_pos.view(), d_q.view(), d_k.view(), d_table.view()).ok());
  ASSERT_EQ(Sync(), "");
  HostTensor got_q = d_q.Download(), got_k = d_k.Download();
  for (int64_t t = 0; t < 3; ++t) {
    for (int64_t j = 0; j < 2 * 64; ++j) {
      const float g = got_q.data<float>()[t * 128 + j];
      if (t == 1) {
        EXPECT_TRUE(std::isnan(g));
      } else {
        EXPECT_NEAR(g, q_want.data<float>()[t * 128 + j], 2e-6);
      }
    }
    for (int64_t j = 0; j < 64; ++j) {
      const float g = got_k.data<float>()[t * 64 + j];
      if (t == 1) {
        EXPECT_TRUE(std::isnan(g));
      } else {
        EXPECT_NEAR(g, k_want.data<float>()[t * 64 + j], 2e-6);
      }
    }
  }
}

TEST(CudaRotaryEmbeddingArgs, CachedArgumentsAreChecked) {
  HostTensor positions = Indices({0}, DType::kI32);
  HostTensor q(DType::kBF16, {1, 2, 64}), k(DType::kF16, {1, 1, 64}), k32(DType::kF32, {1, 1, 64});
  HostTensor table(DType::kF32, {8, 64}), odd(DType::kF32, {8, 63}), wide(DType::kF32, {8, 128});
  HostTensor table16(DType::kBF16, {8, 64}), q32(DType::kF32, {1, 2, 64});
  EXPECT_EQ(RotaryEmbeddingCached({}, positions.view(), q.view(), k.view(), table.view()).message,
            "RotaryEmbeddingCached: key: expected bf16 [1, ?, 64], got f16 [1, 1, 64] on cpu");
  EXPECT_EQ(
      RotaryEmbeddingCached({}, positions.view(), q32.view(), k32.view(), table16.view()).message,
      "RotaryEmbeddingCached: cos_sin_cache: expected f32 [?, ?], got bf16 [8, 64] on cpu");
  EXPECT_EQ(
      RotaryEmbeddingCached({}, positions.view(), q32.view(), k32.view(), odd.view()).message,
      "RotaryEmbeddingCached: cos_sin_cache: rotary_dim (its second dim) must be even, > 0 and "
      "<= head size 64, got f32 [8, 63] on cpu");
  EXPECT_FALSE(
      RotaryEmbeddingCached({}, positions.view(), q32.view(), k32.view(), wide.view()).ok());
  std::vector<float> out(8 * 64);
  RopeConfig config;
  EXPECT_EQ(ComputeRopeCosSinCache(config, 8, out).message,
            "ComputeRopeCosSinCache: config.rotary_dim must be even and > 0, got 0");
  config.rotary_dim = 64;
  EXPECT_EQ(
      ComputeRopeCosSinCache(config, 9, out).message,
      "ComputeRopeCosSinCache: out: expected max_position * rotary_dim = 576 floats, got 512");
}

}  // namespace
}  // namespace llm::ops
