// Linear on CUDA (cuBLASLt) against the CPU op (OpenBLAS).
//
// Tolerance (f32): |got - want| <= 1e-6 * K + 1e-5 |want| for inputs in [-1, 1]. Both sides
// accumulate in fp32 in different orders; the rounding error of a K-term dot product of such
// values stays well below 1e-6 * K (a few ulp of sums of magnitude ~sqrt(K)). TF32 (10-bit
// mantissa, a relative error of ~1e-3 per product) would fail it at every K tried here.
// Small integer inputs, whose products and sums fp32 holds exactly, must match exactly
// (tolerance 0; +0 and -0 compare equal).
//
// bf16 / f16 inputs: the CPU op runs on the same values (the 16-bit inputs as f32), so the only
// differences are the order of the fp32 sums (the bound above) and, for a 16-bit out, the one
// rounding of the result: |got - want| <= 2e-6 * K + 2^-8 |want| (bf16; 2^-11 for f16), the
// rounding's relative error applying to a value within 1e-6 * K of want.
#include <cublasLt.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/gpu/gpu_test_util.h"

namespace llm::ops {
namespace {

using gpu_testing::Clone;
using gpu_testing::Close;
using gpu_testing::CudaTest;
using gpu_testing::DeviceTensor;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using ::testing::HasSubstr;

constexpr DType kF32 = DType::kF32;

class CudaLinear : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_EQ(cublasLtCreate(&handle_), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaMalloc(&workspace_, kWorkspaceBytes), cudaSuccess);
  }
  void TearDown() override {
    // Linear's plans for the handle go first: a later handle may get its address.
    cuda::ClearLinearPlans(handle_);
    if (handle_ != nullptr) cublasLtDestroy(handle_);
    if (workspace_ != nullptr) cudaFree(workspace_);
  }
  OpContext Context(cudaStream_t stream = nullptr) const {
    OpContext ctx;
    ctx.stream = stream;
    ctx.blaslt_handle = handle_;
    ctx.blas_workspace = workspace_;
    ctx.blas_workspace_bytes = kWorkspaceBytes;
    return ctx;
  }

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

  // Runs Linear with x and weight (and bias) converted to `in` (bf16 or f16) and out in
  // `out_dtype` (`in` or f32) against the CPU op on the converted values.
  void CheckHalf(const HostTensor& x, const HostTensor& weight, const HostTensor* bias, DType in,
                 DType out_dtype) {
    const int64_t m = x.view().shape[0], k = x.view().shape[1], n = weight.view().shape[0];
    const TensorView no_bias;
    // The CPU reference on the values the GPU sees.
    HostTensor x_r = gpu_testing::RoundedThroughHalf(x, in);
    HostTensor w_r = gpu_testing::RoundedThroughHalf(weight, in);
    HostTensor b_r = bias == nullptr ? HostTensor() : Clone(*bias);
    if (bias != nullptr && out_dtype != kF32) b_r = gpu_testing::RoundedThroughHalf(*bias, in);
    HostTensor want = Poisoned({m, n});
    const OpStatus cpu =
        Linear({}, want.view(), x_r.view(), w_r.view(), bias != nullptr ? b_r.view() : no_bias);
    ASSERT_TRUE(cpu.ok()) << cpu.message;
    DeviceTensor d_x(gpu_testing::ToHalf(x, in)), d_w(gpu_testing::ToHalf(weight, in));
    DeviceTensor d_b;
    if (bias != nullptr) {
      d_b = out_dtype == kF32 ? DeviceTensor(*bias) : DeviceTensor(gpu_testing::ToHalf(*bias, in));
    }
    DeviceTensor d_out =
        out_dtype == kF32 ? DeviceTensor(want) : DeviceTensor(gpu_testing::ToHalf(want, in));
    d_out.Poison();
    const OpStatus s = Linear(Context(), d_out.view(), d_x.view(), d_w.view(),
                              bias != nullptr ? d_b.view() : no_bias);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(Sync(), "");
    const double sum_tol = 1e-6 * static_cast<double>(k);
    if (out_dtype == kF32) {
      EXPECT_TRUE(Close(d_out.Download(), want, sum_tol, 1e-5));
    } else {
      EXPECT_TRUE(Close(gpu_testing::HalfToF32(d_out.Download()), want, 2 * sum_tol,
                        gpu_testing::HalfRtol(in)));
    }
  }

