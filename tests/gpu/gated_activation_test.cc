// The gated MLP activations on CUDA against the CPU ops: SiluAndMul, and Gemma's GeluTanhAndMul.
// Tolerance: atol 1e-6, rtol 1e-5. expf on the GPU is within 2 ulp of the host's; GeluTanhAndMul
// computes v / (1 + exp(-2u)) on both sides (the CPU's Exp256 within about 1 ulp), and where
// exp(-2u) is large (v < -3) the roundings of u show as relative error times |2u| on outputs
// below 1e-3, which atol covers. Inputs in [-4, 4].
#include <ostream>
#include <random>
#include <string>

#include "tests/gpu/gpu_test_util.h"

namespace llm::ops {
namespace {

using gpu_testing::Close;
using gpu_testing::CudaTest;
using gpu_testing::DeviceTensor;
using gpu_testing::Poisoned;
using gpu_testing::Random;

struct Activation {
  const char* name;
  OpStatus (*op)(const OpContext&, const TensorView&, const TensorView&);
  uint32_t seed;
};
void PrintTo(const Activation& a, std::ostream* os) { *os << a.name; }

class CudaGatedActivation : public CudaTest, public ::testing::WithParamInterface<Activation> {};

TEST_P(CudaGatedActivation, MatchesCpu) {
  const auto op = GetParam().op;
  std::mt19937 rng(GetParam().seed);
  for (const int64_t inter : {1, 3583, 14336}) {
    for (const int64_t num_tokens : gpu_testing::kTokenCounts) {
      SCOPED_TRACE(::testing::Message() << "intermediate " << inter << ", tokens " << num_tokens);
      HostTensor x = Random({num_tokens, 2 * inter}, rng, -4.0f, 4.0f);
      HostTensor want = Poisoned({num_tokens, inter});
      ASSERT_TRUE(op({}, want.view(), x.view()).ok());
      DeviceTensor d_x(x), d_out(want);
      d_out.Poison();
      const OpStatus s = op({}, d_out.view(), d_x.view());
      ASSERT_TRUE(s.ok()) << s.message;
      ASSERT_EQ(Sync(), "");
      EXPECT_TRUE(Close(d_out.Download(), want, 1e-6, 1e-5));
    }
  }
}

// bf16 / f16: the CPU op on the same 16-bit inputs as f32; the GPU computes in fp32 and rounds
// once: rtol 2^-8 (bf16) or 2^-11 (f16) plus the fp32 bound above.
TEST_P(CudaGatedActivation, HalfMatchesCpuOnTheRoundedInputs) {
  const auto op = GetParam().op;
  std::mt19937 rng(GetParam().seed + 1);
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const int64_t inter : {1, 3583}) {
      for (const int64_t num_tokens : {int64_t{1}, int64_t{17}}) {
        SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << ", intermediate " << inter
                                          << ", tokens " << num_tokens);
        HostTensor x = gpu_testing::RoundedThroughHalf(
            Random({num_tokens, 2 * inter}, rng, -4.0f, 4.0f), dtype);
        HostTensor want = Poisoned({num_tokens, inter});
        ASSERT_TRUE(op({}, want.view(), x.view()).ok());
        DeviceTensor d_x(gpu_testing::ToHalf(x, dtype)), d_out(gpu_testing::ToHalf(want, dtype));
        d_out.Poison();
        const OpStatus s = op({}, d_out.view(), d_x.view());
        ASSERT_TRUE(s.ok()) << s.message;
        ASSERT_EQ(Sync(), "");
        EXPECT_TRUE(Close(gpu_testing::HalfToF32(d_out.Download()), want, 1e-6,
                          gpu_testing::HalfRtol(dtype) + 1e-5));
      }
    }
  }
}

TEST_P(CudaGatedActivation, OutMustHaveXsDtype) {
  const std::string name = GetParam().name;
  HostTensor x(DType::kBF16, {2, 8}), out(DType::kF16, {2, 4});
  TensorView cx = x.view(), co = out.view();
  cx.device = co.device = TensorDevice::Cuda(0);
  EXPECT_EQ(GetParam().op({}, co, cx).message,
            name + ": out: expected bf16 [2, 4], got f16 [2, 4] on cuda:0");
  HostTensor out16(DType::kBF16, {2, 4});
  EXPECT_EQ(GetParam().op({}, out16.view(), x.view()).message,
            name + ": x: the CPU backend takes f32 only, got bf16 [2, 8] on cpu");
}

INSTANTIATE_TEST_SUITE_P(Activations, CudaGatedActivation,
                         ::testing::Values(Activation{"SiluAndMul", &SiluAndMul, 301},
                                           Activation{"GeluTanhAndMul", &GeluTanhAndMul, 501}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace llm::ops
