// PagedAttention against dense causal attention over each sequence's gathered K and V, for
// batches that mix prefill chunks (some after cached context) and decode tokens, with MHA,
// GQA and MQA, block sizes 1, 16 and 32, and every sequence's blocks scattered over the cache;
// also with a sliding window (smaller than, equal to and larger than the contexts, multiples of
// the block size and not) and a logit softcap, alone and together.
// The cache starts as NaN: a read of any slot the op should not touch poisons the output (with
// a window, the positions before the window of a sequence's first query row are NaN too, so
// that a kernel that reads the blocks before the window, instead of skipping them, fails).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/test_util.h"

namespace llm::ops {
namespace {

using testing::AllClose;
using ::testing::HasSubstr;
using testing::Indices;
using testing::Poisoned;
using testing::Random;

struct SeqSpec {
  int64_t num_cached;  // context already in the cache
  int64_t q_len;       // this step's tokens; seq_len = num_cached + q_len
};

// One batch laid out in a paged cache, with the dense K and V each sequence should see.
struct Batch {
  int64_t num_tokens = 0, max_blocks = 0;
  std::vector<int64_t> seq_lens, query_start_loc, block_tables, slot_mapping;
  std::vector<std::vector<float>> dense_k, dense_v;  // per sequence: [seq_len][Hkv][D]
};

Batch MakeBatch(const std::vector<SeqSpec>& seqs, int64_t block_size, int64_t num_blocks,
                int64_t row, std::mt19937& rng) {
  Batch b;
  std::vector<int64_t> used(seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t len = seqs[s].num_cached + seqs[s].q_len;
    used[s] = (len + block_size - 1) / block_size;
    b.max_blocks = std::max(b.max_blocks, used[s] + 2);  // spare columns hold garbage
  }
  std::vector<int64_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  b.block_tables.assign(seqs.size() * b.max_blocks, -7);
  size_t next = 0;
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  b.query_start_loc.push_back(0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t len = seqs[s].num_cached + seqs[s].q_len;
    for (int64_t i = 0; i < used[s]; ++i) b.block_tables[s * b.max_blocks + i] = perm[next++];
    b.seq_lens.push_back(len);
    b.num_tokens += seqs[s].q_len;
    b.query_start_loc.push_back(b.num_tokens);
    for (int64_t p = seqs[s].num_cached; p < len; ++p) {
      b.slot_mapping.push_back(b.block_tables[s * b.max_blocks + p / block_size] * block_size +
                               p % block_size);
    }
    b.dense_k.emplace_back(len * row);
    b.dense_v.emplace_back(len * row);
    for (float& x : b.dense_k.back()) x = dist(rng);
    for (float& x : b.dense_v.back()) x = dist(rng);
  }
  return b;
}

// out[t][h][d] of causal attention over seq s's dense K and V, in double. window > 0: the row
// at position pos sees the keys k with pos - k < window only; softcap > 0: each score s (scale
// applied) becomes softcap * tanh(s / softcap).
std::vector<double> DenseAttention(const Batch& b, const float* query, int64_t heads,
                                   int64_t kv_heads, int64_t head_size, double scale,
                                   int64_t window = 0, double softcap = 0) {
  std::vector<double> out(b.num_tokens * heads * head_size);
  const int64_t group = heads / kv_heads;
  for (size_t s = 0; s < b.seq_lens.size(); ++s) {
    const int64_t q_len = b.query_start_loc[s + 1] - b.query_start_loc[s];
    for (int64_t j = 0; j < q_len; ++j) {
      const int64_t t = b.query_start_loc[s] + j;
      const int64_t pos = b.seq_lens[s] - q_len + j;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t kvh = h / group;
        const float* q = query + (t * heads + h) * head_size;
        std::vector<double> scores(pos + 1, -INFINITY);
        for (int64_t k = 0; k <= pos; ++k) {
          if (window > 0 && pos - k >= window) continue;  // outside the window: weight 0
          const float* key = b.dense_k[s].data() + (k * kv_heads + kvh) * head_size;
          double dot = 0;
          for (int64_t d = 0; d < head_size; ++d) dot += double(q[d]) * key[d];
          scores[k] = dot * scale;
          if (softcap > 0) scores[k] = softcap * std::tanh(scores[k] / softcap);
        }
        const double m = *std::max_element(scores.begin(), scores.end());
        double sum = 0;
        for (double& x : scores) sum += (x = std::exp(x - m));
        double* o = out.data() + (t * heads + h) * head_size;
        for (int64_t k = 0; k <= pos; ++k) {
          if (scores[k] == 0) continue;  // outside the window
          const float* v = b.dense_v[s].data() + (k * kv_heads + kvh) * head_size;
          for (int64_t d = 0; d < head_size; ++d) o[d] += scores[k] / sum * v[d];
        }
      }
    }
  }
  return out;
}

// Cached context goes straight into the cache; this step's K and V through ReshapeAndCache,
// as the model runner does.
void FillCache(const Batch& b, const std::vector<SeqSpec>& seqs, int64_t block_size, int64_t row,
               const HostTensor& key_cache, const HostTensor& value_cache) {
  HostTensor new_k(DType::kF32, {b.num_tokens, row}), new_v(DType::kF32, {b.num_tokens, row});
  int64_t t = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int64_t p = 0; p < b.seq_lens[s]; ++p) {
      const float* k = b.dense_k[s].data() + p * row;
      const float* v = b.dense_v[s].data() + p * row;
      if (p < seqs[s].num_cached) {
        const int64_t slot =
            b.block_tables[s * b.max_blocks + p / block_size] * block_size + p % block_size;
        std::copy(k, k + row, key_cache.data<float>() + slot * row);
        std::copy(v, v + row, value_cache.data<float>() + slot * row);
      } else {
        std::copy(k, k + row, new_k.data<float>() + t * row);
        std::copy(v, v + row, new_v.data<float>() + t * row);
        ++t;
      }
    }
  }
  const int64_t kv_heads = key_cache.view().shape[2], head_size = key_cache.view().shape[3];
  HostTensor slots = Indices(b.slot_mapping, DType::kI64);
  ASSERT_TRUE(ReshapeAndCache({},
                              TensorView::Contiguous(new_k.data<float>(), DType::kF32,
                                                     {b.num_tokens, kv_heads, head_size}),
                              TensorView::Contiguous(new_v.data<float>(), DType::kF32,
                                                     {b.num_tokens, kv_heads, head_size}),
                              key_cache.view(), value_cache.view(), slots.view())
                  .ok());
}