  // Linear on device copies of x and weight (and bias) in `dtype` (f32 or 16-bit, out the same),
  // x starting `x_offset` elements into its buffer (a less aligned pointer); returns out as
  // uploaded from the device.
  HostTensor RunOnDevice(const HostTensor& x, const HostTensor& weight, const HostTensor* bias,
                         DType dtype = kF32, int64_t x_offset = 0) {
    const int64_t m = x.view().shape[0], k = x.view().shape[1], n = weight.view().shape[0];
    auto in_dtype = [dtype](const HostTensor& t) {
      return dtype == kF32 ? Clone(t) : gpu_testing::ToHalf(t, dtype);
    };
    HostTensor x_buf = in_dtype(Random({m * k + x_offset}, rng_));
    const size_t esize = DTypeSize(dtype);
    std::memcpy(static_cast<char*>(x_buf.view().data) + x_offset * esize, in_dtype(x).view().data,
                m * k * esize);
    DeviceTensor d_x(x_buf), d_w(in_dtype(weight)), d_out(in_dtype(Poisoned({m, n})));
    DeviceTensor d_b = bias != nullptr ? DeviceTensor(in_dtype(*bias)) : DeviceTensor();
    d_out.Poison();
    const TensorView vx = TensorView::Contiguous(
        static_cast<char*>(d_x.view().data) + x_offset * esize, dtype, {m, k}, d_x.view().device);
    const OpStatus s = Linear(Context(), d_out.view(), vx, d_w.view(),
                              bias != nullptr ? d_b.view() : TensorView());
    EXPECT_TRUE(s.ok()) << s.message;
    EXPECT_EQ(Sync(), "");
    return d_out.Download();
  }

  static constexpr size_t kWorkspaceBytes = size_t{4} << 20;
  std::mt19937 rng_{811};
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
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

// f32 Linear is never lowered to TF32 (CUBLAS_COMPUTE_32F_PEDANTIC): the fp32 tolerance above
// fails with TF32 products at these sizes.
TEST_F(CudaLinear, StaysFp32AtLargeK) {
  std::mt19937 rng(806);
  for (const auto& [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{17, 256, 64},
                                std::tuple<int64_t, int64_t, int64_t>{64, 1024, 128}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << m << ", K " << k << ", N " << n);
    HostTensor x = Random({m, k}, rng);
    HostTensor w = Random({n, k}, rng);
    Check(x, w, nullptr, /*exact=*/false);
  }
}

TEST_F(CudaLinear, HalfInputsMatchCpuOnTheRoundedValues) {
  std::mt19937 rng(807);
  // (M, K, N): one token; odd sizes; a wide N (an LM head's shape, f32 logits).
  const std::tuple<int64_t, int64_t, int64_t> shapes[] = {
      {1, 64, 96}, {1, 257, 33}, {17, 127, 129}, {15, 1000, 7}, {3, 96, 4097}};
  for (const DType in : {DType::kBF16, DType::kF16}) {
    for (const DType out : {in, kF32}) {
      for (const auto& [m, k, n] : shapes) {
        for (const bool with_bias : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << DTypeName(in) << " -> " << DTypeName(out) << ", rows " << m << ", K " << k
                       << ", N " << n << ", bias " << with_bias);
          HostTensor x = Random({m, k}, rng);
          HostTensor w = Random({n, k}, rng);
          HostTensor b = Random({n}, rng);
          CheckHalf(x, w, with_bias ? &b : nullptr, in, out);
        }
      }
    }
  }
}

