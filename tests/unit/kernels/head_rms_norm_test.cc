// HeadRmsNorm against a naive double-precision formula, contiguous and token-strided (q and k
// inside a fused qkv row, the elements around them unchanged); SumOfSquares and RmsNormBySums (the
// norm split over ranks) against the same formula over the whole row.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/test_util.h"

namespace llm::ops {
namespace {

using testing::AllClose;
using testing::Random;

// want[t][h][d] = x[t][h][d] / sqrt(mean_d(x[t][h]^2) + eps) * w[d], x's head (t, h) at
// x + t * token_stride + h * head_size; want contiguous [T, H, D].
std::vector<double> NaiveHeadRmsNorm(const float* x, const float* w, int64_t tokens, int64_t heads,
                                     int64_t head_size, int64_t token_stride, double eps) {
  std::vector<double> want(tokens * heads * head_size);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* v = x + t * token_stride + h * head_size;
      double ms = 0;
      for (int64_t d = 0; d < head_size; ++d) ms += double(v[d]) * v[d];
      ms /= head_size;
      for (int64_t d = 0; d < head_size; ++d) {
        want[(t * heads + h) * head_size + d] = v[d] / std::sqrt(ms + eps) * w[d];
      }
    }
  }
  return want;
}

// RmsNorm's tolerance (the same arithmetic): the op sums squares in double, rounds 1/rms to
// f32 and multiplies in f32: a few f32 roundings.
constexpr double kAtol = 1e-6, kRtol = 1e-5;

TEST(HeadRmsNorm, MatchesTheFormulaContiguous) {
  std::mt19937 rng(30);
  // (tokens, heads, head size); the last past the op's threshold for the OpenMP pool.
  for (auto [tokens, heads, head_size] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1},
                                          {3, 2, 17},
                                          {5, 8, 128},
                                          {2, 4, 256},
                                          {64, 8, 128}}) {
    HostTensor x = Random({tokens, heads, head_size}, rng, -3.0f, 3.0f);
    HostTensor w = Random({head_size}, rng, 0.5f, 1.5f);
    const std::vector<double> want = NaiveHeadRmsNorm(x.data<float>(), w.data<float>(), tokens,
                                                      heads, head_size, heads * head_size, 1e-6);
    ASSERT_TRUE(HeadRmsNorm({}, x.view(), w.view(), 1e-6f).ok());
    EXPECT_TRUE(AllClose(x.data<float>(), want, kAtol, kRtol))
        << tokens << "x" << heads << "x" << head_size;
  }
}

// q and k normalized in place inside the fused qkv rows [T, (Hq + 2 Hkv) D], each with its own
// weight, as Qwen3's attention does: their heads match the formula, and every other element of
// the rows (v, and k while q is normalized) keeps its bits.
TEST(HeadRmsNorm, TokenStridedQAndKLeaveTheRestOfTheRowsUntouched) {
  std::mt19937 rng(31);
  for (auto [tokens, hq, hkv, d] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 4, 2, 64},
                                    {7, 4, 2, 64},
                                    {40, 16, 8, 128}}) {
    SCOPED_TRACE(::testing::Message() << tokens << " tokens, " << hq << "/" << hkv << " x " << d);
    const int64_t row = (hq + 2 * hkv) * d;
    HostTensor qkv = Random({tokens, row}, rng, -2.0f, 2.0f);
    const std::vector<float> before = testing::ToVector(qkv);
    HostTensor wq = Random({d}, rng, 0.5f, 1.5f), wk = Random({d}, rng, 0.5f, 1.5f);
    const TensorView q = testing::HeadsView(qkv.view(), 0, hq, d);
    const TensorView k = testing::HeadsView(qkv.view(), hq * d, hkv, d);
    const std::vector<double> want_q =
        NaiveHeadRmsNorm(before.data(), wq.data<float>(), tokens, hq, d, row, 1e-6);
    const std::vector<double> want_k =
        NaiveHeadRmsNorm(before.data() + hq * d, wk.data<float>(), tokens, hkv, d, row, 1e-6);

    ASSERT_TRUE(HeadRmsNorm({}, q, wq.view(), 1e-6f).ok());
    std::vector<float> got_q(tokens * hq * d);
    for (int64_t t = 0; t < tokens; ++t) {
      std::memcpy(&got_q[t * hq * d], qkv.data<float>() + t * row, hq * d * sizeof(float));
      // k and v: the same bits as before.
      ASSERT_EQ(std::memcmp(qkv.data<float>() + t * row + hq * d, before.data() + t * row + hq * d,
                            (row - hq * d) * sizeof(float)),
                0)
          << "token " << t << ": k or v changed";
    }
    EXPECT_TRUE(AllClose(got_q.data(), want_q, kAtol, kRtol));

    ASSERT_TRUE(HeadRmsNorm({}, k, wk.view(), 1e-6f).ok());
    std::vector<float> got_k(tokens * hkv * d);
    for (int64_t t = 0; t < tokens; ++t) {
      std::memcpy(&got_k[t * hkv * d], qkv.data<float>() + t * row + hq * d,
                  hkv * d * sizeof(float));
      ASSERT_EQ(std::memcmp(got_q.data() + t * hq * d, qkv.data<float>() + t * row,
                            hq * d * sizeof(float)),
                0)
          << "token " << t << ": q changed";
      ASSERT_EQ(std::memcmp(qkv.data<float>() + t * row + (hq + hkv) * d,
                            before.data() + t * row + (hq + hkv) * d, hkv * d * sizeof(float)),
                0)
          << "token " << t << ": v changed";
    }
    EXPECT_TRUE(AllClose(got_k.data(), want_k, kAtol, kRtol));
  }
}

