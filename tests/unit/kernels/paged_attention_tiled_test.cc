// The production CPU PagedAttention (blocked flash-style, AVX-512 where available, on the
// OpenMP pool) and its portable fallback against cpu::PagedAttentionReference, the simple
// single-threaded implementation, on random caches with scattered blocks: head sizes 8 to 128,
// MHA / GQA / MQA, block sizes 1 to 32, contexts from 1 to past several key tiles (none a
// multiple of the block size), prefill from scratch, chunked prefill after cached context and
// decode tokens in one batch. Every output starts as NaN, so a row the op does not write fails.
// Tolerance: fp32 with sums in another order and exp() by a polynomial: |got - want| <=
// 1e-5 + 1e-5 |want| (outputs are averages of values in [-1, 1]). With bf16 caches the tiled
// paths also round each softmax weight to bf16 (relative error <= 2^-9) before its product with
// a value, which the reference does not: 2^-9 more (|v| <= 1); and a separate test with equal
// weights (exact in bf16) holds them to fp32's tolerance. With a sliding window and a softcap
// (kernels/ops.h's AttentionOptions) on the same cases, the split decode rows among them; the
// positions before each sequence's first window are NaN then (never read).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/half.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/test_util.h"

namespace llm::ops {
namespace {

using testing::Indices;
using testing::Poisoned;
using testing::Random;

struct Seq {
  int64_t num_cached;  // context already in the cache
  int64_t q_len;       // this step's query tokens
};

struct Case {
  int64_t heads, kv_heads, head_size, block_size;
  std::vector<Seq> seqs;
};

std::string Describe(const Case& c) {
  std::string s = "heads " + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) +
                  ", head_size " + std::to_string(c.head_size) + ", block_size " +
                  std::to_string(c.block_size) + ", seqs";
  for (const Seq& q : c.seqs) {
    s += " (" + std::to_string(q.num_cached) + "+" + std::to_string(q.q_len) + ")";
  }
  return s;
}

// Runs `op` and the reference on the same random batch; compares every output element.
using Op = OpStatus (*)(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                        const AttentionMetadata&, const AttentionOptions&);

// The same values in a bf16 tensor (rounded to nearest even).
HostTensor ToBf16(const HostTensor& f32) {
  const TensorView& v = f32.view();
  HostTensor b(DType::kBF16, std::span<const int64_t>(v.shape.data(), v.ndim));
  for (int64_t i = 0; i < f32.numel(); ++i) {
    b.data<uint16_t>()[i] = FloatToBf16(f32.data<float>()[i]);
  }
  return b;
}

// cache_dtype kBF16: both ops read the same bf16 caches, and the tolerance grows by 2^-9 for the
// tiled paths' bf16 weights. zero_query: every score 0, so each output is the plain average of
// the values its row sees (the weights, all 1, are exact in bf16: fp32's tolerance again).
// strided_query: `op` reads the query as the model passes it, a token-strided view of the q
// columns of fused qkv rows (the k and v columns and a pad after them NaN), and must give the
// same bytes as on the contiguous query. options: its window and softcap (the scale is
// 1 / sqrt(head_size)); with a window the positions before each sequence's first query row's
// window are NaN.
::testing::AssertionResult MatchesReference(Op op, const Case& c, std::mt19937& rng,
                                            DType cache_dtype = DType::kF32,
                                            bool zero_query = false, bool strided_query = false,
                                            AttentionOptions options = {}) {
  const int64_t num_seqs = static_cast<int64_t>(c.seqs.size());
  int64_t num_tokens = 0, max_blocks = 0, needed = 0;
  for (const Seq& s : c.seqs) {
    const int64_t blocks = (s.num_cached + s.q_len + c.block_size - 1) / c.block_size;
    num_tokens += s.q_len;
    needed += blocks;
    max_blocks = std::max(max_blocks, blocks + 1);
  }
  const int64_t num_blocks = needed + 3;
  std::vector<int64_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> tables(num_seqs * max_blocks, 0), seq_lens, qsl = {0};
  size_t next = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t len = c.seqs[s].num_cached + c.seqs[s].q_len;
    for (int64_t b = 0; b * c.block_size < len; ++b) tables[s * max_blocks + b] = perm[next++];
    seq_lens.push_back(len);
    qsl.push_back(qsl.back() + c.seqs[s].q_len);
  }
  // Scores spread over several units so that the softmax is neither flat nor one-hot.
  HostTensor key_cache = Random({num_blocks, c.block_size, c.kv_heads, c.head_size}, rng);
  HostTensor value_cache = Random({num_blocks, c.block_size, c.kv_heads, c.head_size}, rng);
  if (options.sliding_window > 0) {
    const int64_t row = c.kv_heads * c.head_size;
    for (int64_t s = 0; s < num_seqs; ++s) {
      for (int64_t p = 0; p < c.seqs[s].num_cached - options.sliding_window + 1; ++p) {
        const int64_t slot =
            tables[s * max_blocks + p / c.block_size] * c.block_size + p % c.block_size;
        std::fill_n(key_cache.data<float>() + slot * row, row, NAN);
        std::fill_n(value_cache.data<float>() + slot * row, row, NAN);
      }
    }
  }
  if (cache_dtype == DType::kBF16) {
    key_cache = ToBf16(key_cache);
    value_cache = ToBf16(value_cache);
  }
  HostTensor query = Random({num_tokens, c.heads, c.head_size}, rng, -2.0f, 2.0f);
  if (zero_query) std::fill(query.data<float>(), query.data<float>() + query.numel(), 0.0f);
  const float weights_tolerance = cache_dtype == DType::kBF16 && !zero_query ? 0x1p-9f : 0.0f;
  HostTensor got = Poisoned({num_tokens, c.heads, c.head_size});
  HostTensor want = Poisoned({num_tokens, c.heads, c.head_size});
  HostTensor t = Indices(tables, DType::kI32, {num_seqs, max_blocks});
  HostTensor l = Indices(seq_lens, DType::kI32);
  HostTensor q = Indices(qsl, DType::kI32);
  const AttentionMetadata md{t.view(), l.view(), q.view()};
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_size));
  options.scale = scale;
  if (OpStatus s = cpu::PagedAttentionReference(want.view(), query.view(), key_cache.view(),
                                                value_cache.view(), md, options);
      !s.ok()) {
    return ::testing::AssertionFailure() << "reference: " << s.message;
  }
  if (OpStatus s = op(got.view(), query.view(), key_cache.view(), value_cache.view(), md, options);
      !s.ok()) {
    return ::testing::AssertionFailure() << s.message;
  }
  if (strided_query) {
    const int64_t q_cols = c.heads * c.head_size;
    HostTensor qkv =
        testing::PoisonedRows(DType::kF32, num_tokens, q_cols + 2 * c.kv_heads * c.head_size + 16);
    testing::PutHeads(qkv, 0, query);
    HostTensor strided = Poisoned({num_tokens, c.heads, c.head_size});
    const TensorView q_view = testing::HeadsView(qkv.view(), 0, c.heads, c.head_size);
    if (OpStatus s = op(strided.view(), q_view, key_cache.view(), value_cache.view(), md, options);
        !s.ok()) {
      return ::testing::AssertionFailure() << "strided query: " << s.message;
    }
    if (!testing::SameBytes(strided, got)) {
      return ::testing::AssertionFailure() << "a token-strided query gives another output";
    }
  }
  int64_t bad = 0, first = -1;
  const float* g = got.data<float>();
  const float* w = want.data<float>();
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (!(std::abs(g[i] - w[i]) <= 1e-5f + 1e-5f * std::abs(w[i]) + weights_tolerance)) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.numel() << " differ; first at "
                                       << first << ": got " << g[first] << ", want " << w[first];
}

