// HeadRmsNorm on CUDA against the CPU op, in place on q and k as token-strided views into fused
// qkv rows (and on a contiguous [T, H, D]), f32, bf16 and f16. Tolerance: RmsNorm's, atol 1e-5,
// rtol 1e-5 (the GPU sums squares in fp32 over a warp, the CPU in double; inputs in [-1, 1]);
// 16-bit: the CPU op on the same 16-bit inputs as f32, plus the one output rounding (HalfRtol).
// The v columns of the rows (never normalized) must keep their bits.
#include <cstring>
#include <random>

#include "tests/gpu/gpu_test_util.h"

namespace llm::ops {
namespace {

using gpu_testing::Clone;
using gpu_testing::Close;
using gpu_testing::CudaTest;
using gpu_testing::DeviceTensor;
using gpu_testing::Random;

constexpr double kAtol = 1e-5, kRtol = 1e-5;
constexpr float kEps = 1e-6f;

// rows [T, (hq + 2 hkv) d]: q = heads 0 .. hq - 1, k = the next hkv, v the last hkv (hkv = 0:
// rows are a contiguous [T, hq, d]). Normalizes q (and k) on cpu and cuda and compares.
class CudaHeadRmsNorm : public CudaTest {
 protected:
  static void CheckQkv(DType dtype, int64_t tokens, int64_t hq, int64_t hkv, int64_t d,
                       std::mt19937& rng);
};

void CudaHeadRmsNorm::CheckQkv(DType dtype, int64_t tokens, int64_t hq, int64_t hkv, int64_t d,
                               std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << ", " << tokens << " tokens, q " << hq
                                    << ", kv " << hkv << " heads of " << d);
  const int64_t row = (hq + 2 * hkv) * d, normed = (hq + hkv) * d;
  auto maybe_round = [dtype](HostTensor t) {
    return dtype == DType::kF32 ? std::move(t) : gpu_testing::RoundedThroughHalf(t, dtype);
  };
  auto to_device = [dtype](const HostTensor& t) {
    return dtype == DType::kF32 ? DeviceTensor(t) : DeviceTensor(gpu_testing::ToHalf(t, dtype));
  };
  HostTensor rows = maybe_round(Random({tokens, row}, rng));
  HostTensor wq = maybe_round(Random({d}, rng, 0.5f, 1.5f));
  HostTensor wk = maybe_round(Random({d}, rng, 0.5f, 1.5f));
  DeviceTensor d_rows = to_device(rows), d_wq = to_device(wq), d_wk = to_device(wk);
  const HostTensor uploaded = d_rows.Download();

  HostTensor want = Clone(rows);
  ASSERT_TRUE(HeadRmsNorm({}, testing::HeadsView(want.view(), 0, hq, d), wq.view(), kEps).ok());
  OpStatus s = HeadRmsNorm({}, testing::HeadsView(d_rows.view(), 0, hq, d), d_wq.view(), kEps);
  ASSERT_TRUE(s.ok()) << s.message;
  if (hkv > 0) {
    ASSERT_TRUE(
        HeadRmsNorm({}, testing::HeadsView(want.view(), hq * d, hkv, d), wk.view(), kEps).ok());
    s = HeadRmsNorm({}, testing::HeadsView(d_rows.view(), hq * d, hkv, d), d_wk.view(), kEps);
    ASSERT_TRUE(s.ok()) << s.message;
  }
  ASSERT_EQ(Sync(), "");
  const HostTensor got_raw = d_rows.Download();
  const HostTensor got = dtype == DType::kF32 ? Clone(got_raw) : gpu_testing::HalfToF32(got_raw);

  // q and k against the CPU op; v bit for bit as uploaded.
  HostTensor got_n(DType::kF32, {tokens, normed}), want_n(DType::kF32, {tokens, normed});
  const size_t esize = DTypeSize(dtype);
  for (int64_t t = 0; t < tokens; ++t) {
    std::memcpy(got_n.data<float>() + t * normed, got.data<float>() + t * row,
                normed * sizeof(float));
    std::memcpy(want_n.data<float>() + t * normed, want.data<float>() + t * row,
                normed * sizeof(float));
    const size_t v_offset = (t * row + normed) * esize, v_bytes = (row - normed) * esize;
    ASSERT_EQ(std::memcmp(static_cast<const char*>(got_raw.view().data) + v_offset,
                          static_cast<const char*>(uploaded.view().data) + v_offset, v_bytes),
              0)
        << "token " << t << ": v changed";
  }
  const double rtol = dtype == DType::kF32 ? kRtol : gpu_testing::HalfRtol(dtype) + kRtol;
  EXPECT_TRUE(Close(got_n, want_n, kAtol, rtol));
}

TEST_F(CudaHeadRmsNorm, TokenStridedQAndKMatchCpuF32) {
  std::mt19937 rng(401);
  for (const int64_t d : {64, 128, 256}) {
    for (const int64_t tokens : gpu_testing::kTokenCounts) {
      CheckQkv(DType::kF32, tokens, 4, 2, d, rng);
    }
  }
  CheckQkv(DType::kF32, 15, 3, 1, 17, rng);  // a head size that is no multiple of 32
}

TEST_F(CudaHeadRmsNorm, ContiguousMatchesCpuF32) {
  std::mt19937 rng(402);
  for (const int64_t tokens : {int64_t{1}, int64_t{17}, int64_t{1000}}) {
    CheckQkv(DType::kF32, tokens, 8, 0, 128, rng);
  }
  CheckQkv(DType::kF32, 3, 5, 0, 1, rng);  // head size 1: x / sqrt(x^2 + eps) * w
}

TEST_F(CudaHeadRmsNorm, HalfMatchesCpuOnTheRoundedInputs) {
  std::mt19937 rng(403);
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const int64_t d : {128, 256}) {
      for (const int64_t tokens : {int64_t{1}, int64_t{17}}) {
        CheckQkv(dtype, tokens, 4, 2, d, rng);
      }
    }
    CheckQkv(dtype, 17, 8, 0, 128, rng);
  }
}