struct Heads {
  int64_t q, kv;
};

TEST(PagedAttention, MatchesDenseAttentionOnMixedBatches) {
  // Decode tokens at contexts 1, 15, 17 and 40; prefill chunks of 15 and 17 from scratch, of
  // 17 after 16 cached tokens, of 1 after 31 and of 15 after 33 (ends inside a block).
  const std::vector<SeqSpec> seqs = {{0, 1},  {0, 15}, {14, 1}, {16, 17}, {16, 1},
                                     {0, 17}, {39, 1}, {31, 1}, {33, 15}};
  constexpr int64_t kHeadSize = 16;
  std::mt19937 rng(80);
  for (int64_t block_size : {1, 16, 32}) {
    for (Heads heads : {Heads{4, 4}, Heads{8, 2}, Heads{4, 1}}) {
      const int64_t row = heads.kv * kHeadSize;
      int64_t needed = 0;
      for (const SeqSpec& s : seqs)
        needed += (s.num_cached + s.q_len + block_size - 1) / block_size;
      const int64_t num_blocks = needed + 5;
      const Batch b = MakeBatch(seqs, block_size, num_blocks, row, rng);
      HostTensor key_cache = Poisoned({num_blocks, block_size, heads.kv, kHeadSize});
      HostTensor value_cache = Poisoned({num_blocks, block_size, heads.kv, kHeadSize});
      FillCache(b, seqs, block_size, row, key_cache, value_cache);
      HostTensor query = Random({b.num_tokens, heads.q, kHeadSize}, rng);
      HostTensor out = Poisoned({b.num_tokens, heads.q, kHeadSize});
      const int64_t num_seqs = static_cast<int64_t>(seqs.size());
      HostTensor tables = Indices(b.block_tables, DType::kI32, {num_seqs, b.max_blocks});
      HostTensor seq_lens = Indices(b.seq_lens, DType::kI32);
      HostTensor qsl = Indices(b.query_start_loc, DType::kI32);
      const AttentionMetadata md{tables.view(), seq_lens.view(), qsl.view(), 48};
      const float scale = 1.0f / std::sqrt(float(kHeadSize));
      ASSERT_TRUE(PagedAttention({}, out.view(), query.view(), key_cache.view(), value_cache.view(),
                                 md, scale)
                      .ok());
      EXPECT_TRUE(AllClose(
          out.data<float>(),
          DenseAttention(b, query.data<float>(), heads.q, heads.kv, kHeadSize, scale), 1e-5, 1e-4))
          << "block_size " << block_size << ", heads " << heads.q << "/" << heads.kv;
    }
  }
}

