// RmsNorm and FusedAddRmsNorm on CUDA against the CPU ops. Tolerance: atol 1e-5, rtol 1e-5
// (the GPU sums squares in fp32 in a tree, the CPU in double; inputs in [-1, 1]).
#include <random>

#include "tests/gpu/gpu_test_util.h"

namespace llm::ops {
namespace {

using gpu_testing::Clone;
using gpu_testing::Close;
using gpu_testing::CudaTest;
using gpu_testing::DeviceTensor;
using gpu_testing::Poisoned;
using gpu_testing::Random;

constexpr double kAtol = 1e-5, kRtol = 1e-5;
constexpr float kEps = 1e-5f;

class CudaRmsNorm : public CudaTest {};

TEST_F(CudaRmsNorm, MatchesCpuOutOfPlaceAndInPlace) {
  std::mt19937 rng(201);
  for (const int64_t hidden : {64, 4096, 5001}) {  // 5001: more than 1024 threads, odd
    HostTensor weight = Random({hidden}, rng, 0.5f, 1.5f);
    DeviceTensor d_weight(weight);
    for (const int64_t num_tokens : gpu_testing::kTokenCounts) {
      SCOPED_TRACE(::testing::Message() << "hidden " << hidden << ", tokens " << num_tokens);
      HostTensor x = Random({num_tokens, hidden}, rng);
      HostTensor want = Poisoned({num_tokens, hidden});
      ASSERT_TRUE(RmsNorm({}, want.view(), x.view(), weight.view(), kEps).ok());
      DeviceTensor d_x(x), d_out(want);
      d_out.Poison();
      const OpStatus s = RmsNorm({}, d_out.view(), d_x.view(), d_weight.view(), kEps);
      ASSERT_TRUE(s.ok()) << s.message;
      ASSERT_EQ(Sync(), "");
      EXPECT_TRUE(Close(d_out.Download(), want, kAtol, kRtol));
      // In place: out is x.
      ASSERT_TRUE(RmsNorm({}, d_x.view(), d_x.view(), d_weight.view(), kEps).ok());
      ASSERT_EQ(Sync(), "");
      EXPECT_TRUE(Close(d_x.Download(), want, kAtol, kRtol));
    }
  }
}

TEST_F(CudaRmsNorm, FusedAddMatchesCpuOnBothOutputs) {
  std::mt19937 rng(202);
  for (const int64_t hidden : {64, 4096, 5001}) {
    HostTensor weight = Random({hidden}, rng, 0.5f, 1.5f);
    DeviceTensor d_weight(weight);
    for (const int64_t num_tokens : gpu_testing::kTokenCounts) {
      SCOPED_TRACE(::testing::Message() << "hidden " << hidden << ", tokens " << num_tokens);
      HostTensor x = Random({num_tokens, hidden}, rng);
      HostTensor residual = Random({num_tokens, hidden}, rng);
      DeviceTensor d_x(x), d_residual(residual);
      ASSERT_TRUE(FusedAddRmsNorm({}, x.view(), residual.view(), weight.view(), kEps).ok());
      const OpStatus s = FusedAddRmsNorm({}, d_x.view(), d_residual.view(), d_weight.view(), kEps);
      ASSERT_TRUE(s.ok()) << s.message;
      ASSERT_EQ(Sync(), "");
      EXPECT_TRUE(Close(d_residual.Download(), residual, 0.0, 0.0));  // one fp32 add: exact
      EXPECT_TRUE(Close(d_x.Download(), x, kAtol, kRtol));
    }
  }
}

// An earlier, unrelated CUDA call's error (a failed cudaMalloc, already returned to its
// caller and left as the thread's last error) is not this op's: the op runs and reports its
// own success. A launch check that read cudaGetLastError would pick it up and fail the op.
TEST_F(CudaRmsNorm, AnEarlierCallsErrorIsNotReportedByTheLaunch) {
  std::mt19937 rng(203);
  HostTensor weight = Random({64}, rng, 0.5f, 1.5f);
  HostTensor x = Random({17, 64}, rng);
  HostTensor want = Poisoned({17, 64});
  ASSERT_TRUE(RmsNorm({}, want.view(), x.view(), weight.view(), kEps).ok());
  DeviceTensor d_weight(weight), d_x(x), d_out(want);
  d_out.Poison();
  void* p = nullptr;
  ASSERT_NE(cudaMalloc(&p, size_t{1} << 62), cudaSuccess);  // 4 EiB: out of memory
  const OpStatus s = RmsNorm({}, d_out.view(), d_x.view(), d_weight.view(), kEps);
  EXPECT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(Sync(), "");
  EXPECT_TRUE(Close(d_out.Download(), want, kAtol, kRtol));
}

// bf16 / f16 against the CPU op on the same 16-bit inputs as f32. RmsNorm rounds once: rtol
// 2^-8 (bf16) / 2^-11 (f16) over the fp32 bound. FusedAddRmsNorm stores the residual rounded
// (bit for bit the CPU's f32 sum rounded: one rounding of the same fp32 add) and normalizes
// the rounded residual, as vLLM does, so x's error is that rounding plus the output's: 2 rtol.
TEST_F(CudaRmsNorm, HalfMatchesCpuOnTheRoundedInputs) {
  std::mt19937 rng(204);
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const double rtol = gpu_testing::HalfRtol(dtype);
    for (const int64_t hidden : {64, 5001}) {
      HostTensor weight = gpu_testing::RoundedThroughHalf(Random({hidden}, rng, 0.5f, 1.5f), dtype);
      DeviceTensor d_weight(gpu_testing::ToHalf(weight, dtype));
      for (const int64_t num_tokens : {int64_t{1}, int64_t{17}}) {
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(dtype) << ", hidden " << hidden << ", tokens " << num_tokens);
        HostTensor x = gpu_testing::RoundedThroughHalf(Random({num_tokens, hidden}, rng), dtype);
        HostTensor want = Poisoned({num_tokens, hidden});
        ASSERT_TRUE(RmsNorm({}, want.view(), x.view(), weight.view(), kEps).ok());
        DeviceTensor d_x(gpu_testing::ToHalf(x, dtype)), d_out(gpu_testing::ToHalf(want, dtype));
        d_out.Poison();
        OpStatus s = RmsNorm({}, d_out.view(), d_x.view(), d_weight.view(), kEps);
        ASSERT_TRUE(s.ok()) << s.message;
        ASSERT_EQ(Sync(), "");
        EXPECT_TRUE(Close(gpu_testing::HalfToF32(d_out.Download()), want, kAtol, rtol + kRtol));

        HostTensor residual =
            gpu_testing::RoundedThroughHalf(Random({num_tokens, hidden}, rng), dtype);
        DeviceTensor d_residual(gpu_testing::ToHalf(residual, dtype));
        ASSERT_TRUE(FusedAddRmsNorm({}, x.view(), residual.view(), weight.view(), kEps).ok());
        s = FusedAddRmsNorm({}, d_x.view(), d_residual.view(), d_weight.view(), kEps);
        ASSERT_TRUE(s.ok()) << s.message;
        ASSERT_EQ(Sync(), "");
        EXPECT_TRUE(
            gpu_testing::BitEqual(d_residual.Download(), gpu_testing::ToHalf(residual, dtype)));
        EXPECT_TRUE(Close(gpu_testing::HalfToF32(d_x.Download()), x, kAtol, 2 * rtol + kRtol));
      }
    }
  }
}

TEST(CudaRmsNormArgs, DtypesMustMatchAndTheCpuBackendIsF32Only) {
  HostTensor x(DType::kBF16, {2, 8}), w32(DType::kF32, {8}), r16(DType::kF16, {2, 8});
  TensorView cx = x.view(), cw = w32.view(), cr = r16.view();
  cx.device = cw.device = cr.device = TensorDevice::Cuda(0);
  EXPECT_EQ(RmsNorm({}, cx, cx, cw, kEps).message,
            "RmsNorm: weight: expected bf16 [8], got f32 [8] on cuda:0");
  EXPECT_EQ(FusedAddRmsNorm({}, cx, cr, cw, kEps).message,
            "FusedAddRmsNorm: residual: expected bf16 [2, 8], got f16 [2, 8] on cuda:0");
  HostTensor w(DType::kBF16, {8});
  EXPECT_EQ(RmsNorm({}, x.view(), x.view(), w.view(), kEps).message,
            "RmsNorm: x: the CPU backend takes f32 only, got bf16 [2, 8] on cpu");
}

}  // namespace
}  // namespace llm::ops