// Integers small enough for bf16 (8 significant bits) and for every fp32 sum: exact.
TEST_F(CudaLinear, Bf16ExactOnSmallIntegers) {
  std::mt19937 rng(808);
  HostTensor x = SmallIntegers({17, 65}, rng);
  HostTensor w = SmallIntegers({9, 65}, rng);
  HostTensor b = SmallIntegers({9}, rng);
  HostTensor want = Poisoned({17, 9});
  ASSERT_TRUE(Linear({}, want.view(), x.view(), w.view(), b.view()).ok());
  DeviceTensor d_x(gpu_testing::ToHalf(x, DType::kBF16)), d_w(gpu_testing::ToHalf(w, DType::kBF16));
  DeviceTensor d_b(b), d_out(want);
  d_out.Poison();
  const OpStatus s = Linear(Context(), d_out.view(), d_x.view(), d_w.view(), d_b.view());
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(Sync(), "");
  EXPECT_TRUE(Close(d_out.Download(), want, 0.0, 0.0));
}

// Views that start off a 256-byte boundary (a row of a larger buffer, a slice of a fused weight):
// cuBLASLt's heuristic assumes 256-byte aligned matrices unless told otherwise, and an algorithm
// chosen for aligned data rejects them; Linear passes each pointer's actual alignment.
TEST_F(CudaLinear, UnalignedViews) {
  std::mt19937 rng(809);
  const int64_t m = 3, k = 33, n = 17;
  HostTensor x = gpu_testing::RoundedThroughHalf(Random({m + 1, k}, rng), DType::kBF16);
  HostTensor w = gpu_testing::RoundedThroughHalf(Random({n + 1, k}, rng), DType::kBF16);
  // Row 1 on: offsets of 66 bytes (bf16 rows of 33).
  HostTensor x_tail(kF32, {m, k}), w_tail(kF32, {n, k});
  std::copy(x.data<float>() + k, x.data<float>() + (m + 1) * k, x_tail.data<float>());
  std::copy(w.data<float>() + k, w.data<float>() + (n + 1) * k, w_tail.data<float>());
  HostTensor want = Poisoned({m, n});
  ASSERT_TRUE(Linear({}, want.view(), x_tail.view(), w_tail.view(), TensorView()).ok());
  DeviceTensor d_x(gpu_testing::ToHalf(x, DType::kBF16)), d_w(gpu_testing::ToHalf(w, DType::kBF16));
  DeviceTensor d_out(Poisoned({m * n + 1}));
  d_out.Poison();
  TensorView vx = d_x.view(), vw = d_w.view(), vo = d_out.view();
  vx.data = static_cast<char*>(vx.data) + k * 2;
  vx.shape[0] = m;
  vw.data = static_cast<char*>(vw.data) + k * 2;
  vw.shape[0] = n;
  vo = TensorView::Contiguous(static_cast<float*>(vo.data) + 1, kF32, {m, n}, vo.device);
  const OpStatus s = Linear(Context(), vo, vx, vw, TensorView());
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(Sync(), "");
  HostTensor got_all = d_out.Download();
  HostTensor got(kF32, {m, n});
  std::copy(got_all.data<float>() + 1, got_all.data<float>() + 1 + m * n, got.data<float>());
  EXPECT_TRUE(Close(got, want, 1e-6 * k, 1e-5));
}

// The change in the process-wide plan counters since `before`.
cuda::LinearPlanStats Since(const cuda::LinearPlanStats& before) {
  const cuda::LinearPlanStats now = cuda::GetLinearPlanStats();
  return {now.plans - before.plans, now.hits - before.hits, now.misses - before.misses};
}

MATCHER_P3(Counts, plans, hits, misses, "") {
  *result_listener << "plans " << arg.plans << ", hits " << arg.hits << ", misses " << arg.misses;
  return arg.plans == plans && arg.hits == hits && arg.misses == misses;
}