TEST(PagedAttention, LargeScoresStayFinite) {
  // Scores around 60 would overflow exp() without the running max.
  const std::vector<SeqSpec> seqs = {{40, 3}};
  std::mt19937 rng(81);
  constexpr int64_t kBlockSize = 16, kHeadSize = 8, kRow = kHeadSize;
  const Batch b = MakeBatch(seqs, kBlockSize, 6, kRow, rng);
  HostTensor key_cache = Poisoned({6, kBlockSize, 1, kHeadSize});
  HostTensor value_cache = Poisoned({6, kBlockSize, 1, kHeadSize});
  FillCache(b, seqs, kBlockSize, kRow, key_cache, value_cache);
  HostTensor query = Random({3, 2, kHeadSize}, rng, 10.0f, 12.0f);
  HostTensor out = Poisoned({3, 2, kHeadSize});
  HostTensor tables = Indices(b.block_tables, DType::kI32, {1, b.max_blocks});
  HostTensor seq_lens = Indices(b.seq_lens, DType::kI32);
  HostTensor qsl = Indices(b.query_start_loc, DType::kI32);
  const AttentionMetadata md{tables.view(), seq_lens.view(), qsl.view()};
  ASSERT_TRUE(
      PagedAttention({}, out.view(), query.view(), key_cache.view(), value_cache.view(), md, 1.0f)
          .ok());
  EXPECT_TRUE(AllClose(out.data<float>(),
                       DenseAttention(b, query.data<float>(), 2, 1, kHeadSize, 1.0), 1e-5, 1e-4));
}

