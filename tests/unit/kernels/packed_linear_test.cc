// PackedLinear (oneDNN matmul on prepacked weights) against references:
//   f32: the fp32 reference op (ops::Linear, OpenBLAS) and a naive fp64 loop;
//   bf16: a fp64 loop over bf16-rounded x and weights (what the bf16 GEMM computes, up to the
//   order of the fp32 sums).
// Outputs are poisoned (NaN) before each call, so an unwritten element fails.
#include "kernels/cpu/packed_linear.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "common/half.h"
#include "gtest/gtest.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/test_util.h"

namespace llm::cpu {
namespace {

using ops::testing::AllClose;
using ops::testing::Poisoned;
using ops::testing::Random;

struct Dims {
  int64_t m, k, n;
};

// Row counts around the chunk sizes (kRowChunk = 64, kBigChunk = 128) and past them, odd K and
// N, M = 1.
const Dims kShapes[] = {{1, 1, 1},
                        {1, 300, 257},
                        {2, 17, 3},
                        {7, 33, 65},
                        {31, 96, 129},
                        {64, 256, 128},
                        {65, 64, 77},
                        {130, 129, 33},
                        {200, 45, 300},
                        // 99,900 inputs: bf16 rounding on the pool, in parts with a ragged last.
                        {300, 333, 40}};

float RoundBf16(float f) { return Bf16ToFloat(FloatToBf16(f)); }

std::vector<double> Reference(const HostTensor& x, const HostTensor& w, const HostTensor* b,
                              int64_t m, int64_t k, int64_t n, bool bf16) {
  std::vector<double> want(m * n);
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = b != nullptr ? b->data<float>()[j] : 0.0;
      for (int64_t i = 0; i < k; ++i) {
        float xv = x.data<float>()[t * k + i], wv = w.data<float>()[j * k + i];
        if (bf16) xv = RoundBf16(xv), wv = RoundBf16(wv);
        acc += double(xv) * wv;
      }
      want[t * n + j] = acc;
    }
  }
  return want;
}

TEST(PackedLinear, F32MatchesTheReferenceOpAndAnFp64Loop) {
  std::mt19937 rng(40);
  for (const Dims& d : kShapes) {
    HostTensor x = Random({d.m, d.k}, rng);
    HostTensor w = Random({d.n, d.k}, rng);
    HostTensor b = Random({d.n}, rng);
    for (bool with_bias : {false, true}) {
      std::unique_ptr<PackedLinear> p;
      ASSERT_TRUE(
          PackedLinear::Create(w.view(), with_bias ? b.view() : TensorView{}, DType::kF32, &p)
              .ok());
      HostTensor out = Poisoned({d.m, d.n});
      ASSERT_TRUE(p->Forward(out.view(), x.view()).ok());
      const std::vector<double> want =
          Reference(x, w, with_bias ? &b : nullptr, d.m, d.k, d.n, /*bf16=*/false);
      EXPECT_TRUE(AllClose(out.data<float>(), want, 1e-5, 1e-4))
          << d.m << "x" << d.k << " -> " << d.n << (with_bias ? " with bias" : "");
      HostTensor ref = Poisoned({d.m, d.n});
      ASSERT_TRUE(
          ops::Linear({}, ref.view(), x.view(), w.view(), with_bias ? b.view() : TensorView{})
              .ok());
      std::vector<double> ref_d(ref.data<float>(), ref.data<float>() + d.m * d.n);
      EXPECT_TRUE(AllClose(out.data<float>(), ref_d, 1e-5, 1e-4))
          << "vs ops::Linear " << d.m << "x" << d.k << " -> " << d.n;
    }
  }
}