// SumOfSquares and RmsNormBySums (OLMoE's norm split over ranks) on CUDA against the CPU ops, on
// the q heads of fused qkv rows, f32, bf16 and f16: the sums within RmsNorm's tolerance, the
// normalized q within it (16-bit: plus the output rounding), k and v keeping their bits.
TEST_F(CudaHeadRmsNorm, SumsAndNormBySumsMatchCpu) {
  std::mt19937 rng(404);
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const int64_t tokens : {int64_t{1}, int64_t{17}, int64_t{300}}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << ", " << tokens << " tokens");
      const int64_t hq = 4, d = 64, row = 8 * d, q_row = hq * d;
      HostTensor rows = Random({tokens, row}, rng);
      HostTensor w = Random({q_row}, rng, 0.5f, 1.5f);
      if (dtype != DType::kF32) {
        rows = gpu_testing::RoundedThroughHalf(rows, dtype);
        w = gpu_testing::RoundedThroughHalf(w, dtype);
      }
      auto to_device = [dtype](const HostTensor& t) {
        return dtype == DType::kF32 ? DeviceTensor(t) : DeviceTensor(gpu_testing::ToHalf(t, dtype));
      };
      DeviceTensor d_rows = to_device(rows), d_w = to_device(w);
      DeviceTensor d_sums(HostTensor(DType::kF32, {tokens}));
      const HostTensor uploaded = d_rows.Download();
      HostTensor want = Clone(rows), want_sums(DType::kF32, {tokens});
      const TensorView q = testing::HeadsView(want.view(), 0, hq, d);
      ASSERT_TRUE(SumOfSquares({}, want_sums.view(), q).ok());
      ASSERT_TRUE(RmsNormBySums({}, q, want_sums.view(), w.view(), 2 * q_row, kEps).ok());
      const TensorView dq = testing::HeadsView(d_rows.view(), 0, hq, d);
      OpStatus s = SumOfSquares({}, d_sums.view(), dq);
      ASSERT_TRUE(s.ok()) << s.message;
      s = RmsNormBySums({}, dq, d_sums.view(), d_w.view(), 2 * q_row, kEps);
      ASSERT_TRUE(s.ok()) << s.message;
      ASSERT_EQ(Sync(), "");
      EXPECT_TRUE(Close(d_sums.Download(), want_sums, kAtol, kRtol));
      const HostTensor got_raw = d_rows.Download();
      const HostTensor got =
          dtype == DType::kF32 ? Clone(got_raw) : gpu_testing::HalfToF32(got_raw);
      const double rtol = dtype == DType::kF32 ? kRtol : gpu_testing::HalfRtol(dtype) + kRtol;
      EXPECT_TRUE(Close(got, want, kAtol, rtol));
      const size_t esize = DTypeSize(dtype);
      for (int64_t t = 0; t < tokens; ++t) {
        const size_t at = (t * row + q_row) * esize, bytes = (row - q_row) * esize;
        ASSERT_EQ(std::memcmp(static_cast<const char*>(got_raw.view().data) + at,
                              static_cast<const char*>(uploaded.view().data) + at, bytes),
                  0)
            << "token " << t << ": k or v changed";
      }
    }
  }
}

TEST(CudaHeadRmsNormArgs, WeightMustHaveXsDtypeAndHeadSize) {
  HostTensor qkv(DType::kBF16, {2, 8 * 64}), w32(DType::kF32, {64}), w16(DType::kBF16, {32});
  TensorView rows = qkv.view(), cw32 = w32.view(), cw16 = w16.view();
  rows.device = cw32.device = cw16.device = TensorDevice::Cuda(0);
  const TensorView q = testing::HeadsView(rows, 0, 4, 64);
  EXPECT_EQ(HeadRmsNorm({}, q, cw32, kEps).message,
            "HeadRmsNorm: weight: expected bf16 [64], got f32 [64] on cuda:0");
  EXPECT_EQ(HeadRmsNorm({}, q, cw16, kEps).message,
            "HeadRmsNorm: weight: expected bf16 [64], got bf16 [32] on cuda:0");
  HostTensor w(DType::kBF16, {64});
  EXPECT_EQ(HeadRmsNorm({}, q, w.view(), kEps).message,
            "HeadRmsNorm: weight: on cpu but x is on cuda:0");
}

}  // namespace
}  // namespace llm::ops