// The per-head norm is RmsNorm over each head: the same bits as RmsNorm on the [T * H, D] rows.
TEST(HeadRmsNorm, EqualsRmsNormOverEachHead) {
  std::mt19937 rng(32);
  HostTensor x = Random({9, 4, 128}, rng, -3.0f, 3.0f);
  HostTensor w = Random({128}, rng, 0.5f, 1.5f);
  HostTensor want = testing::Poisoned({36, 128});
  const TensorView rows = TensorView::Contiguous(x.view().data, DType::kF32, {36, 128});
  ASSERT_TRUE(RmsNorm({}, want.view(), rows, w.view(), 1e-6f).ok());
  ASSERT_TRUE(HeadRmsNorm({}, x.view(), w.view(), 1e-6f).ok());
  EXPECT_EQ(std::memcmp(x.view().data, want.view().data, want.view().nbytes()), 0);
}

// A norm over all of a token's heads split over two "ranks" (OLMoE's q norm at tensor-parallel
// size 2): each half's SumOfSquares, the sums added (the all-reduce), then RmsNormBySums on each
// half with its half of the weight, gives the formula over the whole row; and on one rank the two
// steps give HeadRmsNorm over the row as one head, within the same f32 roundings.
TEST(SumOfSquaresAndRmsNormBySums, SplitOverRanksEqualsTheWholeRowsNorm) {
  std::mt19937 rng(34);
  for (auto [tokens, hq, hkv, d] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 4, 2, 16},
                                    {9, 4, 2, 64},
                                    {40, 16, 16, 128}}) {
    SCOPED_TRACE(::testing::Message() << tokens << " tokens, " << hq << " x " << d);
    const int64_t row = (hq + 2 * hkv) * d, q_row = hq * d;
    HostTensor qkv = Random({tokens, row}, rng, -2.0f, 2.0f);
    const std::vector<float> before = testing::ToVector(qkv);
    HostTensor w = Random({q_row}, rng, 0.5f, 1.5f);
    const std::vector<double> want =
        NaiveHeadRmsNorm(before.data(), w.data<float>(), tokens, 1, q_row, row, 1e-6);
    HostTensor sums0(DType::kF32, {tokens}), sums1(DType::kF32, {tokens});
    const TensorView half0 = testing::HeadsView(qkv.view(), 0, hq / 2, d);
    const TensorView half1 = testing::HeadsView(qkv.view(), q_row / 2, hq / 2, d);
    ASSERT_TRUE(SumOfSquares({}, sums0.view(), half0).ok());
    ASSERT_TRUE(SumOfSquares({}, sums1.view(), half1).ok());
    for (int64_t t = 0; t < tokens; ++t) sums0.data<float>()[t] += sums1.data<float>()[t];
    const TensorView w0 = TensorView::Contiguous(w.data<float>(), DType::kF32, {q_row / 2});
    const TensorView w1 =
        TensorView::Contiguous(w.data<float>() + q_row / 2, DType::kF32, {q_row / 2});
    ASSERT_TRUE(RmsNormBySums({}, half0, sums0.view(), w0, q_row, 1e-6f).ok());
    ASSERT_TRUE(RmsNormBySums({}, half1, sums0.view(), w1, q_row, 1e-6f).ok());
    std::vector<float> got(tokens * q_row);
    for (int64_t t = 0; t < tokens; ++t) {
      std::memcpy(&got[t * q_row], qkv.data<float>() + t * row, q_row * sizeof(float));
      ASSERT_EQ(std::memcmp(qkv.data<float>() + t * row + q_row, before.data() + t * row + q_row,
                            (row - q_row) * sizeof(float)),
                0)
          << "token " << t << ": k or v changed";
    }
    EXPECT_TRUE(AllClose(got.data(), want, kAtol, kRtol));
  }
}

