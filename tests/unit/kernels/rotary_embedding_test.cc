// RotaryEmbedding against the rotation written out directly, with no, linear and llama3
// scaling; the llama3 frequencies are recomputed here as transformers' masks do.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/test_util.h"

namespace llm::ops {
namespace {

using testing::AllClose;
using ::testing::HasSubstr;
using testing::Indices;
using testing::Random;

// transformers' _compute_llama3_parameters, mask by mask.
std::vector<double> Llama3InvFreq(double theta, int dim, const RopeScaling& sc) {
  std::vector<double> out(dim / 2);
  const double old_len = static_cast<double>(sc.original_max_position_embeddings);
  const double low_freq_wavelen = old_len / sc.low_freq_factor;
  const double high_freq_wavelen = old_len / sc.high_freq_factor;
  for (int i = 0; i < dim / 2; ++i) {
    const double inv_freq = 1.0 / std::pow(theta, (2.0 * i) / dim);
    const double wavelen = 2 * std::numbers::pi / inv_freq;
    double llama = wavelen > low_freq_wavelen ? inv_freq / sc.factor : inv_freq;
    const double smooth_factor =
        (old_len / wavelen - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor);
    const double smoothed = (1 - smooth_factor) * llama / sc.factor + smooth_factor * llama;
    const bool is_medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    out[i] = is_medium ? smoothed : llama;
  }
  return out;
}

// x'[i] = x[i] cos(a_i) - x[i + r/2] sin(a_i), x'[i + r/2] = x[i + r/2] cos(a_i) + x[i] sin(a_i)
// with a_i = pos * freq[i]; dims >= r copied.
std::vector<double> Rotate(const float* x, int64_t tokens, int64_t heads, int64_t head_size,
                           int64_t rotary_dim, const std::vector<int64_t>& positions,
                           const std::vector<double>& freq, double position_divisor) {
  std::vector<double> out(tokens * heads * head_size);
  const int64_t half = rotary_dim / 2;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* v = x + (t * heads + h) * head_size;
      double* o = out.data() + (t * heads + h) * head_size;
      for (int64_t d = rotary_dim; d < head_size; ++d) o[d] = v[d];
      for (int64_t i = 0; i < half; ++i) {
        const double a = positions[t] / position_divisor * freq[i];
        o[i] = v[i] * std::cos(a) - v[i + half] * std::sin(a);
        o[i + half] = v[i + half] * std::cos(a) + v[i] * std::sin(a);
      }
    }
  }
  return out;
}

std::vector<double> PlainInvFreq(double theta, int dim) {
  std::vector<double> f(dim / 2);
  for (int i = 0; i < dim / 2; ++i) f[i] = std::pow(theta, -2.0 * i / dim);
  return f;
}

struct Case {
  const char* name;
  RopeConfig config;
  int64_t head_size;
};

TEST(RotaryEmbedding, MatchesTheDirectFormula) {
  RopeScaling linear{RopeScaling::Type::kLinear, 4.0};
  RopeScaling llama3{RopeScaling::Type::kLlama3, 8.0, 1.0, 4.0, 8192};
  const std::vector<Case> cases = {
      {"plain", {10000.0, 0, {}}, 64},
      {"partial rotary_dim", {10000.0, 32, {}}, 64},
      {"linear", {10000.0, 0, linear}, 32},
      {"llama3", {500000.0, 0, llama3}, 128},
  };
  const std::vector<int64_t> positions = {0, 1, 2, 17, 4095, 8191, 8192, 100000, 131071};
  const int64_t tokens = static_cast<int64_t>(positions.size());
  constexpr int64_t kHeads = 4, kKvHeads = 2;
  std::mt19937 rng(40);
  for (const Case& c : cases) {
    const int64_t rotary_dim = c.config.rotary_dim == 0 ? c.head_size : c.config.rotary_dim;
    std::vector<double> freq;
    double divisor = 1.0;
    switch (c.config.scaling.type) {
      case RopeScaling::Type::kNone:
        freq = PlainInvFreq(c.config.theta, rotary_dim);
        break;
      case RopeScaling::Type::kLinear:
        freq = PlainInvFreq(c.config.theta, rotary_dim);
        divisor = c.config.scaling.factor;
        break;
      case RopeScaling::Type::kLlama3:
        freq = Llama3InvFreq(c.config.theta, rotary_dim, c.config.scaling);
        break;
    }
    for (DType dtype : {DType::kI32, DType::kI64}) {
      HostTensor pos = Indices(positions, dtype);
      HostTensor q = Random({tokens, kHeads, c.head_size}, rng);
      HostTensor k = Random({tokens, kKvHeads, c.head_size}, rng);
      const std::vector<double> want_q = Rotate(q.data<float>(), tokens, kHeads, c.head_size,
                                                rotary_dim, positions, freq, divisor);
      const std::vector<double> want_k = Rotate(k.data<float>(), tokens, kKvHeads, c.head_size,
                                                rotary_dim, positions, freq, divisor);
      ASSERT_TRUE(RotaryEmbedding({}, pos.view(), q.view(), k.view(), c.config).ok()) << c.name;
      // Angles up to 1.3e5 rad: float cos/sin of a double angle, rounded once.
      EXPECT_TRUE(AllClose(q.data<float>(), want_q, 2e-6, 1e-5)) << c.name << " query";
      EXPECT_TRUE(AllClose(k.data<float>(), want_k, 2e-6, 1e-5)) << c.name << " key";
    }
  }
}

