// Scale and Softcap on CUDA (in place) against the CPU ops. Scale: bit-exact in every dtype (one
// fp32 multiply, correctly rounded on both, then one rounding to the 16-bit dtype). Softcap:
// atol 1e-6, rtol 1e-6 in f32 (tanhf on the GPU within 2 ulp, the CPU's Tanh256 within about
// 2.5e-7); 16-bit: the CPU op on the same 16-bit inputs, plus the one output rounding (HalfRtol).
// Sizes past one grid's 4096 x 256 threads, so that the grid-stride loop goes round.
#include <cmath>
#include <random>
#include <vector>

#include "tests/gpu/gpu_test_util.h"

namespace llm::ops {
namespace {

using gpu_testing::Clone;
using gpu_testing::Close;
using gpu_testing::CudaTest;
using gpu_testing::DeviceTensor;
using gpu_testing::Random;

class CudaScaleSoftcap : public CudaTest {};

const std::vector<std::vector<int64_t>> kScaleShapes = {{1}, {3, 85}, {7, 2, 100003}};
const std::vector<std::vector<int64_t>> kSoftcapShapes = {{1}, {3, 255}, {9, 128257}};

// x of `dtype` with the values of the f32 `rounded` (already representable in dtype).
DeviceTensor Upload(const HostTensor& rounded, DType dtype) {
  return dtype == DType::kF32 ? DeviceTensor(rounded)
                              : DeviceTensor(gpu_testing::ToHalf(rounded, dtype));
}

// Uniform in [lo, hi), rounded through dtype when it is 16-bit.
HostTensor RoundedRandom(const std::vector<int64_t>& shape, DType dtype, std::mt19937& rng,
                         float lo, float hi) {
  HostTensor x(DType::kF32, shape);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = dist(rng);
  return dtype == DType::kF32 ? std::move(x) : gpu_testing::RoundedThroughHalf(x, dtype);
}

TEST_F(CudaScaleSoftcap, ScaleIsBitExact) {
  std::mt19937 rng(601);
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const float factor : {std::sqrt(2304.0f), -0.5f}) {
      for (const auto& shape :
           {std::initializer_list<int64_t>{1}, std::initializer_list<int64_t>{3, 85},
            std::initializer_list<int64_t>{7, 2, 100003}}) {
        HostTensor x = RoundedRandom(shape, dtype, rng, -100.0f, 100.0f);
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(dtype) << " " << x.view().ShapeString() << " * " << factor);
        DeviceTensor d_x = Upload(x, dtype);
        HostTensor want = Clone(x);
        ASSERT_TRUE(Scale({}, want.view(), factor).ok());
        const OpStatus s = Scale({}, d_x.view(), factor);
        ASSERT_TRUE(s.ok()) << s.message;
        ASSERT_EQ(Sync(), "");
        EXPECT_TRUE(gpu_testing::BitEqual(
            d_x.Download(), dtype == DType::kF32 ? Clone(want) : gpu_testing::ToHalf(want, dtype)));
      }
    }
  }
}

TEST_F(CudaScaleSoftcap, SoftcapMatchesCpu) {
  std::mt19937 rng(602);
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const double rtol = dtype == DType::kF32 ? 1e-6 : gpu_testing::HalfRtol(dtype) + 1e-6;
    for (const float cap : {30.0f, 50.0f}) {
      for (const auto& shape :
           {std::initializer_list<int64_t>{1}, std::initializer_list<int64_t>{3, 255},
            std::initializer_list<int64_t>{9, 128257}}) {
        // f16 holds at most 65504: the logits stay within it.
        HostTensor x = RoundedRandom(shape, dtype, rng, -12.0f * cap, 12.0f * cap);
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(dtype) << " " << x.view().ShapeString() << ", cap " << cap);
        DeviceTensor d_x = Upload(x, dtype);
        HostTensor want = Clone(x);
        ASSERT_TRUE(Softcap({}, want.view(), cap).ok());
        const OpStatus s = Softcap({}, d_x.view(), cap);
        ASSERT_TRUE(s.ok()) << s.message;
        ASSERT_EQ(Sync(), "");
        const HostTensor got = d_x.Download();
        EXPECT_TRUE(Close(dtype == DType::kF32 ? Clone(got) : gpu_testing::HalfToF32(got), want,
                          1e-6, rtol));
      }
    }
  }
}

TEST(CudaScaleSoftcapArgs, ErrorsNameTheArgument) {
  HostTensor x(DType::kBF16, {2, 8});
  TensorView cx = x.view();
  cx.device = TensorDevice::Cuda(0);
  EXPECT_EQ(Softcap({}, cx, 0.0f).message, "Softcap: cap must be finite and > 0, got 0.000000");
  TensorView strided = cx;
  strided.shape = {2, 4};
  strided.strides = {8, 2};
  EXPECT_EQ(Scale({}, strided, 2.0f).message,
            "Scale: x: must be contiguous, got bf16 [2, 4] on cuda:0 with non-row-major strides");
  HostTensor i(DType::kI64, {4});
  TensorView ci = i.view();
  ci.device = TensorDevice::Cuda(0);
  EXPECT_EQ(Softcap({}, ci, 30.0f).message,
            "Softcap: x: expected f32|bf16|f16, any shape, got i64 [4] on cuda:0");
}

}  // namespace
}  // namespace llm::ops
