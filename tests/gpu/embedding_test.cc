// Embedding on CUDA against the CPU op: a gather, so bit-exact.
#include <cmath>
#include <random>

#include "tests/gpu/gpu_test_util.h"

namespace llm::ops {
namespace {

using gpu_testing::BitEqual;
using gpu_testing::CudaTest;
using gpu_testing::DeviceTensor;
using gpu_testing::Indices;
using gpu_testing::Poisoned;
using gpu_testing::Random;

class CudaEmbedding : public CudaTest {};

TEST_F(CudaEmbedding, MatchesCpuForEveryTokenCountHiddenSizeAndIndexType) {
  std::mt19937 rng(101);
  constexpr int64_t kVocab = 1000;
  for (const int64_t hidden : {64, 4097}) {
    HostTensor table = Random({kVocab, hidden}, rng);
    DeviceTensor d_table(table);
    for (const int64_t num_tokens : gpu_testing::kTokenCounts) {
      for (const DType index_type : {DType::kI32, DType::kI64}) {
        SCOPED_TRACE(::testing::Message() << "hidden " << hidden << ", tokens " << num_tokens
                                          << ", " << DTypeName(index_type));
        std::vector<int64_t> ids(num_tokens);
        std::uniform_int_distribution<int64_t> id_dist(0, kVocab - 1);
        for (int64_t& id : ids) id = id_dist(rng);
        ids[0] = kVocab - 1;  // the last row
        HostTensor h_ids = Indices(ids, index_type);
        HostTensor want = Poisoned({num_tokens, hidden});
        ASSERT_TRUE(Embedding({}, want.view(), h_ids.view(), table.view()).ok());
        DeviceTensor d_ids(h_ids), d_out(want);
        d_out.Poison();
        const OpStatus s = Embedding({}, d_out.view(), d_ids.view(), d_table.view());
        ASSERT_TRUE(s.ok()) << s.message;
        ASSERT_EQ(Sync(), "");
        EXPECT_TRUE(BitEqual(d_out.Download(), want));
      }
    }
  }
}

// The host cannot see device ids without a synchronization: a bad id gives a NaN row, and
// the other rows are still right.
TEST_F(CudaEmbedding, OutOfRangeIdGivesANanRowAndNothingElseChanges) {
  std::mt19937 rng(102);
  HostTensor table = Random({10, 32}, rng);
  HostTensor ids = Indices({3, 10, -1, 9}, DType::kI64);
  DeviceTensor d_table(table), d_ids(ids), d_out(Poisoned({4, 32}));
  d_out.Poison();
  ASSERT_TRUE(Embedding({}, d_out.view(), d_ids.view(), d_table.view()).ok());
  ASSERT_EQ(Sync(), "");
  HostTensor out = d_out.Download();
  for (int64_t h = 0; h < 32; ++h) {
    EXPECT_EQ(out.data<float>()[0 * 32 + h], table.data<float>()[3 * 32 + h]);
    EXPECT_TRUE(std::isnan(out.data<float>()[1 * 32 + h]));
    EXPECT_TRUE(std::isnan(out.data<float>()[2 * 32 + h]));
    EXPECT_EQ(out.data<float>()[3 * 32 + h], table.data<float>()[9 * 32 + h]);
  }
}

// Tensors on another device than the thread's current one are an error, not a fault.
TEST_F(CudaEmbedding, TensorsOnAnotherDeviceThanTheCurrentOneAreAnError) {
  std::mt19937 rng(103);
  DeviceTensor table(Random({10, 32}, rng)), ids(Indices({1, 2}, DType::kI32));
  DeviceTensor out(Poisoned({2, 32}));
  TensorView t = table.view(), i = ids.view(), o = out.view();
  t.device = i.device = o.device = TensorDevice::Cuda(1);
  EXPECT_EQ(Embedding({}, o, i, t).message,
            "Embedding: tensors are on cuda:1 but the calling thread's current device is cuda:0 "
            "(cudaSetDevice first)");
}

// bf16 / f16 tables: still a gather, bit for bit the CPU op's f32 rows rounded (exactly
// representable, so the rounding is the identity); an out-of-range id gives a 16-bit NaN row.
TEST_F(CudaEmbedding, HalfTablesAreCopiedBitForBit) {
  std::mt19937 rng(104);
  constexpr int64_t kVocab = 300;
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const int64_t hidden : {64, 4097}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << ", hidden " << hidden);
      HostTensor table = gpu_testing::RoundedThroughHalf(Random({kVocab, hidden}, rng), dtype);
      HostTensor ids = Indices({0, kVocab - 1, 17, kVocab, 5}, DType::kI32);
      std::vector<int64_t> good = {0, kVocab - 1, 17, 17, 5};  // row 3 checked separately
      HostTensor good_ids = Indices(good, DType::kI32);
      HostTensor want = Poisoned({5, hidden});
      ASSERT_TRUE(Embedding({}, want.view(), good_ids.view(), table.view()).ok());
      DeviceTensor d_table(gpu_testing::ToHalf(table, dtype)), d_ids(ids);
      DeviceTensor d_out(gpu_testing::ToHalf(want, dtype));
      d_out.Poison();
      const OpStatus s = Embedding({}, d_out.view(), d_ids.view(), d_table.view());
      ASSERT_TRUE(s.ok()) << s.message;
      ASSERT_EQ(Sync(), "");
      HostTensor got = gpu_testing::HalfToF32(d_out.Download());
      for (int64_t t : {0, 1, 2, 4}) {
        for (int64_t h = 0; h < hidden; ++h) {
          ASSERT_EQ(got.data<float>()[t * hidden + h], want.data<float>()[t * hidden + h])
              << "token " << t << ", h " << h;
        }
      }
      for (int64_t h = 0; h < hidden; ++h)
        ASSERT_TRUE(std::isnan(got.data<float>()[3 * hidden + h]));
    }
  }
}

TEST(CudaEmbeddingArgs, DtypesAreCheckedAndTheCpuBackendIsF32Only) {
  HostTensor table(DType::kBF16, {10, 4}), out32(DType::kF32, {2, 4}), out(DType::kBF16, {2, 4});
  HostTensor ids = gpu_testing::Indices({1, 2}, DType::kI32);
  TensorView ct = table.view(), co = out32.view(), ci = ids.view();
  ct.device = co.device = ci.device = TensorDevice::Cuda(0);
  EXPECT_EQ(Embedding({}, co, ci, ct).message,
            "Embedding: out: expected bf16 [2, 4], got f32 [2, 4] on cuda:0");
  EXPECT_EQ(Embedding({}, out.view(), ids.view(), table.view()).message,
            "Embedding: table: the CPU backend takes f32 only, got bf16 [10, 4] on cpu");
}

}  // namespace
}  // namespace llm::ops
