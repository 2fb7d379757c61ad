// The GGUF-block products (kernels/cpu/quant_gemv.h) and QuantizedLinear against references
// built from the loader's own dequantizer (common/gguf_dequant.h, bit for bit ggml's):
//   - the kernels' own decoding equals the loader's, bit for bit;
//   - with the activations quantized the kernels' way, the product equals the fp64 product of
//     the dequantized weights and the quantized activations (d * q) up to fp32 summation;
//   - against the unquantized activations the error stays within the bound the activations'
//     rounding implies: |x_i - d q_i| <= d / 2 for each value, so |error| <= sum_i |w_i| d_i / 2.
// Random blocks: every byte random, but for the fp16 scales, set to random values of a weight
// scale's size (random bits there would be NaN or 1e4). Outputs are NaN beforehand.
#include "kernels/cpu/quant_gemv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/gguf_dequant.h"
#include "common/half.h"
#include "kernels/cpu/quantized_linear.h"
#include "kernels/tensor.h"

namespace llm::cpu {

// Test names and failure messages name the type.
void PrintTo(QuantType type, std::ostream* os) { *os << QuantTypeName(type); }

namespace {

constexpr QuantType kTypes[] = {QuantType::kQ4_0, QuantType::kQ4_1, QuantType::kQ5_0,
                                QuantType::kQ8_0, QuantType::kQ4_K, QuantType::kQ5_K,
                                QuantType::kQ6_K};

// Byte offsets of a block's fp16 scales.
std::vector<int> HalfOffsets(QuantType type) {
  switch (type) {
    case QuantType::kQ4_1:
    case QuantType::kQ4_K:
    case QuantType::kQ5_K:
      return {0, 2};
    case QuantType::kQ6_K:
      return {208};
    default:
      return {0};
  }
}

std::vector<uint8_t> RandomBlocks(QuantType type, int64_t rows, int64_t k, std::mt19937& rng) {
  std::vector<uint8_t> b(static_cast<size_t>(rows * QuantRowBytes(type, k)));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& v : b) v = static_cast<uint8_t>(byte(rng));
  // Q4_1's m is an offset that may be negative; the others' scales are positive but for Q4_0's,
  // Q5_0's, Q8_0's and Q6_K's d, whose sign the quants carry anyway.
  std::uniform_real_distribution<float> scale(0.001f, 0.02f);
  std::bernoulli_distribution negative(0.5);
  const int64_t bytes = QuantBlockBytes(type);
  for (size_t at = 0; at < b.size(); at += bytes) {
    for (int off : HalfOffsets(type)) {
      float v = scale(rng);
      if (type == QuantType::kQ4_1 && off == 2 && negative(rng)) v = -8 * v;
      const uint16_t h = FloatToHalf(v);
      std::memcpy(&b[at + off], &h, 2);
    }
  }
  return b;
}

std::vector<float> LoaderDequant(QuantType type, const std::vector<uint8_t>& blocks,
                                 int64_t numel) {
  std::vector<float> out(numel);
  const absl::Status s = DequantizeToF32(static_cast<GgmlType>(type),
                                         std::as_bytes(std::span(blocks)), std::span(out));
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

std::vector<float> RandomActivations(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

struct Shape {
  int64_t m, n, k;
};

// The shapes every type runs: odd M and N, K of one and several super-blocks.
// The last two only for the 32-weight block types: an odd number of blocks per row (one
// activation row alternates its blocks between two accumulators, and ends on a lone block).
const Shape kShapes[] = {{1, 1, 256},   {1, 37, 512}, {2, 16, 256},  {3, 65, 768},
                         {4, 33, 1280}, {5, 17, 256}, {7, 130, 512}, {13, 9, 2304},
                         {1, 19, 800},  {2, 5, 96}};

class QuantGemvTest : public ::testing::TestWithParam<QuantType> {};

TEST_P(QuantGemvTest, DecodesAsTheLoaderDoes) {
  const QuantType type = GetParam();
  std::mt19937 rng(1);
  const int64_t rows = 5, k = 1024;
  const std::vector<uint8_t> blocks = RandomBlocks(type, rows, k, rng);
  const std::vector<float> want = LoaderDequant(type, blocks, rows * k);
  std::vector<float> got(rows * k, std::nanf(""));
  DequantizeRows(type, blocks.data(), QuantRowBytes(type, k), rows, k, got.data());
  for (int64_t i = 0; i < rows * k; ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0)
        << "element " << i << ": " << got[i] << " != " << want[i];
  }
}

// The prefill tiles' decoding: ggml's values up to one rounding of a q - b (1 ulp of the larger
// of a q and b: well below 1e-6 at these scales).
TEST_P(QuantGemvTest, FastDecodingIsTheLoadersUpToRounding) {
  const QuantType type = GetParam();
  std::mt19937 rng(11);
  const int64_t rows = 3, k = 768;
  const std::vector<uint8_t> blocks = RandomBlocks(type, rows, k, rng);
  const std::vector<float> want = LoaderDequant(type, blocks, rows * k);
  std::vector<float> got(rows * k, std::nanf(""));
  DequantizeRowsFast(type, blocks.data(), QuantRowBytes(type, k), rows, k, got.data());
  for (int64_t i = 0; i < rows * k; ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-6) << "element " << i;
  }
}

TEST(QuantizeRowQ8Test, DispatchGivesThePortableBlocks) {
  std::mt19937 rng(2);
  for (int64_t k : {32, 256, 2048}) {
    std::vector<float> x = RandomActivations(k, rng);
    x[3] = 0.0f;
    for (int i = 32; i < 64 && i < k; ++i) x[i] = 0.0f;  // an all-zero block: d = 0
    std::vector<Q8Block> a(k / 32), b(k / 32);
    QuantizeRowQ8(x.data(), k, a.data());
    QuantizeRowQ8Portable(x.data(), k, b.data());
    for (int64_t i = 0; i < k / 32; ++i) {
      ASSERT_EQ(a[i].d, b[i].d) << i;
      ASSERT_EQ(a[i].s, b[i].s) << i;
      ASSERT_EQ(std::memcmp(a[i].qs, b[i].qs, 32), 0) << i;
      for (int j = 0; j < 32; ++j) {
        ASSERT_LE(std::fabs(x[32 * i + j] - a[i].d * a[i].qs[j]), a[i].d * 0.5f * 1.0001f);
      }
    }
  }
}

// Runs `gemm` (QuantGemm or QuantGemmPortable) on every shape against both references.
template <class Gemm>
void CheckProducts(QuantType type, Gemm gemm) {
  std::mt19937 rng(3 + static_cast<int>(type));
  for (const Shape& s : kShapes) {
    if (s.k % QuantBlockElems(type) != 0) continue;
    SCOPED_TRACE(testing::Message() << "M=" << s.m << " N=" << s.n << " K=" << s.k);
    const std::vector<uint8_t> blocks = RandomBlocks(type, s.n, s.k, rng);
    const std::vector<float> w = LoaderDequant(type, blocks, s.n * s.k);
    const std::vector<float> x = RandomActivations(s.m * s.k, rng);
    const int64_t xb = s.k / 32;
    std::vector<Q8Block> xq(s.m * xb);
    for (int64_t i = 0; i < s.m; ++i) QuantizeRowQ8Portable(&x[i * s.k], s.k, &xq[i * xb]);
    // out has a wider row than N (out_stride), whose extra columns must stay untouched.
    const int64_t ostride = s.n + 3;
    std::vector<float> out(s.m * ostride, std::nanf(""));
    gemm(type, blocks.data(), QuantRowBytes(type, s.k), s.n, s.k, xq.data(), xb, s.m, out.data(),
         ostride);
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        double exact = 0, quantized = 0, magnitude = 0, bound = 0;
        for (int64_t c = 0; c < s.k; ++c) {
          const Q8Block& b = xq[i * xb + c / 32];
          const double wv = w[j * s.k + c];
          exact += wv * x[i * s.k + c];
          quantized += wv * (static_cast<double>(b.d) * b.qs[c % 32]);
          magnitude += std::fabs(wv * x[i * s.k + c]);
          bound += std::fabs(wv) * b.d * 0.5;
        }
        const float got = out[i * ostride + j];
        ASSERT_FALSE(std::isnan(got)) << "row " << i << " col " << j << " not written";
        // fp32 sums of products of fp32-rounded scales: a few ulps of the magnitude.
        const double fp32 = 1e-5 * (magnitude + 1e-3);
        ASSERT_NEAR(got, quantized, fp32) << "row " << i << " col " << j;
        ASSERT_NEAR(got, exact, bound + fp32) << "row " << i << " col " << j;
      }
      for (int64_t j = s.n; j < ostride; ++j) ASSERT_TRUE(std::isnan(out[i * ostride + j]));
    }
  }
}