// A batch in a poisoned cache with its dense K and V, and with `options`' window the positions
// before the window of each sequence's first query row (which no row of it sees) NaN again;
// runs ops::PagedAttention and the CPU reference with `options` and compares both with
// DenseAttention.
::testing::AssertionResult MatchesDense(const std::vector<SeqSpec>& seqs, int64_t block_size,
                                        Heads heads, const AttentionOptions& options,
                                        std::mt19937& rng, float q_range = 1.0f,
                                        const AttentionOptions* dense_options = nullptr) {
  constexpr int64_t kHeadSize = 16;
  const int64_t row = heads.kv * kHeadSize;
  int64_t needed = 0;
  for (const SeqSpec& s : seqs) needed += (s.num_cached + s.q_len + block_size - 1) / block_size;
  const int64_t num_blocks = needed + 5;
  const Batch b = MakeBatch(seqs, block_size, num_blocks, row, rng);
  HostTensor key_cache = Poisoned({num_blocks, block_size, heads.kv, kHeadSize});
  HostTensor value_cache = Poisoned({num_blocks, block_size, heads.kv, kHeadSize});
  FillCache(b, seqs, block_size, row, key_cache, value_cache);
  if (options.sliding_window > 0) {
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int64_t first_seen = seqs[s].num_cached - options.sliding_window + 1;
      for (int64_t p = 0; p < first_seen; ++p) {
        const int64_t slot =
            b.block_tables[s * b.max_blocks + p / block_size] * block_size + p % block_size;
        std::fill_n(key_cache.data<float>() + slot * row, row, NAN);
        std::fill_n(value_cache.data<float>() + slot * row, row, NAN);
      }
    }
  }
  HostTensor query = Random({b.num_tokens, heads.q, kHeadSize}, rng, -q_range, q_range);
  const int64_t num_seqs = static_cast<int64_t>(seqs.size());
  HostTensor tables = Indices(b.block_tables, DType::kI32, {num_seqs, b.max_blocks});
  HostTensor seq_lens = Indices(b.seq_lens, DType::kI32);
  HostTensor qsl = Indices(b.query_start_loc, DType::kI32);
  const AttentionMetadata md{tables.view(), seq_lens.view(), qsl.view()};
  const AttentionOptions& dense = dense_options != nullptr ? *dense_options : options;
  const std::vector<double> want =
      DenseAttention(b, query.data<float>(), heads.q, heads.kv, kHeadSize, options.scale,
                     dense.sliding_window, dense.softcap);
  HostTensor out = Poisoned({b.num_tokens, heads.q, kHeadSize});
  if (OpStatus st = PagedAttention({}, out.view(), query.view(), key_cache.view(),
                                   value_cache.view(), md, options);
      !st.ok()) {
    return ::testing::AssertionFailure() << st.message;
  }
  if (::testing::AssertionResult r = AllClose(out.data<float>(), want, 1e-5, 1e-4); !r) return r;
  HostTensor ref = Poisoned({b.num_tokens, heads.q, kHeadSize});
  if (OpStatus st = cpu::PagedAttentionReference(ref.view(), query.view(), key_cache.view(),
                                                 value_cache.view(), md, options);
      !st.ok()) {
    return ::testing::AssertionFailure() << "reference: " << st.message;
  }
  return AllClose(ref.data<float>(), want, 1e-5, 1e-4) << " (the reference)";
}

// Decode tokens at contexts 1, 15, 17 and 40; prefill chunks of 15, 17 and 70 (past the CPU's
// 64-row query tile) from scratch, of 17 after 16 cached, of 1 after 31, of 15 after 33 and of
// 20 after 60.
const std::vector<SeqSpec> kWindowSeqs = {{0, 1},  {0, 15}, {14, 1},  {16, 17}, {16, 1}, {0, 17},
                                          {39, 1}, {31, 1}, {33, 15}, {0, 70},  {60, 20}};

TEST(PagedAttention, SlidingWindowMatchesDenseAttention) {
  // Windows of 1 (the row's own key), below, at and past the block sizes, not multiples of
  // them, and longer than every context (no position hidden: plain causal attention).
  std::mt19937 rng(90);
  for (int64_t window : {1, 5, 16, 17, 33, 48, 200}) {
    for (int64_t block_size : {1, 16, 32}) {
      for (Heads heads : {Heads{4, 4}, Heads{8, 2}, Heads{4, 1}}) {
        AttentionOptions options;
        options.scale = 0.25f;
        options.sliding_window = static_cast<int>(window);
        EXPECT_TRUE(MatchesDense(kWindowSeqs, block_size, heads, options, rng))
            << "window " << window << ", block_size " << block_size << ", heads " << heads.q << "/"
            << heads.kv;
      }
    }
  }
}

TEST(PagedAttention, SoftcapMatchesDenseAttention) {
  // Queries in [-3, 3]: scores up to ~10, well past the smaller caps. Softcap alone and with a
  // window.
  std::mt19937 rng(91);
  for (float softcap : {1.0f, 5.0f, 30.0f}) {
    for (int window : {0, 7, 40}) {
      for (Heads heads : {Heads{4, 4}, Heads{8, 2}}) {
        AttentionOptions options;
        options.scale = 0.25f;
        options.sliding_window = window;
        options.softcap = softcap;
        EXPECT_TRUE(MatchesDense(kWindowSeqs, 16, heads, options, rng, 3.0f))
            << "softcap " << softcap << ", window " << window << ", heads " << heads.q << "/"
            << heads.kv;
      }
    }
  }
}