// bf16: both sides multiply the same bf16 values exactly (8-bit mantissas, exact in fp32) and
// sum in fp32 against fp64: the difference is fp32 summation error, within 1e-5 * sum|terms|
// for these K; stated here as atol 1e-4 + rtol 1e-3.
TEST(PackedLinear, Bf16MatchesAnFp64LoopOnBf16RoundedInputs) {
  if (!CpuHasNativeBf16()) GTEST_SKIP() << "this CPU has neither AVX512_BF16 nor AMX";
  std::mt19937 rng(41);
  for (const Dims& d : kShapes) {
    HostTensor x = Random({d.m, d.k}, rng);
    HostTensor w = Random({d.n, d.k}, rng);
    HostTensor b = Random({d.n}, rng);
    for (bool with_bias : {false, true}) {
      std::unique_ptr<PackedLinear> p;
      ASSERT_TRUE(
          PackedLinear::Create(w.view(), with_bias ? b.view() : TensorView{}, DType::kBF16, &p)
              .ok());
      HostTensor out = Poisoned({d.m, d.n});
      ASSERT_TRUE(p->Forward(out.view(), x.view()).ok());
      const std::vector<double> want =
          Reference(x, w, with_bias ? &b : nullptr, d.m, d.k, d.n, /*bf16=*/true);
      EXPECT_TRUE(AllClose(out.data<float>(), want, 1e-4, 1e-3))
          << d.m << "x" << d.k << " -> " << d.n << (with_bias ? " with bias" : "");
      // And it is not the fp32 product: bf16 rounding moves results by far more than 1e-4.
      if (d.k >= 64) {
        const std::vector<double> f32 =
            Reference(x, w, with_bias ? &b : nullptr, d.m, d.k, d.n, /*bf16=*/false);
        double max_diff = 0;
        for (int64_t i = 0; i < d.m * d.n; ++i) {
          max_diff = std::max(max_diff, std::abs(out.data<float>()[i] - f32[i]));
        }
        EXPECT_GT(max_diff, 1e-3) << d.m << "x" << d.k << " -> " << d.n;
      }
    }
  }
}

// The weights are packed by Create: the caller's weight can change (or be freed) afterwards.
TEST(PackedLinear, KeepsItsOwnPackedCopy) {
  std::mt19937 rng(42);
  HostTensor x = Random({5, 40}, rng);
  HostTensor w = Random({24, 40}, rng);
  const std::vector<double> want = Reference(x, w, nullptr, 5, 40, 24, false);
  std::unique_ptr<PackedLinear> p;
  ASSERT_TRUE(PackedLinear::Create(w.view(), {}, DType::kF32, &p).ok());
  for (int64_t i = 0; i < 24 * 40; ++i) w.data<float>()[i] = NAN;
  HostTensor out = Poisoned({5, 24});
  ASSERT_TRUE(p->Forward(out.view(), x.view()).ok());
  EXPECT_TRUE(AllClose(out.data<float>(), want, 1e-5, 1e-4));
  EXPECT_GE(p->packed_bytes(), size_t{24 * 40 * 4});
}

// Reserved row counts run oneDNN's optimized kernels, not its reference implementation.
TEST(PackedLinear, UsesOptimizedKernels) {
  std::mt19937 rng(43);
  HostTensor w = Random({256, 128}, rng);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    if (dtype == DType::kBF16 && !CpuHasNativeBf16()) continue;
    std::unique_ptr<PackedLinear> p;
    ASSERT_TRUE(PackedLinear::Create(w.view(), {}, dtype, &p).ok());
    ASSERT_TRUE(p->Reserve(PackedLinear::kBigChunk).ok());
    for (int64_t m :
         {int64_t{1}, int64_t{8}, int64_t{32}, PackedLinear::kRowChunk, PackedLinear::kBigChunk}) {
      const std::string impl = p->ImplementationName(m);
      EXPECT_FALSE(impl.empty());
      EXPECT_EQ(impl.find("ref"), std::string::npos)
          << DTypeName(dtype) << " m=" << m << ": " << impl;
    }
  }
}

// GatherRows reads rows back out of the packed layout (the tied LM head's embedding lookup):
// exactly the weight's rows (bf16: rounded), zeros for rows outside [0, N), every row of odd
// shapes and of SmolLM2's head width (K 576) in any order.
TEST(PackedLinear, GatherRowsReadsTheWeightsRowsFromThePackedLayout) {
  std::mt19937 rng(45);
  const Dims kGatherShapes[] = {{0, 1, 1}, {0, 33, 65}, {0, 576, 1000}, {0, 130, 257}};
  for (const Dims& d : kGatherShapes) {
    HostTensor w = Random({d.n, d.k}, rng);
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      if (dtype == DType::kBF16 && !CpuHasNativeBf16()) continue;
      std::unique_ptr<PackedLinear> p;
      ASSERT_TRUE(PackedLinear::Create(w.view(), {}, dtype, &p).ok());
      std::vector<int32_t> rows;
      for (int64_t r = d.n - 1; r >= 0; --r) rows.push_back(static_cast<int32_t>(r));
      rows.push_back(static_cast<int32_t>(d.n));  // outside: zeros
      rows.push_back(-1);
      rows.push_back(0);
      const int64_t t = static_cast<int64_t>(rows.size());
      const TensorView ids = TensorView::Contiguous(rows.data(), DType::kI32, {t});
      HostTensor out = Poisoned({t, d.k});
      ASSERT_TRUE(p->GatherRows(out.view(), ids).ok());
      int64_t wrong = 0;
      for (int64_t i = 0; i < t; ++i) {
        for (int64_t j = 0; j < d.k; ++j) {
          const int32_t r = rows[i];
          float want = 0;
          if (r >= 0 && r < d.n) {
            want = w.data<float>()[r * d.k + j];
            if (dtype == DType::kBF16) want = RoundBf16(want);
          }
          wrong += out.data<float>()[i * d.k + j] != want;
        }
      }
      EXPECT_EQ(wrong, 0) << DTypeName(dtype) << " [" << d.n << ", " << d.k << "]";
    }
  }
  HostTensor w = Random({8, 16}, rng);
  std::unique_ptr<PackedLinear> p;
  ASSERT_TRUE(PackedLinear::Create(w.view(), {}, DType::kF32, &p).ok());
  int32_t one = 0;
  HostTensor out_bad = Poisoned({1, 15});
  EXPECT_EQ(p->GatherRows(out_bad.view(), TensorView::Contiguous(&one, DType::kI32, {1})).message,
            "PackedLinear::GatherRows: out: expected f32 [1, 16] contiguous on cpu, got f32 [1, "
            "15] on cpu");
}