std::vector<Case> Cases() {
  // Decode at contexts 1, 17 and 2 tiles + 3; prefill of 1, of 70 (past the query tile) and of
  // 9; chunked prefill of 33 after 50 cached and of 5 after 100.
  const std::vector<Seq> mixed = {{0, 1},   {16, 1}, {66, 1},  {0, 70},
                                  {50, 33}, {0, 9},  {100, 5}, {0, 1}};
  std::vector<Case> cases;
  for (int64_t head_size : {8, 16, 64, 80, 128}) {
    for (auto [heads, kv] : {std::pair<int64_t, int64_t>{4, 4}, {14, 2}, {8, 1}, {6, 3}}) {
      for (int64_t block_size : {1, 16, 32}) {
        cases.push_back({heads, kv, head_size, block_size, mixed});
      }
    }
  }
  // Decode only, long contexts (many key tiles), the 0.5B shape.
  cases.push_back({14, 2, 64, 16, {{511, 1}, {2047, 1}, {1000, 1}}});
  // One sequence's prefill of 300 tokens: many query tiles of one sequence.
  cases.push_back({14, 2, 64, 16, {{0, 300}}});
  // Group larger than the query tile's rows (one query per item).
  cases.push_back({128, 1, 64, 16, {{0, 20}, {7, 1}}});
  return cases;
}