// The comparisons above can fail: a window one key longer, or no softcap, in the dense
// attention gives another output.
TEST(PagedAttention, WrongWindowOrSoftcapIsCaught) {
  std::mt19937 rng(92);
  AttentionOptions options;
  options.scale = 0.25f;
  options.sliding_window = 7;
  AttentionOptions wider = options;
  wider.sliding_window = 8;
  EXPECT_FALSE(MatchesDense(kWindowSeqs, 16, Heads{4, 2}, options, rng, 1.0f, &wider));
  AttentionOptions capped = options;
  capped.sliding_window = 0;
  capped.softcap = 2.0f;
  AttentionOptions uncapped = capped;
  uncapped.softcap = 0.0f;
  EXPECT_FALSE(MatchesDense(kWindowSeqs, 16, Heads{4, 2}, capped, rng, 3.0f, &uncapped));
  EXPECT_TRUE(MatchesDense(kWindowSeqs, 16, Heads{4, 2}, capped, rng, 3.0f));
}

class PagedAttentionErrors : public ::testing::Test {
 protected:
  OpStatus Run(const std::vector<int64_t>& tables, const std::vector<int64_t>& seq_lens,
               const std::vector<int64_t>& qsl, int64_t heads = 4, int max_seq_len = 0) {
    HostTensor t = Indices(tables, DType::kI32, {2, 2});
    HostTensor l = Indices(seq_lens, DType::kI32);
    HostTensor q = Indices(qsl, DType::kI32);
    HostTensor query = Random({3, heads, 8}, rng_);
    HostTensor out = Poisoned({3, heads, 8});
    const AttentionMetadata md{t.view(), l.view(), q.view(), max_seq_len};
    return PagedAttention({}, out.view(), query.view(), key_cache_.view(), value_cache_.view(), md,
                          1.0f);
  }
  std::mt19937 rng_{82};
  HostTensor key_cache_ = Random({4, 4, 2, 8}, rng_);
  HostTensor value_cache_ = Random({4, 4, 2, 8}, rng_);
};

TEST_F(PagedAttentionErrors, ValidBatchRuns) {
  EXPECT_TRUE(Run({0, 1, 2, 3}, {5, 1}, {0, 2, 3}).ok());
}

TEST_F(PagedAttentionErrors, BlockIdOutOfRange) {
  EXPECT_EQ(Run({0, 4, 2, 3}, {5, 1}, {0, 2, 3}).message,
            "PagedAttention: metadata.block_tables[0][1] = 4 is outside [0, 4)");
}

TEST_F(PagedAttentionErrors, SeqLenShorterThanItsQueries) {
  EXPECT_EQ(Run({0, 1, 2, 3}, {1, 1}, {0, 2, 3}).message,
            "PagedAttention: metadata.seq_lens[0] = 1 is less than its 2 query tokens");
}

TEST_F(PagedAttentionErrors, TooFewBlockTableColumns) {
  EXPECT_EQ(Run({0, 1, 2, 3}, {9, 1}, {0, 2, 3}).message,
            "PagedAttention: metadata.seq_lens[0] = 9 needs 3 blocks of 4 but block_tables has "
            "2 columns");
}

TEST_F(PagedAttentionErrors, QueryStartLocMustCoverTheTokens) {
  EXPECT_EQ(Run({0, 1, 2, 3}, {5, 1}, {0, 2, 2}).message,
            "PagedAttention: metadata.query_start_loc must start at 0 and end at the 3 query "
            "tokens, got 0 .. 2");
  EXPECT_EQ(Run({0, 1, 2, 3}, {5, 1}, {0, 2}).message,
            "PagedAttention: metadata.query_start_loc: expected i32 [3], got i32 [2] on cpu");
}

TEST_F(PagedAttentionErrors, HeadsMustBeAMultipleOfKvHeads) {
  EXPECT_EQ(Run({0, 1, 2, 3}, {5, 1}, {0, 2, 3}, 3).message,
            "PagedAttention: query heads (3) must be a multiple of key_cache's kv heads (2)");
}