// Linear plans each shape once: the first call of a (handle, m, n, k, dtypes, bias, alignments,
// workspace) key builds the descriptors and asks the heuristic (a miss), later calls reuse them
// (hits) and give the same bytes; any other m, n, k, dtype, bias or alignment is a new plan. The
// bias pointer is per call: two biases through one plan each give their own output.
TEST_F(CudaLinear, PlansAreCachedPerShape) {
  std::mt19937 rng(812);
  const int64_t m = 7, k = 33, n = 20;
  HostTensor x = Random({m, k}, rng), w = Random({n, k}, rng);
  HostTensor b1 = Random({n}, rng), b2 = Random({n}, rng);
  cuda::LinearPlanStats before = cuda::GetLinearPlanStats();
  const HostTensor first = RunOnDevice(x, w, nullptr);
  EXPECT_THAT(Since(before), Counts(1, 0, 1));
  before = cuda::GetLinearPlanStats();
  const HostTensor again = RunOnDevice(x, w, nullptr);
  EXPECT_THAT(Since(before), Counts(0, 1, 0));
  EXPECT_TRUE(gpu_testing::BitEqual(again, first));
  HostTensor want = Poisoned({m, n});
  ASSERT_TRUE(Linear({}, want.view(), x.view(), w.view(), TensorView()).ok());
  EXPECT_TRUE(Close(again, want, 1e-6 * k, 1e-5));

  // A bias: a new plan, then a hit with another bias tensor, whose values it must add.
  before = cuda::GetLinearPlanStats();
  const HostTensor with_b1 = RunOnDevice(x, w, &b1);
  EXPECT_THAT(Since(before), Counts(1, 0, 1));
  before = cuda::GetLinearPlanStats();
  const HostTensor with_b2 = RunOnDevice(x, w, &b2);
  EXPECT_THAT(Since(before), Counts(0, 1, 0));
  for (const auto& [bias, got] : {std::pair{&b1, &with_b1}, std::pair{&b2, &with_b2}}) {
    ASSERT_TRUE(Linear({}, want.view(), x.view(), w.view(), bias->view()).ok());
    EXPECT_TRUE(Close(*got, want, 1e-6 * k, 1e-5));
  }

  // Each of m, n, k, the dtype and x's alignment: a miss, then a hit.
  HostTensor x_m = Random({m + 1, k}, rng), w_n = Random({n + 1, k}, rng);
  HostTensor x_k = Random({m, k + 1}, rng), w_k = Random({n, k + 1}, rng);
  struct Variant {
    const char* what;
    const HostTensor *x, *w;
    DType dtype;
    int64_t x_offset;
  };
  for (const Variant& v :
       {Variant{"m", &x_m, &w, kF32, 0}, Variant{"n", &x, &w_n, kF32, 0},
        Variant{"k", &x_k, &w_k, kF32, 0}, Variant{"dtype", &x, &w, DType::kBF16, 0},
        Variant{"alignment", &x, &w, kF32, 1}}) {
    SCOPED_TRACE(v.what);
    before = cuda::GetLinearPlanStats();
    const HostTensor a = RunOnDevice(*v.x, *v.w, nullptr, v.dtype, v.x_offset);
    EXPECT_THAT(Since(before), Counts(1, 0, 1));
    before = cuda::GetLinearPlanStats();
    const HostTensor b = RunOnDevice(*v.x, *v.w, nullptr, v.dtype, v.x_offset);
    EXPECT_THAT(Since(before), Counts(0, 1, 0));
    EXPECT_TRUE(gpu_testing::BitEqual(b, a));
  }

  // The handle's plans go with ClearLinearPlans (as before cublasLtDestroy).
  before = cuda::GetLinearPlanStats();
  cuda::ClearLinearPlans(handle_);
  EXPECT_EQ(Since(before).plans, -7);
  before = cuda::GetLinearPlanStats();
  RunOnDevice(x, w, nullptr);
  EXPECT_THAT(Since(before), Counts(1, 0, 1));
}