TEST(SumOfSquaresAndRmsNormBySums, ErrorsNameTheArgument) {
  std::mt19937 rng(35);
  HostTensor qkv = Random({2, 8 * 64}, rng);
  const TensorView q = testing::HeadsView(qkv.view(), 0, 4, 64);
  HostTensor sums(DType::kF32, {2}), sums3(DType::kF32, {3}), w = Random({256}, rng);
  EXPECT_EQ(SumOfSquares({}, sums3.view(), q).message,
            "SumOfSquares: sums: expected f32 [2], got f32 [3] on cpu");
  EXPECT_EQ(RmsNormBySums({}, q, sums.view(), w.view(), 255, 1e-6f).message,
            "RmsNormBySums: count 255 is less than a row of x (256)");
  HostTensor w64 = Random({64}, rng);
  EXPECT_EQ(RmsNormBySums({}, q, sums.view(), w64.view(), 256, 1e-6f).message,
            "RmsNormBySums: weight: expected f32 [256], got f32 [64] on cpu");
}

TEST(HeadRmsNorm, ErrorsNameTheArgument) {
  std::mt19937 rng(33);
  HostTensor qkv = Random({2, 8 * 64}, rng);
  const TensorView q = testing::HeadsView(qkv.view(), 0, 4, 64);
  HostTensor w63 = Random({63}, rng), w = Random({64}, rng);
  EXPECT_EQ(HeadRmsNorm({}, q, w63.view(), 1e-6f).message,
            "HeadRmsNorm: weight: expected f32 [64], got f32 [63] on cpu");
  TensorView bad = q;
  bad.strides[1] = 65;
  EXPECT_EQ(HeadRmsNorm({}, bad, w.view(), 1e-6f).message,
            "HeadRmsNorm: x: expected contiguous heads with a token stride (strides [>= 256, 64, "
            "1]), got f32 [2, 4, 64] on cpu with strides [512, 65, 1]");
  bad = q;
  bad.strides[0] = 255;  // tokens overlapping
  EXPECT_EQ(HeadRmsNorm({}, bad, w.view(), 1e-6f).message,
            "HeadRmsNorm: x: expected contiguous heads with a token stride (strides [>= 256, 64, "
            "1]), got f32 [2, 4, 64] on cpu with strides [255, 64, 1]");
  EXPECT_EQ(HeadRmsNorm({}, qkv.view(), w.view(), 1e-6f).message,
            "HeadRmsNorm: x: expected f32|bf16|f16 [?, ?, ?], got f32 [2, 512] on cpu");
  EXPECT_EQ(HeadRmsNorm({}, q, w.view(), 0.0f).message,
            "HeadRmsNorm: eps must be > 0, got 0.000000");
  HostTensor x16(DType::kBF16, {2, 4, 64}), w16(DType::kBF16, {64});
  EXPECT_EQ(HeadRmsNorm({}, x16.view(), w16.view(), 1e-6f).message,
            "HeadRmsNorm: x: the CPU backend takes f32 only, got bf16 [2, 4, 64] on cpu");
}

}  // namespace
}  // namespace llm::ops