TEST(PagedAttentionTiled, MatchesReference) {
  std::mt19937 rng(1801);
  for (const Case& c : Cases())
    EXPECT_TRUE(MatchesReference(cpu::PagedAttention, c, rng)) << Describe(c);
}

// bf16 caches (a bf16 model's KV cache on the CPU): every path, every case.
TEST(PagedAttentionTiled, Bf16CachesMatchTheReference) {
  std::mt19937 rng(1807);
  for (const Case& c : Cases()) {
    EXPECT_TRUE(MatchesReference(cpu::PagedAttention, c, rng, DType::kBF16)) << Describe(c);
    EXPECT_TRUE(MatchesReference(cpu::PagedAttentionPortable, c, rng, DType::kBF16))
        << "portable, " << Describe(c);
  }
}

// Equal weights (a zero query): the bf16 paths' rounding of the weights is exact, so a key seen
// or missed, a wrong block, head or mask shows at fp32's tolerance.
TEST(PagedAttentionTiled, Bf16CachesAverageTheVisibleValuesExactly) {
  std::mt19937 rng(1809);
  for (const Case& c : Cases()) {
    EXPECT_TRUE(MatchesReference(cpu::PagedAttention, c, rng, DType::kBF16, /*zero_query=*/true))
        << Describe(c);
    EXPECT_TRUE(
        MatchesReference(cpu::PagedAttentionPortable, c, rng, DType::kBF16, /*zero_query=*/true))
        << "portable, " << Describe(c);
  }
}

// The reference on bf16 caches is the reference on their values widened to f32 with the scaled
// query rounded to bf16 (nearest even), bit for bit.
TEST(PagedAttentionTiled, Bf16ReferenceReadsTheWidenedValues) {
  std::mt19937 rng(1808);
  const int64_t kBlocks = 6, kBlockSize = 16, kKv = 2, kHeads = 6, kDim = 64;
  HostTensor k16 = ToBf16(Random({kBlocks, kBlockSize, kKv, kDim}, rng));
  HostTensor v16 = ToBf16(Random({kBlocks, kBlockSize, kKv, kDim}, rng));
  HostTensor k32(DType::kF32, {kBlocks, kBlockSize, kKv, kDim});
  HostTensor v32(DType::kF32, {kBlocks, kBlockSize, kKv, kDim});
  for (int64_t i = 0; i < k16.numel(); ++i) {
    k32.data<float>()[i] = Bf16ToFloat(k16.data<uint16_t>()[i]);
    v32.data<float>()[i] = Bf16ToFloat(v16.data<uint16_t>()[i]);
  }
  HostTensor query = Random({5, kHeads, kDim}, rng, -2.0f, 2.0f);
  HostTensor rounded(DType::kF32, {5, kHeads, kDim});  // bf16(0.125 q), for scale 1
  for (int64_t i = 0; i < query.numel(); ++i) {
    rounded.data<float>()[i] = Bf16ToFloat(FloatToBf16(query.data<float>()[i] * 0.125f));
  }
  HostTensor a = Poisoned({5, kHeads, kDim}), b = Poisoned({5, kHeads, kDim});
  HostTensor t = Indices({4, 1, 5, 0, 2, 3}, DType::kI32, {2, 3});
  HostTensor l = Indices({40, 33}, DType::kI32);
  HostTensor q = Indices({0, 4, 5}, DType::kI32);
  const AttentionMetadata md{t.view(), l.view(), q.view()};
  ASSERT_TRUE(
      cpu::PagedAttentionReference(a.view(), query.view(), k16.view(), v16.view(), md, 0.125f)
          .ok());
  ASSERT_TRUE(
      cpu::PagedAttentionReference(b.view(), rounded.view(), k32.view(), v32.view(), md, 1.0f)
          .ok());
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]) << i;
}

// The model's query: a token-strided view into its fused qkv rows, on every path (row and tiled
// kernels, split decode, f32 and bf16 caches) and the reference.
TEST(PagedAttentionTiled, TokenStridedQueryGivesTheSameOutput) {
  std::mt19937 rng(1810);
  // Head sizes 64 (the AVX-512 kernels where the CPU has them) and 8 (the portable loops), every
  // group shape, block size 16; and the long contexts, long prefill and wide group of Cases().
  std::vector<Case> cases;
  for (const Case& c : Cases()) {
    if ((c.head_size == 64 || c.head_size == 8) && c.block_size == 16) cases.push_back(c);
  }
  cases.push_back({14, 2, 64, 16, {{2047, 1}}});  // one long decode row: split over its keys
  for (const Case& c : cases) {
    for (DType cache : {DType::kF32, DType::kBF16}) {
      EXPECT_TRUE(MatchesReference(cpu::PagedAttention, c, rng, cache, false, true))
          << DTypeName(cache) << ", " << Describe(c);
      EXPECT_TRUE(MatchesReference(cpu::PagedAttentionPortable, c, rng, cache, false, true))
          << "portable, " << DTypeName(cache) << ", " << Describe(c);
      EXPECT_TRUE(MatchesReference(cpu::PagedAttentionReference, c, rng, cache, false, true))
          << "reference, " << DTypeName(cache) << ", " << Describe(c);
    }
  }
}