TEST_P(QuantGemvTest, ProductMatchesTheDequantizedReference) {
  CheckProducts(GetParam(), QuantGemm);
}

TEST_P(QuantGemvTest, PortableProductMatchesTheDequantizedReference) {
  CheckProducts(GetParam(), QuantGemmPortable);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, QuantGemvTest, ::testing::ValuesIn(kTypes),
                         [](const auto& info) { return std::string(QuantTypeName(info.param)); });

// A linear of three parts of different types (a Q4_K_M file's fused q/k/v), with a bias, at
// decode sizes (integer path) and prefill sizes (dequantized tiles), against fp64.
TEST(QuantizedLinearTest, MixedPartsWithBiasAtEveryStepSize) {
  std::mt19937 rng(7);
  const int64_t k = 512;
  const QuantType types[] = {QuantType::kQ4_K, QuantType::kQ6_K, QuantType::kQ8_0};
  const int64_t rows[] = {70, 9, 131};
  std::vector<QuantizedLinear::Part> parts;
  std::vector<float> w;
  for (int p = 0; p < 3; ++p) {
    QuantizedLinear::Part part{types[p], rows[p], RandomBlocks(types[p], rows[p], k, rng)};
    const std::vector<float> d = LoaderDequant(types[p], part.blocks, rows[p] * k);
    w.insert(w.end(), d.begin(), d.end());
    parts.push_back(std::move(part));
  }
  const int64_t n = 70 + 9 + 131;
  std::vector<float> bias = RandomActivations(n, rng);
  std::unique_ptr<QuantizedLinear> lin;
  ASSERT_TRUE(QuantizedLinear::Create(k, std::move(parts),
                                      TensorView::Contiguous(bias.data(), DType::kF32, {n}), &lin)
                  .ok());
  EXPECT_EQ(lin->n(), n);
  EXPECT_EQ(lin->ImplementationName(1), "quant:Q4_K+Q6_K+Q8_0");
  for (int64_t m : {1, 3, 4, 5, 15, 16, 33}) {
    SCOPED_TRACE(testing::Message() << "M=" << m);
    const std::vector<float> x = RandomActivations(m * k, rng);
    std::vector<float> out(m * n, std::nanf(""));
    const ops::OpStatus s =
        lin->Forward(TensorView::Contiguous(out.data(), DType::kF32, {m, n}),
                     TensorView::Contiguous(const_cast<float*>(x.data()), DType::kF32, {m, k}));
    ASSERT_TRUE(s.ok()) << s.message;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double exact = bias[j], bound = 0, magnitude = 0;
        for (int64_t c = 0; c < k; ++c) {
          const double wv = w[j * k + c], xv = x[i * k + c];
          exact += wv * xv;
          magnitude += std::fabs(wv * xv);
        }
        if (m < QuantizedLinear::kDequantMinRows) {
          // The activations' rounding: d / 2 per value, d = max |x| over its block / 127.
          for (int64_t c = 0; c < k; c += 32) {
            float amax = 0;
            for (int e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(x[i * k + c + e]));
            for (int e = 0; e < 32; ++e) bound += std::fabs(w[j * k + c + e]) * amax / 127 * 0.5;
          }
        }
        ASSERT_NEAR(out[i * n + j], exact, bound + 1e-5 * (magnitude + std::fabs(bias[j])))
            << "row " << i << " col " << j;
      }
    }
  }
}