// The query may be a token-strided view (the model's q inside its fused qkv rows): the same
// output as the contiguous query. Other layouts are refused, naming the strides; out must be
// contiguous.
TEST_F(PagedAttentionErrors, QueryMayBeTokenStridedOnly) {
  HostTensor t = Indices({0, 1, 2, 3}, DType::kI32, {2, 2});
  HostTensor l = Indices({5, 1}, DType::kI32);
  HostTensor q = Indices({0, 2, 3}, DType::kI32);
  const AttentionMetadata md{t.view(), l.view(), q.view()};
  HostTensor query = Random({3, 4, 8}, rng_);
  HostTensor qkv = testing::PoisonedRows(DType::kF32, 3, (4 + 2 * 2) * 8);
  testing::PutHeads(qkv, 0, query);
  const TensorView strided = testing::HeadsView(qkv.view(), 0, 4, 8);
  HostTensor want = Poisoned({3, 4, 8}), got = Poisoned({3, 4, 8});
  ASSERT_TRUE(PagedAttention({}, want.view(), query.view(), key_cache_.view(), value_cache_.view(),
                             md, 1.0f)
                  .ok());
  const OpStatus s =
      PagedAttention({}, got.view(), strided, key_cache_.view(), value_cache_.view(), md, 1.0f);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_TRUE(testing::SameBytes(got, want));

  TensorView heads_apart = strided;  // heads 9 floats apart: not a token-strided view
  heads_apart.strides[1] = 9;
  EXPECT_EQ(
      PagedAttention({}, got.view(), heads_apart, key_cache_.view(), value_cache_.view(), md, 1.0f)
          .message,
      "PagedAttention: query: expected contiguous heads with a token stride (strides [>= 32, "
      "8, 1]), got f32 [3, 4, 8] on cpu with strides [64, 9, 1]");
  TensorView overlapping = strided;  // tokens closer than their heads' 32 floats
  overlapping.strides[0] = 16;
  EXPECT_THAT(
      PagedAttention({}, got.view(), overlapping, key_cache_.view(), value_cache_.view(), md, 1.0f)
          .message,
      HasSubstr("with strides [16, 8, 1]"));
  EXPECT_THAT(PagedAttention({}, testing::HeadsView(qkv.view(), 0, 4, 8), query.view(),
                             key_cache_.view(), value_cache_.view(), md, 1.0f)
                  .message,
              HasSubstr("PagedAttention: out: must be contiguous"));
}

TEST_F(PagedAttentionErrors, NegativeWindowOrSoftcapIsAnError) {
  HostTensor t = Indices({0, 1, 2, 3}, DType::kI32, {2, 2});
  HostTensor l = Indices({5, 1}, DType::kI32);
  HostTensor q = Indices({0, 2, 3}, DType::kI32);
  const AttentionMetadata md{t.view(), l.view(), q.view()};
  HostTensor query = Random({3, 4, 8}, rng_);
  HostTensor out = Poisoned({3, 4, 8});
  auto run = [&](int window, float softcap) {
    AttentionOptions options;
    options.sliding_window = window;
    options.softcap = softcap;
    return PagedAttention({}, out.view(), query.view(), key_cache_.view(), value_cache_.view(), md,
                          options)
        .message;
  };
  EXPECT_EQ(run(0, 0.0f), "");
  EXPECT_EQ(run(3, 50.0f), "");
  EXPECT_EQ(run(-1, 0.0f),
            "PagedAttention: options.sliding_window must be >= 0 (0 = none), got -1");
  EXPECT_THAT(run(0, -1.0f),
              HasSubstr("PagedAttention: options.softcap must be finite and >= 0 (0 = none), got "
                        "-1"));
  EXPECT_THAT(run(0, NAN), HasSubstr("options.softcap must be finite and >= 0"));
  EXPECT_THAT(run(0, INFINITY), HasSubstr("options.softcap must be finite and >= 0"));
}

TEST_F(PagedAttentionErrors, MaxSeqLenIsAnUpperBound) {
  EXPECT_EQ(Run({0, 1, 2, 3}, {5, 1}, {0, 2, 3}, 4, 4).message,
            "PagedAttention: metadata.seq_lens[0] = 5 exceeds metadata.max_seq_len 4");
}

}  // namespace
}  // namespace llm::ops