// A sliding window (1, inside one key tile, past one, not a multiple of the block size, longer
// than most contexts) and a softcap, alone and together, on f32 and bf16 caches, on the
// production op and the portable loops: the head size 64 (the AVX-512 kernels where the CPU has
// them) and 8 and 80 (not a multiple of 16 or 32: the portable loops), block size 16, and the
// long decode, long prefill and wide group cases.
TEST(PagedAttentionTiled, WindowAndSoftcapMatchReference) {
  std::mt19937 rng(1811);
  std::vector<AttentionOptions> options;
  for (int window : {1, 5, 33, 50, 300}) options.push_back({1.0f, window, 0.0f});
  options.push_back({1.0f, 0, 2.0f});
  options.push_back({1.0f, 17, 3.0f});
  for (const Case& c : Cases()) {
    // Fewer cases: Cases() has them all.
    if (c.block_size != 16 || c.heads == 6 || c.head_size == 16 || c.head_size == 128) continue;
    for (const AttentionOptions& o : options) {
      for (DType cache : {DType::kF32, DType::kBF16}) {
        const std::string what = std::string(DTypeName(cache)) + ", window " +
                                 std::to_string(o.sliding_window) + ", softcap " +
                                 std::to_string(o.softcap) + ", " + Describe(c);
        EXPECT_TRUE(MatchesReference(cpu::PagedAttention, c, rng, cache, false, false, o)) << what;
        EXPECT_TRUE(MatchesReference(cpu::PagedAttentionPortable, c, rng, cache, false, false, o))
            << "portable, " << what;
      }
    }
  }
}

// Split decode rows with a window: the parts cover the window only (contexts of 2048 and 1500
// keys, windows of 700, 130, 64 and 4096).
TEST(PagedAttentionTiled, SplitDecodeWithWindowMatchesReference) {
  const int saved = omp_get_max_threads();
  std::mt19937 rng(1812);
  const std::vector<Case> cases = {{14, 2, 64, 16, {{2047, 1}}},
                                   {8, 1, 128, 16, {{1499, 1}, {600, 1}}},
                                   {16, 1, 16, 32, {{2999, 1}}}};
  for (int threads : {3, 8}) {
    omp_set_num_threads(threads);
    for (const Case& c : cases) {
      for (int window : {700, 130, 64, 4096}) {
        for (float softcap : {0.0f, 4.0f}) {
          const AttentionOptions o{1.0f, window, softcap};
          const std::string what = "window " + std::to_string(window) + ", softcap " +
                                   std::to_string(softcap) + ", " + Describe(c) + ", " +
                                   std::to_string(threads) + " threads";
          EXPECT_TRUE(MatchesReference(cpu::PagedAttention, c, rng, DType::kF32, false, false, o))
              << what;
          EXPECT_TRUE(MatchesReference(cpu::PagedAttention, c, rng, DType::kBF16, false, false, o))
              << "bf16, " << what;
        }
      }
    }
  }
  omp_set_num_threads(saved);
}

TEST(PagedAttentionTiled, PortableMatchesReference) {
  std::mt19937 rng(1802);
  for (const Case& c : Cases()) {
    EXPECT_TRUE(MatchesReference(cpu::PagedAttentionPortable, c, rng)) << Describe(c);
  }
}

TEST(PagedAttentionTiled, SameResultOnOneTwoAndThreeThreads) {
  const int saved = omp_get_max_threads();
  std::mt19937 rng(1803);
  const Case c{14, 2, 64, 16, {{0, 70}, {50, 33}, {66, 1}, {2047, 1}}};
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    EXPECT_TRUE(MatchesReference(cpu::PagedAttention, c, rng)) << threads << " threads";
  }
  omp_set_num_threads(saved);
  // The op's own cap, as llm-worker sets it, over OpenMP's default.
  for (int threads : {1, 3}) {
    cpu::SetPagedAttentionThreads(threads);
    EXPECT_TRUE(MatchesReference(cpu::PagedAttention, c, rng))
        << "SetPagedAttentionThreads(" << threads << ")";
  }
  cpu::SetPagedAttentionThreads(0);
}