TEST(QuantizedLinearTest, GatherRowsDequantizesTheRowsAndZerosOthers) {
  std::mt19937 rng(8);
  const int64_t k = 256;
  std::vector<QuantizedLinear::Part> parts;
  parts.push_back({QuantType::kQ4_1, 3, RandomBlocks(QuantType::kQ4_1, 3, k, rng)});
  parts.push_back({QuantType::kQ6_K, 2, RandomBlocks(QuantType::kQ6_K, 2, k, rng)});
  const std::vector<float> w0 = LoaderDequant(QuantType::kQ4_1, parts[0].blocks, 3 * k);
  const std::vector<float> w1 = LoaderDequant(QuantType::kQ6_K, parts[1].blocks, 2 * k);
  std::unique_ptr<QuantizedLinear> lin;
  ASSERT_TRUE(QuantizedLinear::Create(k, std::move(parts), TensorView{}, &lin).ok());
  std::vector<int32_t> ids = {4, 0, 5, -1, 2, 3};
  std::vector<float> out(ids.size() * k, std::nanf(""));
  ASSERT_TRUE(
      lin->GatherRows(
             TensorView::Contiguous(out.data(), DType::kF32, {static_cast<int64_t>(ids.size()), k}),
             TensorView::Contiguous(ids.data(), DType::kI32, {static_cast<int64_t>(ids.size())}))
          .ok());
  for (size_t t = 0; t < ids.size(); ++t) {
    for (int64_t c = 0; c < k; ++c) {
      const int id = ids[t];
      const float want = id < 0 || id >= 5 ? 0.0f : id < 3 ? w0[id * k + c] : w1[(id - 3) * k + c];
      ASSERT_EQ(out[t * k + c], want) << "token " << t << " col " << c;
    }
  }
}