// Threads sharing a handle and a plan (as emulated ranks do), each with its own bias: every
// output has its own thread's bias.
TEST_F(CudaLinear, ThreadsSharingAPlanKeepTheirBias) {
  std::mt19937 rng(813);
  const int64_t m = 3, k = 16, n = 8;
  HostTensor x = SmallIntegers({m, k}, rng), w = SmallIntegers({n, k}, rng);
  constexpr int kThreads = 4;
  std::vector<HostTensor> biases, wants;
  std::vector<DeviceTensor> d_biases, d_outs;
  for (int i = 0; i < kThreads; ++i) {
    biases.push_back(SmallIntegers({n}, rng));
    wants.push_back(Poisoned({m, n}));
    ASSERT_TRUE(Linear({}, wants[i].view(), x.view(), w.view(), biases[i].view()).ok());
    d_biases.emplace_back(biases[i]);
    d_outs.emplace_back(wants[i]);
  }
  DeviceTensor d_x(x), d_w(w);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      if (cudaSetDevice(0) != cudaSuccess) errors[i] = "cudaSetDevice";
      for (int r = 0; r < 20 && errors[i].empty(); ++r) {
        const OpStatus s =
            Linear(Context(), d_outs[i].view(), d_x.view(), d_w.view(), d_biases[i].view());
        if (!s.ok()) errors[i] = s.message;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(Sync(), "");
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_EQ(errors[i], "") << "thread " << i;
    EXPECT_TRUE(Close(d_outs[i].Download(), wants[i], 0.0, 0.0)) << "thread " << i;
  }
}

// Runs without a device: the handle is checked before any CUDA call.
TEST(CudaLinearArgs, NullBlasLtHandleIsAnErrorNamingTheOp) {
  std::mt19937 rng(805);
  HostTensor x = Random({2, 3}, rng), w = Random({4, 3}, rng), out = Poisoned({2, 4});
  TensorView cx = x.view(), cw = w.view(), co = out.view();
  cx.device = cw.device = co.device = TensorDevice::Cuda(0);
  const OpStatus s = Linear({}, co, cx, cw, TensorView());
  EXPECT_THAT(s.message, HasSubstr("Linear: OpContext.blaslt_handle is null"));
}

TEST(CudaLinearArgs, DtypeMismatchesNameTheArgument) {
  HostTensor x(DType::kBF16, {2, 3}), w32(kF32, {4, 3}), w(DType::kBF16, {4, 3});
  HostTensor out16(DType::kF16, {2, 4}), out(kF32, {2, 4}), b16(DType::kBF16, {4});
  auto on_cuda = [](const HostTensor& t) {
    TensorView v = t.view();
    v.device = TensorDevice::Cuda(0);
    return v;
  };
  EXPECT_THAT(Linear({}, on_cuda(out), on_cuda(x), on_cuda(w32), TensorView()).message,
              HasSubstr("Linear: weight: expected bf16 [?, 3], got f32 [4, 3]"));
  EXPECT_THAT(Linear({}, on_cuda(out16), on_cuda(x), on_cuda(w), TensorView()).message,
              HasSubstr("Linear: out: expected bf16|f32 [2, 4], got f16 [2, 4]"));
  // bias in out's dtype: f32 out takes an f32 bias.
  EXPECT_THAT(Linear({}, on_cuda(out), on_cuda(x), on_cuda(w), on_cuda(b16)).message,
              HasSubstr("Linear: bias: expected f32 [4], got bf16 [4]"));
  // The CPU backend is f32 only.
  EXPECT_THAT(Linear({}, out.view(), x.view(), w.view(), TensorView()).message,
              HasSubstr("Linear: x: the CPU backend takes f32 only, got bf16 [2, 3] on cpu"));
}

}  // namespace
}  // namespace llm::ops