// Fewer work items than two per thread: decode rows are split over their keys and the parts
// merged (f32 and bf16 caches) (batch 1 with GQA and MQA, contexts of 100 to 3000 keys: parts of
// two tiles and more, 130 keys in two parts of 64 and 66 (the last ends in a partial tile), and
// the 100 keys of two heads below the op's threshold for running on the pool).
TEST(PagedAttentionTiled, SplitDecodeMatchesReference) {
  const int saved = omp_get_max_threads();
  std::mt19937 rng(1806);
  const std::vector<Case> cases = {{14, 2, 64, 16, {{2047, 1}}},
                                   {8, 1, 128, 16, {{1499, 1}}},
                                   {16, 1, 16, 32, {{2999, 1}}},
                                   {4, 1, 64, 1, {{256, 1}}},
                                   {9, 3, 64, 16, {{1400, 1}, {1200, 1}}},
                                   {9, 3, 64, 16, {{130, 1}}},
                                   {2, 1, 64, 16, {{100, 1}}}};
  for (int threads : {2, 3, 8}) {
    omp_set_num_threads(threads);
    for (const Case& c : cases) {
      EXPECT_TRUE(MatchesReference(cpu::PagedAttention, c, rng))
          << Describe(c) << ", " << threads << " threads";
      EXPECT_TRUE(MatchesReference(cpu::PagedAttentionPortable, c, rng))
          << "portable, " << Describe(c) << ", " << threads << " threads";
      EXPECT_TRUE(MatchesReference(cpu::PagedAttention, c, rng, DType::kBF16))
          << "bf16 caches, " << Describe(c) << ", " << threads << " threads";
      EXPECT_TRUE(MatchesReference(cpu::PagedAttention, c, rng, DType::kBF16, /*zero_query=*/true))
          << "bf16 caches, zero query, " << Describe(c) << ", " << threads << " threads";
    }
  }
  omp_set_num_threads(saved);
}

// A query far from every key (scores near +-60) overflows exp() without the running max.
TEST(PagedAttentionTiled, LargeScoresStayFinite) {
  std::mt19937 rng(1804);
  const int64_t kBlocks = 8, kBlockSize = 16;
  HostTensor key_cache = Random({kBlocks, kBlockSize, 1, 64}, rng, 0.5f, 1.0f);
  HostTensor value_cache = Random({kBlocks, kBlockSize, 1, 64}, rng);
  HostTensor query = Random({3, 2, 64}, rng, 1.5f, 2.0f);
  HostTensor got = Poisoned({3, 2, 64}), want = Poisoned({3, 2, 64});
  HostTensor t = Indices({3, 1, 4, 0, 6, 2, 7, 5}, DType::kI32, {1, 8});
  HostTensor l = Indices({120}, DType::kI32);
  HostTensor q = Indices({0, 3}, DType::kI32);
  const AttentionMetadata md{t.view(), l.view(), q.view()};
  ASSERT_TRUE(cpu::PagedAttentionReference(want.view(), query.view(), key_cache.view(),
                                           value_cache.view(), md, 1.0f)
                  .ok());
  ASSERT_TRUE(
      cpu::PagedAttention(got.view(), query.view(), key_cache.view(), value_cache.view(), md, 1.0f)
          .ok());
  for (int64_t i = 0; i < got.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(got.data<float>()[i])) << i;
    ASSERT_NEAR(got.data<float>()[i], want.data<float>()[i],
                1e-5f + 1e-5f * std::abs(want.data<float>()[i]))
        << i;
  }
}

// The production op keeps the reference's metadata checks.
TEST(PagedAttentionTiled, BadBlockIdIsAnError) {
  std::mt19937 rng(1805);
  HostTensor key_cache = Random({4, 4, 2, 16}, rng), value_cache = Random({4, 4, 2, 16}, rng);
  HostTensor query = Random({1, 4, 16}, rng), out = Poisoned({1, 4, 16});
  HostTensor t = Indices({0, 9}, DType::kI32, {1, 2});
  HostTensor l = Indices({6}, DType::kI32);
  HostTensor q = Indices({0, 1}, DType::kI32);
  const AttentionMetadata md{t.view(), l.view(), q.view()};
  EXPECT_EQ(
      cpu::PagedAttention(out.view(), query.view(), key_cache.view(), value_cache.view(), md, 1.0f)
          .message,
      "PagedAttention: metadata.block_tables[0][1] = 9 is outside [0, 4)");
}

}  // namespace
}  // namespace llm::ops