// Reserve takes the scratch of the largest step up front (the calling thread's quantized
// activations, a dequantized tile per thread of its team), counted in ScratchBytes; steps up to
// that size, on either path, then grow nothing.
TEST(QuantizedLinearTest, ReserveTakesTheScratchOfTheLargestStepUpFront) {
  std::mt19937 rng(9);
  const int64_t k = 1024, n = 200;  // four tiles of rows
  std::vector<QuantizedLinear::Part> parts;
  parts.push_back({QuantType::kQ4_1, n, RandomBlocks(QuantType::kQ4_1, n, k, rng)});
  std::unique_ptr<QuantizedLinear> lin;
  ASSERT_TRUE(QuantizedLinear::Create(k, std::move(parts), TensorView{}, &lin).ok());
  const int64_t max_m = 2 * QuantizedLinear::kDequantMinRows;
  const size_t before = QuantizedLinear::ScratchBytes();
  lin->Reserve(max_m);
  const size_t reserved = QuantizedLinear::ScratchBytes();
  const size_t xq = (QuantizedLinear::kDequantMinRows - 1) * (k / kQ8BlockElems) * sizeof(Q8Block);
  const size_t tile = 64 * k * sizeof(float);
  EXPECT_GE(reserved, before + tile);
  EXPECT_GE(reserved, xq + tile);
  const std::vector<float> x = RandomActivations(max_m * k, rng);
  std::vector<float> out(max_m * n);
  for (int64_t m : {int64_t{1}, int64_t{17}, QuantizedLinear::kDequantMinRows - 1,
                    QuantizedLinear::kDequantMinRows, max_m}) {
    SCOPED_TRACE(testing::Message() << "M=" << m);
    ASSERT_TRUE(
        lin->Forward(TensorView::Contiguous(out.data(), DType::kF32, {m, n}),
                     TensorView::Contiguous(const_cast<float*>(x.data()), DType::kF32, {m, k}))
            .ok());
    EXPECT_EQ(QuantizedLinear::ScratchBytes(), reserved);
  }
}

TEST(QuantizedLinearTest, RefusesMismatchedParts) {
  std::unique_ptr<QuantizedLinear> lin;
  std::vector<QuantizedLinear::Part> parts;
  parts.push_back({QuantType::kQ4_K, 1, std::vector<uint8_t>(144)});
  ops::OpStatus s = QuantizedLinear::Create(128, std::move(parts), TensorView{}, &lin);
  EXPECT_NE(s.message.find("not a multiple of 256"), std::string::npos) << s.message;
  parts.clear();
  parts.push_back({QuantType::kQ8_0, 2, std::vector<uint8_t>(34)});
  s = QuantizedLinear::Create(32, std::move(parts), TensorView{}, &lin);
  EXPECT_NE(s.message.find("34 bytes for 2 rows"), std::string::npos) << s.message;
}

}  // namespace
}  // namespace llm::cpu