TEST(RotaryEmbedding, Llama3KeepsHighFrequenciesAndDividesLowOnes) {
  const RopeConfig config{500000.0, 128, {RopeScaling::Type::kLlama3, 8.0, 1.0, 4.0, 8192}};
  std::vector<double> inv_freq(64);
  ASSERT_TRUE(ComputeRopeInvFreq(config, inv_freq).ok());
  const std::vector<double> plain = PlainInvFreq(500000.0, 128);
  // Wavelength 2 pi < 8192 / 4: unchanged. Wavelength > 8192: divided by 8.
  EXPECT_DOUBLE_EQ(inv_freq[0], 1.0);
  EXPECT_DOUBLE_EQ(inv_freq[63], plain[63] / 8.0);
  int kept = 0, divided = 0, smoothed = 0;
  for (int i = 0; i < 64; ++i) {
    const double wavelen = 2 * std::numbers::pi / plain[i];
    if (wavelen < 2048) {
      EXPECT_DOUBLE_EQ(inv_freq[i], plain[i]) << i;
      ++kept;
    } else if (wavelen > 8192) {
      EXPECT_DOUBLE_EQ(inv_freq[i], plain[i] / 8) << i;
      ++divided;
    } else {
      EXPECT_GT(inv_freq[i], plain[i] / 8) << i;
      EXPECT_LT(inv_freq[i], plain[i]) << i;
      ++smoothed;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(smoothed, 0);
}

// A GGUF's rope_freqs: llama.cpp's converter writes Llama 3.1's scaling as one divisor per
// frequency; dividing the plain frequencies by the factors the llama3 rule implies gives the
// llama3 frequencies again.
TEST(RotaryEmbedding, FreqFactorsDivideTheInverseFrequencies) {
  const RopeConfig llama3{500000.0, 128, {RopeScaling::Type::kLlama3, 8.0, 1.0, 4.0, 8192}};
  std::vector<double> want(64);
  ASSERT_TRUE(ComputeRopeInvFreq(llama3, want).ok());
  const std::vector<double> plain = PlainInvFreq(500000.0, 128);
  RopeConfig factors{500000.0, 128, {}};
  for (int i = 0; i < 64; ++i) factors.freq_factors.push_back(plain[i] / want[i]);
  std::vector<double> got(64);
  ASSERT_TRUE(ComputeRopeInvFreq(factors, got).ok());
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(got[i], want[i], 1e-15 * want[0]) << i;
  factors.freq_factors.pop_back();
  EXPECT_NE(ComputeRopeInvFreq(factors, got).message.find("freq_factors: expected 64"),
            std::string::npos);
  factors.freq_factors.push_back(0.0);
  EXPECT_NE(ComputeRopeInvFreq(factors, got).message.find("factors > 0"), std::string::npos);
}

TEST(RotaryEmbedding, ErrorsNameTheArgument) {
  std::mt19937 rng(41);
  HostTensor pos = Indices({0, 1, 2}, DType::kI64);
  HostTensor q = Random({3, 4, 64}, rng);
  HostTensor k_bad = Random({3, 2, 32}, rng);
  EXPECT_EQ(RotaryEmbedding({}, pos.view(), q.view(), k_bad.view(), {}).message,
            "RotaryEmbedding: key: expected f32 [3, ?, 64], got f32 [3, 2, 32] on cpu");
  HostTensor k = Random({3, 2, 64}, rng);
  EXPECT_THAT(RotaryEmbedding({}, pos.view(), q.view(), k.view(), {10000.0, 33, {}}).message,
              HasSubstr("rotary_dim must be even"));
  RopeConfig bad_llama3{500000.0, 0, {RopeScaling::Type::kLlama3, 8.0, 4.0, 1.0, 8192}};
  EXPECT_THAT(RotaryEmbedding({}, pos.view(), q.view(), k.view(), bad_llama3).message,
              HasSubstr("high_freq_factor > low_freq_factor"));
}

// The cos / sin table: vLLM's layout, each entry the double angle's cos / sin rounded once.
TEST(RotaryEmbeddingCached, TableHoldsCosThenSinPerPosition) {
  RopeConfig config{500000.0, 8, {}};
  std::vector<float> table(5 * 8);
  ASSERT_TRUE(ComputeRopeCosSinCache(config, 5, table).ok());
  std::vector<double> inv_freq(4);
  ASSERT_TRUE(ComputeRopeInvFreq(config, inv_freq).ok());
  for (int p = 0; p < 5; ++p) {
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(table[p * 8 + i], static_cast<float>(std::cos(p * inv_freq[i]))) << p << " " << i;
      EXPECT_EQ(table[p * 8 + 4 + i], static_cast<float>(std::sin(p * inv_freq[i])))
          << p << " " << i;
    }
  }
}

// The lookup equals the computed rotation: the same f32 cos / sin, the same f32 arithmetic.
TEST(RotaryEmbeddingCached, MatchesRotaryEmbeddingExactly) {
  std::mt19937 rng(42);
  RopeConfig config{500000.0, 64, {RopeScaling::Type::kLlama3, 8.0, 1.0, 4.0, 8192}};
  const int64_t max_position = 70000;
  std::vector<float> table(max_position * 64);
  ASSERT_TRUE(ComputeRopeCosSinCache(config, max_position, table).ok());
  HostTensor cache(DType::kF32, {max_position, 64});
  std::copy(table.begin(), table.end(), cache.data<float>());
  HostTensor pos = Indices({0, 1, 69999, 12345}, DType::kI32);
  HostTensor q = Random({4, 4, 128}, rng), k = Random({4, 2, 128}, rng);
  HostTensor q2 = Random({4, 4, 128}, rng), k2 = Random({4, 2, 128}, rng);
  std::copy(q.data<float>(), q.data<float>() + q.numel(), q2.data<float>());
  std::copy(k.data<float>(), k.data<float>() + k.numel(), k2.data<float>());
  ASSERT_TRUE(RotaryEmbedding({}, pos.view(), q.view(), k.view(), config).ok());
  ASSERT_TRUE(RotaryEmbeddingCached({}, pos.view(), q2.view(), k2.view(), cache.view()).ok());
  for (int64_t i = 0; i < q.numel(); ++i) ASSERT_EQ(q.data<float>()[i], q2.data<float>()[i]) << i;
  for (int64_t i = 0; i < k.numel(); ++i) ASSERT_EQ(k.data<float>()[i], k2.data<float>()[i]) << i;
}

// The model's q and k: token-strided views of the q and k columns of fused qkv rows. Both ops
// rotate them as they rotate contiguous tensors, bit for bit, and write nothing else (the v
// columns and a pad after them stay NaN).
TEST(RotaryEmbeddingCached, TokenStridedViewsOfQkvRowsRotateInPlace) {
  std::mt19937 rng(45);
  const int64_t tokens = 5, hq = 4, hkv = 2, d = 64, row = (hq + 2 * hkv) * d + 8;
  RopeConfig config;
  config.rotary_dim = 32;  // partial: dims 32 .. 63 of each head stay
  const int64_t max_position = 100;
  std::vector<float> table(max_position * 32);
  ASSERT_TRUE(ComputeRopeCosSinCache(config, max_position, table).ok());
  HostTensor cache(DType::kF32, {max_position, 32});
  std::copy(table.begin(), table.end(), cache.data<float>());
  HostTensor pos = Indices({0, 7, 99, 3, 50}, DType::kI64);
  for (const bool cached : {false, true}) {
    SCOPED_TRACE(cached ? "RotaryEmbeddingCached" : "RotaryEmbedding");
    HostTensor q = Random({tokens, hq, d}, rng), k = Random({tokens, hkv, d}, rng);
    HostTensor qkv = testing::PoisonedRows(DType::kF32, tokens, row);
    testing::PutHeads(qkv, 0, q);
    testing::PutHeads(qkv, hq * d, k);
    const TensorView q_view = testing::HeadsView(qkv.view(), 0, hq, d);
    const TensorView k_view = testing::HeadsView(qkv.view(), hq * d, hkv, d);
    OpStatus strided, contiguous;
    if (cached) {
      strided = RotaryEmbeddingCached({}, pos.view(), q_view, k_view, cache.view());
      contiguous = RotaryEmbeddingCached({}, pos.view(), q.view(), k.view(), cache.view());
    } else {
      strided = RotaryEmbedding({}, pos.view(), q_view, k_view, config);
      contiguous = RotaryEmbedding({}, pos.view(), q.view(), k.view(), config);
    }
    ASSERT_TRUE(strided.ok()) << strided.message;
    ASSERT_TRUE(contiguous.ok()) << contiguous.message;
    HostTensor want = testing::PoisonedRows(DType::kF32, tokens, row);
    testing::PutHeads(want, 0, q);
    testing::PutHeads(want, hq * d, k);
    EXPECT_TRUE(testing::SameBytes(qkv, want));
  }
}

TEST(RotaryEmbeddingCached, OtherLayoutsAreRefusedNamingTheStrides) {
  HostTensor qkv = testing::PoisonedRows(DType::kF32, 2, 8 * 64);
  HostTensor cache(DType::kF32, {4, 64});
  HostTensor pos = Indices({0, 1}, DType::kI32);
  const TensorView q = testing::HeadsView(qkv.view(), 0, 4, 64);
  TensorView k = testing::HeadsView(qkv.view(), 4 * 64, 2, 64);
  k.strides[2] = 2;
  EXPECT_EQ(RotaryEmbeddingCached({}, pos.view(), q, k, cache.view()).message,
            "RotaryEmbeddingCached: key: expected contiguous heads with a token stride (strides "
            "[>= 128, 64, 1]), got f32 [2, 2, 64] on cpu with strides [512, 64, 2]");
}

TEST(RotaryEmbeddingCached, ErrorsNameTheArgument) {
  std::mt19937 rng(43);
  HostTensor cache(DType::kF32, {4, 64});
  std::vector<float> table(4 * 64);
  ASSERT_TRUE(ComputeRopeCosSinCache({10000.0, 64, {}}, 4, table).ok());
  std::copy(table.begin(), table.end(), cache.data<float>());
  HostTensor pos = Indices({0, 4}, DType::kI64);
  HostTensor q = Random({2, 4, 64}, rng), k = Random({2, 2, 64}, rng);
  EXPECT_EQ(RotaryEmbeddingCached({}, pos.view(), q.view(), k.view(), cache.view()).message,
            "RotaryEmbeddingCached: positions[1] = 4 is outside the cos_sin_cache's [0, 4)");
  HostTensor neg = Indices({-1, 0}, DType::kI64);
  EXPECT_THAT(RotaryEmbeddingCached({}, neg.view(), q.view(), k.view(), cache.view()).message,
              HasSubstr("positions[0] = -1 is outside"));
  HostTensor k_bad = Random({2, 2, 32}, rng);
  EXPECT_EQ(RotaryEmbeddingCached({}, pos.view(), q.view(), k_bad.view(), cache.view()).message,
            "RotaryEmbeddingCached: key: expected f32 [2, ?, 64], got f32 [2, 2, 32] on cpu");
  HostTensor q16(DType::kBF16, {2, 4, 64}), k16(DType::kBF16, {2, 2, 64});
  EXPECT_EQ(RotaryEmbeddingCached({}, pos.view(), q16.view(), k16.view(), cache.view()).message,
            "RotaryEmbeddingCached: query: the CPU backend takes f32 only, got bf16 [2, 4, 64] on "
            "cpu");
}

}  // namespace
}  // namespace llm::ops