TEST(PackedLinear, ErrorsNameTheArgument) {
  std::mt19937 rng(44);
  HostTensor w = Random({65, 33}, rng);
  HostTensor b_bad = Random({64}, rng);
  std::unique_ptr<PackedLinear> p;
  EXPECT_EQ(PackedLinear::Create(w.view(), b_bad.view(), DType::kF32, &p).message,
            "PackedLinear: bias: expected f32 [65] on cpu, got f32 [64] on cpu");
  EXPECT_EQ(PackedLinear::Create(w.view(), {}, DType::kF16, &p).message,
            "PackedLinear: weight_dtype: expected f32 or bf16, got f16");
  HostTensor w3 = Random({2, 3, 4}, rng);
  EXPECT_EQ(
      PackedLinear::Create(w3.view(), {}, DType::kF32, &p).message,
      "PackedLinear: weight: expected f32 [N, K] contiguous on cpu, got f32 [2, 3, 4] on cpu");
  EXPECT_EQ(p, nullptr);
  ASSERT_TRUE(PackedLinear::Create(w.view(), {}, DType::kF32, &p).ok());
  HostTensor x_bad = Random({7, 34}, rng);
  HostTensor out = Poisoned({7, 65});
  EXPECT_EQ(p->Forward(out.view(), x_bad.view()).message,
            "PackedLinear: x: expected f32 [?, 33] contiguous on cpu, got f32 [7, 34] on cpu");
  HostTensor x = Random({7, 33}, rng);
  HostTensor out_bad = Poisoned({7, 64});
  EXPECT_EQ(p->Forward(out_bad.view(), x.view()).message,
            "PackedLinear: out: expected f32 [7, 65] contiguous on cpu, got f32 [7, 64] on cpu");
}

TEST(ThreadPool, SizeDefaultsToTheCpusetAndFollowsTheSetting) {
  EXPECT_EQ(ThreadPoolSize(), static_cast<int>(AffinityCpus().size()));
  SetThreadPoolSize(1);
  EXPECT_EQ(ThreadPoolSize(), 1);
  SetThreadPoolSize(0);
  EXPECT_EQ(ThreadPoolSize(), static_cast<int>(AffinityCpus().size()));
}

// Work handed over from several threads runs on one thread, one job at a time, and has ended
// when the call returns; a call from the compute thread itself runs at once (no deadlock).
TEST(ThreadPool, ComputeThreadRunsEveryCallersWorkOnOneThreadInTurn) {
  ComputeThread compute;
  std::mutex mu;
  std::set<std::thread::id> ran_on;
  std::atomic<int> inside{0}, most_inside{0}, done{0};
  auto job = [&] {
    const int now = ++inside;
    int seen = most_inside.load();
    while (now > seen && !most_inside.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    {
      std::lock_guard<std::mutex> lock(mu);
      ran_on.insert(std::this_thread::get_id());
    }
    --inside;
  };
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int i = 0; i < 5; ++i) {
        compute.Run(job);
        ++done;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(done.load(), 20);
  EXPECT_EQ(most_inside.load(), 1);
  ASSERT_EQ(ran_on.size(), 1u);
  EXPECT_NE(*ran_on.begin(), std::this_thread::get_id());
  bool nested = false;
  compute.Run([&] { compute.Run([&] { nested = true; }); });
  EXPECT_TRUE(nested);
}

}  // namespace
}  // namespace llm::cpu
