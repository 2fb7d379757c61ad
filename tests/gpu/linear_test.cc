// Linear on CUDA (cuBLAS) against the CPU op (OpenBLAS).
//
// Tolerance: |got - want| <= 1e-6 * K + 1e-5 |want| for inputs in [-1, 1]. Both sides
// accumulate in fp32 in different orders; the rounding error of a K-term dot product of such
// values stays well below 1e-6 * K (a few ulp of sums of magnitude ~sqrt(K)). TF32 (10-bit
// mantissa, a relative error of ~1e-3 per product) would fail it at every K tried here.
// Small integer inputs, whose products and sums fp32 holds exactly, must match exactly
// (tolerance 0; +0 and -0 compare equal).
#include <cublas_v2.h>

#include <random>
#include <tuple>

#include "gmock/gmock.h"
#include "tests/gpu/gpu_test_util.h"

namespace llm::ops {
namespace {

using gpu_testing::Close;
using gpu_testing::CudaTest;
using gpu_testing::DeviceTensor;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using ::testing::HasSubstr;

class CudaLinear : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_EQ(cublasCreate(&handle_), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override {
    if (handle_ != nullptr) cublasDestroy(handle_);
  }
  OpContext Context(cudaStream_t stream = nullptr) const { return {stream, handle_}; }

  // Runs Linear on both backends with out poisoned and compares; `exact`: tolerance 0.
  void Check(const HostTensor& x, const HostTensor& weight, const HostTensor* bias, bool exact,
             cudaStream_t stream = nullptr) {
    const int64_t m = x.view().shape[0], k = x.view().shape[1], n = weight.view().shape[0];
    const TensorView no_bias;
    HostTensor want = Poisoned({m, n});
    const OpStatus cpu =
        Linear({}, want.view(), x.view(), weight.view(), bias != nullptr ? bias->view() : no_bias);
    ASSERT_TRUE(cpu.ok()) << cpu.message;
    DeviceTensor d_x(x), d_w(weight), d_out(want);
    DeviceTensor d_b = bias != nullptr ? DeviceTensor(*bias) : DeviceTensor();
    d_out.Poison();
    // The uploads and the poison ran on the legacy default stream, which a non-blocking stream
    // does not wait for.
    if (stream != nullptr) ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const OpStatus s = Linear(Context(stream), d_out.view(), d_x.view(), d_w.view(),
                              bias != nullptr ? d_b.view() : no_bias);
    ASSERT_TRUE(s.ok()) << s.message;
    if (stream != nullptr) ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_EQ(Sync(), "");
    const double atol = exact ? 0.0 : 1e-6 * static_cast<double>(k);
    EXPECT_TRUE(Close(d_out.Download(), want, atol, exact ? 0.0 : 1e-5));
  }

  cublasHandle_t handle_ = nullptr;
};

// Uniform integers in [-4, 4] as f32.
HostTensor SmallIntegers(std::initializer_list<int64_t> shape, std::mt19937& rng) {
  HostTensor t = Random(shape, rng);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<float>()[i] = static_cast<float>(static_cast<int>(t.data<float>()[i] * 4.5f));
  }
  return t;
}

TEST_F(CudaLinear, MatchesCpu) {
  std::mt19937 rng(801);
  // (K, N): one element; odd sizes around tiles; a long K; a wide N (an LM head's shape).
  const std::pair<int64_t, int64_t> kn[] = {{1, 1}, {3, 5}, {127, 129}, {4099, 33}, {96, 4097}};
  for (const auto& [k, n] : kn) {
    for (const int64_t m : gpu_testing::kTokenCounts) {
      for (const bool with_bias : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "rows " << m << ", K " << k << ", N " << n << ", bias " << with_bias);
        HostTensor x = Random({m, k}, rng);
        HostTensor w = Random({n, k}, rng);
        HostTensor b = Random({n}, rng);
        Check(x, w, with_bias ? &b : nullptr, /*exact=*/false);
      }
    }
  }
}

TEST_F(CudaLinear, ExactOnSmallIntegers) {
  std::mt19937 rng(802);
  for (const int64_t m : gpu_testing::kTokenCounts) {
    SCOPED_TRACE(::testing::Message() << "rows " << m);
    // |sum| <= 257 * 16 + 4, far below 2^24: every order of summation is exact.
    HostTensor x = SmallIntegers({m, 257}, rng);
    HostTensor w = SmallIntegers({65, 257}, rng);
    HostTensor b = SmallIntegers({65}, rng);
    Check(x, w, &b, /*exact=*/true);
    Check(x, w, nullptr, /*exact=*/true);
  }
}

TEST_F(CudaLinear, EmptyKIsTheBiasOrZero) {
  std::mt19937 rng(803);
  HostTensor x = Poisoned({17, 0});
  HostTensor w = Poisoned({9, 0});
  HostTensor b = Random({9}, rng);
  Check(x, w, &b, /*exact=*/true);
  Check(x, w, nullptr, /*exact=*/true);
}

TEST_F(CudaLinear, RunsOnTheContextStream) {
  std::mt19937 rng(804);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  HostTensor x = Random({15, 200}, rng);
  HostTensor w = Random({31, 200}, rng);
  HostTensor b = Random({31}, rng);
  Check(x, w, &b, /*exact=*/false, stream);
  // The handle keeps the last stream; the next call on the default stream must still work.
  Check(x, w, &b, /*exact=*/false, nullptr);
  cudaStreamDestroy(stream);
}

// A handle whose math mode allows TF32 (as a caller may set it for other GEMMs) must not lower
// Linear to TF32: the fp32 tolerance above fails with TF32 products at these sizes.
TEST_F(CudaLinear, StaysFp32WhenTheHandleAllowsTf32) {
  std::mt19937 rng(806);
  ASSERT_EQ(cublasSetMathMode(handle_, CUBLAS_TF32_TENSOR_OP_MATH), CUBLAS_STATUS_SUCCESS);
  for (const auto& [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{17, 256, 64},
                                std::tuple<int64_t, int64_t, int64_t>{64, 1024, 128}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << m << ", K " << k << ", N " << n);
    HostTensor x = Random({m, k}, rng);
    HostTensor w = Random({n, k}, rng);
    Check(x, w, nullptr, /*exact=*/false);
  }
}

// Runs without a device: the handle is checked before any CUDA call.
TEST(CudaLinearArgs, NullBlasHandleIsAnErrorNamingTheOp) {
  std::mt19937 rng(805);
  HostTensor x = Random({2, 3}, rng), w = Random({4, 3}, rng), out = Poisoned({2, 4});
  TensorView cx = x.view(), cw = w.view(), co = out.view();
  cx.device = cw.device = co.device = TensorDevice::Cuda(0);
  const OpStatus s = Linear({}, co, cx, cw, TensorView());
  EXPECT_THAT(s.message, HasSubstr("Linear: OpContext.blas_handle is null"));
}

}  // namespace
}  // namespace llm::ops
