// PrefillAttentionMma (kernels/cuda/paged_attention_prefill.h, the tensor-core prefill kernel)
// called directly, against the CPU op ops::PagedAttention on f32 tensors that hold the same
// 16-bit-rounded query and cache values: bf16 and f16, head sizes 64 and 128, block sizes 16
// and 32, MHA, GQA and MQA, chunks of 15, 17 and 1000 tokens after no or some cached context
// (contexts ending inside a block), mixed batches, with and without the q_lens on the host
// (exact grid and host-listed tiles vs the upper-bound grid and the device-side search).
//
// Every cache slot no sequence owns is NaN (two whole blocks and the tails of the last blocks),
// block tables are scattered by a random permutation with -1 past each sequence's last block,
// and the output is NaN-poisoned (0xFFFF) before each launch: rows of sequences with
// q_len > 1 must match the reference, rows with q_len == 1 must still be poison bit for bit.
//
// Tolerance |got - want| <= atol + rtol |want|: bf16 atol 8e-3, rtol 8e-3; f16 atol 1.5e-3,
// rtol 1.5e-3. The kernel rounds P (softmax numerators, in [0, 1]) to the dtype before P V
// (bf16: 2^-9 relative, f16: 2^-12) and rounds the output to it (the same again); scores and
// sums are f32. Inputs in [-1, 1]. Measured under the emulation (f32 sums of exact products,
// as HMMA): largest error 2.9e-3 (bf16) and 3.8e-4 (f16) over this file's cases.
//
// With a sliding window and a softcap (AttentionOptions) the same against the CPU op with the
// same options; the positions before each sequence's first window are NaN in the caches, so
// that a kernel that reads the key tiles before a window (rather than skipping them) fails.
#include "kernels/cuda/paged_attention_prefill.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "tests/gpu/gpu_test_util.h"

namespace llm::ops {
namespace {

using cuda::PrefillAttentionMma;
using gpu_testing::CudaTest;
using gpu_testing::DeviceTensor;
using gpu_testing::Indices;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::RoundedThroughHalf;
using gpu_testing::ToHalf;

struct SeqSpec {
  int64_t q_len;    // query rows this step
  int64_t seq_len;  // context, this step's rows included
};

struct Shape {
  int64_t num_heads, num_kv_heads, head_size, block_size;
};

struct Batch {
  DType dtype;
  HostTensor query, key_cache, value_cache, block_tables, seq_lens, query_start_loc;
  std::vector<int32_t> qsl_host;
  std::vector<int64_t> q_lens;
  int max_seq_len = 0;
  DeviceTensor d_query, d_key_cache, d_value_cache, d_block_tables, d_seq_lens, d_qsl;

  AttentionMetadata HostMetadata() const {
    return {block_tables.view(), seq_lens.view(), query_start_loc.view(), max_seq_len};
  }
  AttentionMetadata DeviceMetadata(bool with_host_qsl) const {
    AttentionMetadata md{d_block_tables.view(), d_seq_lens.view(), d_qsl.view(), max_seq_len};
    if (with_host_qsl) md.query_start_loc_host = qsl_host;
    return md;
  }
};

Batch MakeBatch(const std::vector<SeqSpec>& seqs, const Shape& shape, DType dtype,
                std::mt19937& rng) {
  const int64_t bs = shape.block_size;
  const int64_t num_seqs = static_cast<int64_t>(seqs.size());
  int64_t num_tokens = 0, total_blocks = 0, max_blocks = 1;
  std::vector<int64_t> qsl = {0}, lens;
  Batch b;
  b.dtype = dtype;
  for (const SeqSpec& s : seqs) {
    num_tokens += s.q_len;
    qsl.push_back(num_tokens);
    lens.push_back(s.seq_len);
    b.q_lens.push_back(s.q_len);
    const int64_t blocks = (s.seq_len + bs - 1) / bs;
    total_blocks += blocks;
    max_blocks = std::max(max_blocks, blocks + 1);
    b.max_seq_len = std::max(b.max_seq_len, static_cast<int>(s.seq_len));
  }
  const int64_t num_blocks = total_blocks + 2;
  std::vector<int64_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int64_t> table(num_seqs * max_blocks, -1);
  HostTensor key = Poisoned({num_blocks, bs, shape.num_kv_heads, shape.head_size});
  HostTensor value = Poisoned({num_blocks, bs, shape.num_kv_heads, shape.head_size});
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int64_t slot_numel = shape.num_kv_heads * shape.head_size;
  int64_t next = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    for (int64_t pos = 0; pos < seqs[s].seq_len; ++pos) {
      if (pos % bs == 0) table[s * max_blocks + pos / bs] = ids[next++];
      const int64_t slot = table[s * max_blocks + pos / bs] * bs + pos % bs;
      for (int64_t i = 0; i < slot_numel; ++i) {
        key.data<float>()[slot * slot_numel + i] = dist(rng);
        value.data<float>()[slot * slot_numel + i] = dist(rng);
      }
    }
  }
  b.query = RoundedThroughHalf(
      Random({num_tokens, shape.num_heads, shape.head_size}, rng, -1.0f, 1.0f), dtype);
  b.key_cache = RoundedThroughHalf(key, dtype);
  b.value_cache = RoundedThroughHalf(value, dtype);
  b.block_tables = Indices(table, DType::kI32, {num_seqs, max_blocks});
  b.seq_lens = Indices(lens, DType::kI32);
  b.query_start_loc = Indices(qsl, DType::kI32);
  b.qsl_host.assign(qsl.begin(), qsl.end());
  b.d_query = DeviceTensor(ToHalf(b.query, dtype));
  b.d_key_cache = DeviceTensor(ToHalf(b.key_cache, dtype));
  b.d_value_cache = DeviceTensor(ToHalf(b.value_cache, dtype));
  b.d_block_tables = DeviceTensor(b.block_tables);
  b.d_seq_lens = DeviceTensor(b.seq_lens);
  b.d_qsl = DeviceTensor(b.query_start_loc);
  return b;
}

float Widen(const HostTensor& t, int64_t i) {
  uint16_t bits;
  std::memcpy(&bits, static_cast<const char*>(t.view().data) + 2 * i, 2);
  if (t.view().dtype == DType::kF16) {
    __half h;
    std::memcpy(&h, &bits, 2);
    return __half2float(h);
  }
  __nv_bfloat16 h;
  std::memcpy(&h, &bits, 2);
  return __bfloat162float(h);
}

uint16_t Bits(const HostTensor& t, int64_t i) {
  uint16_t bits;
  std::memcpy(&bits, static_cast<const char*>(t.view().data) + 2 * i, 2);
  return bits;
}

class CudaPrefillAttention : public CudaTest {
 protected:
  static HostTensor Reference(const Batch& b, const AttentionOptions& options) {
    const auto& shape = b.query.view().shape;
    HostTensor want = Poisoned({shape[0], shape[1], shape[2]});
    const OpStatus s = PagedAttention({}, want.view(), b.query.view(), b.key_cache.view(),
                                      b.value_cache.view(), b.HostMetadata(), options);
    EXPECT_TRUE(s.ok()) << s.message;
    return want;
  }
  static HostTensor Reference(const Batch& b, float scale) {
    return Reference(b, AttentionOptions{scale});
  }

  // Runs the kernel without and with the q_lens on the host into a freshly poisoned output
  // each; prefill rows are compared with the CPU op, decode rows must stay poison.
  static void ExpectMatches(const Batch& b, float scale) {
    ExpectMatches(b, AttentionOptions{scale});
  }
  static void ExpectMatches(const Batch& b, const AttentionOptions& options) {
    const HostTensor want = Reference(b, options);
    const auto& shape = b.query.view().shape;
    const int64_t row_numel = shape[1] * shape[2];
    const bool bf16 = b.dtype == DType::kBF16;
    const double atol = bf16 ? 8e-3 : 1.5e-3, rtol = bf16 ? 8e-3 : 1.5e-3;
    DeviceTensor out(ToHalf(want, b.dtype));
    for (const bool host_qsl : {false, true}) {
      SCOPED_TRACE(host_qsl ? "q_lens on the host" : "q_lens on the device only");
      out.Poison();
      const OpStatus s =
          PrefillAttentionMma({}, out.view(), b.d_query.view(), b.d_key_cache.view(),
                              b.d_value_cache.view(), b.DeviceMetadata(host_qsl), options);
      ASSERT_TRUE(s.ok()) << s.message;
      ASSERT_EQ(Sync(), "");
      const HostTensor got = out.Download();
      int64_t t = 0, bad = 0;
      double max_err = 0.0;
      for (int64_t q_len : b.q_lens) {
        for (int64_t j = 0; j < q_len; ++j, ++t) {
          for (int64_t e = t * row_numel; e < (t + 1) * row_numel; ++e) {
            if (q_len == 1) {
              if (Bits(got, e) != 0xFFFF && bad++ < 5) {
                ADD_FAILURE() << "decode row " << t << " was written (element " << e << ")";
              }
              continue;
            }
            const double w = want.data<float>()[e], g = Widen(got, e);
            const double err = std::fabs(g - w);
            if (!(err <= atol + rtol * std::fabs(w))) {
              if (bad++ < 5) {
                ADD_FAILURE() << "row " << t << " element " << e % row_numel << ": got " << g
                              << ", want " << w;
              }
            } else {
              max_err = std::max(max_err, err);
            }
          }
        }
      }
      EXPECT_EQ(bad, 0) << "mismatches; max error of the others " << max_err;
    }
  }
};

constexpr DType kDTypes[] = {DType::kBF16, DType::kF16};

// Chunks of 15 and 17 rows after no context and after a context ending inside a block, every
// head size, block size and head grouping, both dtypes.
TEST_F(CudaPrefillAttention, ChunksMatchCpu) {
  std::mt19937 rng(1);
  for (const DType dtype : kDTypes) {
    for (const int64_t head_size : {64, 128}) {
      for (const int64_t block_size : {16, 32}) {
        for (const auto [hq, hkv] : {std::pair<int64_t, int64_t>{2, 2}, {4, 2}, {3, 1}}) {
          SCOPED_TRACE(::testing::Message()
                       << DTypeName(dtype) << " head " << head_size << " block " << block_size
                       << " Hq " << hq << " Hkv " << hkv);
          const Shape shape{hq, hkv, head_size, block_size};
          const Batch b =
              MakeBatch({{15, 15}, {17, 17 + 21}, {17, 17}, {15, 15 + 2 * block_size + 3}}, shape,
                        dtype, rng);
          ExpectMatches(b, 1.0f / std::sqrt(static_cast<float>(head_size)));
        }
      }
    }
  }
}

// 1000-token chunks: many tiles per sequence and key tiles per row, causal across them.
TEST_F(CudaPrefillAttention, LongChunksMatchCpu) {
  std::mt19937 rng(2);
  {
    SCOPED_TRACE("bf16 head 128 block 16 GQA, 1000 rows after 45 cached");
    const Batch b = MakeBatch({{1000, 1045}}, {2, 1, 128, 16}, DType::kBF16, rng);
    ExpectMatches(b, 1.0f / std::sqrt(128.0f));
  }
  {
    SCOPED_TRACE("f16 head 64 block 32 MHA, 1000 rows, no context");
    const Batch b = MakeBatch({{1000, 1000}}, {1, 1, 64, 32}, DType::kF16, rng);
    ExpectMatches(b, 0.125f);
  }
}

// A mixed batch: decode rows (q_len 1) between prefill chunks stay untouched.
TEST_F(CudaPrefillAttention, MixedBatchLeavesDecodeRowsUntouched) {
  std::mt19937 rng(3);
  for (const DType dtype : kDTypes) {
    for (const int64_t head_size : {64, 128}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " head " << head_size);
      const Batch b = MakeBatch({{1, 40}, {17, 17 + 50}, {1, 1}, {15, 15}, {70, 70 + 9}, {1, 33}},
                                {4, 1, head_size, 16}, dtype, rng);
      ExpectMatches(b, 0.3f);
    }
  }
}

// More prefill sequences than the host lists in the kernel parameters: the device search.
TEST_F(CudaPrefillAttention, ManyShortSequences) {
  std::mt19937 rng(4);
  std::vector<SeqSpec> seqs;
  for (int i = 0; i < 70; ++i) seqs.push_back(i % 5 == 0 ? SeqSpec{1, 5 + i} : SeqSpec{2, 2 + i});
  const Batch b = MakeBatch(seqs, {2, 2, 64, 16}, DType::kBF16, rng);
  ExpectMatches(b, 0.125f);
}

// A decode-only batch: nothing is launched or written.
TEST_F(CudaPrefillAttention, DecodeOnlyBatchIsUntouched) {
  std::mt19937 rng(5);
  const Batch b = MakeBatch({{1, 20}, {1, 3}}, {2, 1, 64, 16}, DType::kF16, rng);
  ExpectMatches(b, 0.125f);
}

// b's caches with the positions before each sequence's first query row's window NaN (host and
// device): no row sees them, and the kernel must not read them.
void PoisonBeforeWindows(Batch& b, int window) {
  if (window <= 0) return;
  const auto& shape = b.key_cache.view().shape;  // [num_blocks, block_size, Hkv, D]
  const int64_t bs = shape[1], row = shape[2] * shape[3];
  const int64_t max_blocks = b.block_tables.view().shape[1];
  for (size_t s = 0; s < b.q_lens.size(); ++s) {
    const int64_t first = b.seq_lens.data<int32_t>()[s] - b.q_lens[s] - window + 1;
    for (int64_t p = 0; p < first; ++p) {
      const int64_t slot = b.block_tables.data<int32_t>()[s * max_blocks + p / bs] * bs + p % bs;
      std::fill_n(b.key_cache.data<float>() + slot * row, row, NAN);
      std::fill_n(b.value_cache.data<float>() + slot * row, row, NAN);
    }
  }
  b.d_key_cache = DeviceTensor(ToHalf(b.key_cache, b.dtype));
  b.d_value_cache = DeviceTensor(ToHalf(b.value_cache, b.dtype));
}

// Sliding windows of 1, 10, 64, 65 (around the 64-key tile) and longer than every
// context, and a softcap of 0.5 alone and with a window: 150 rows after 30 cached (three row
// tiles, the later ones skipping whole key tiles before their windows, warps skipping key tiles
// before theirs) and a mixed batch; bf16 and f16 at head 64, bf16 at head 128.
TEST_F(CudaPrefillAttention, WindowAndSoftcapMatchCpu) {
  std::mt19937 rng(9);
  const std::vector<std::vector<SeqSpec>> batches = {{{150, 180}},
                                                     {{1, 40}, {17, 67}, {70, 79}, {15, 15}}};
  struct Opt {
    int window;
    float softcap;
  };
  struct Kind {
    DType dtype;
    int64_t head_size;
  };
  for (const Kind k : {Kind{DType::kBF16, 64}, Kind{DType::kF16, 64}, Kind{DType::kBF16, 128}}) {
    for (const Opt o : {Opt{1, 0}, Opt{10, 0}, Opt{64, 0}, Opt{65, 0}, Opt{1000, 0}, Opt{0, 0.5f},
                        Opt{30, 0.5f}}) {
      for (size_t i = 0; i < batches.size(); ++i) {
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(k.dtype) << " head " << k.head_size << " window " << o.window
                     << " softcap " << o.softcap << " batch " << i);
        Batch b = MakeBatch(batches[i], {4, 2, k.head_size, 16}, k.dtype, rng);
        PoisonBeforeWindows(b, o.window);
        ExpectMatches(b, AttentionOptions{1.0f / std::sqrt(static_cast<float>(k.head_size)),
                                          o.window, o.softcap});
      }
    }
  }
}

// A NaN key and value at a position inside a prefill chunk (a poisoned slot): the rows before
// it do not attend to it and must match the CPU op on the clean cache; the rows at and after
// it see it and are NaN. P V sums over the masked keys of a tile too (P = 0), so the kernel
// must keep 0 x NaN out of the earlier rows. Positions: 70 rows after 30 cached (30..99),
// the NaN at 77 and at 40 (keys 0..63 and 64..127 are the two key tiles; rows 30..63 of the
// first row tile see tile 0 masked where their positions end).
TEST_F(CudaPrefillAttention, NanAtAMaskedPositionDoesNotReachTheRowsBeforeIt) {
  std::mt19937 rng(8);
  for (const DType dtype : kDTypes) {
    for (const int64_t poisoned : {77, 40}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " NaN at " << poisoned);
      const Shape shape{2, 1, 64, 16};
      Batch b = MakeBatch({{70, 100}}, shape, dtype, rng);
      const float scale = 0.125f;
      const HostTensor want = Reference(b, scale);  // on the clean caches
      const int64_t slot_numel = shape.num_kv_heads * shape.head_size;
      const int64_t block = b.block_tables.data<int32_t>()[poisoned / shape.block_size];
      const int64_t slot = block * shape.block_size + poisoned % shape.block_size;
      HostTensor key = gpu_testing::Clone(b.key_cache), value = gpu_testing::Clone(b.value_cache);
      for (int64_t i = 0; i < slot_numel; ++i) {
        key.data<float>()[slot * slot_numel + i] = NAN;
        value.data<float>()[slot * slot_numel + i] = NAN;
      }
      b.d_key_cache = DeviceTensor(ToHalf(key, dtype));
      b.d_value_cache = DeviceTensor(ToHalf(value, dtype));
      DeviceTensor out(ToHalf(want, dtype));
      for (const bool host_qsl : {false, true}) {
        out.Poison();
        ASSERT_TRUE(PrefillAttentionMma({}, out.view(), b.d_query.view(), b.d_key_cache.view(),
                                        b.d_value_cache.view(), b.DeviceMetadata(host_qsl),
                                        AttentionOptions{scale})
                        .ok());
        ASSERT_EQ(Sync(), "");
        const HostTensor got = out.Download();
        const int64_t row_numel = shape.num_heads * shape.head_size;
        const double tol = dtype == DType::kBF16 ? 8e-3 : 1.5e-3;
        int64_t bad = 0;
        for (int64_t t = 0; t < 70; ++t) {
          const bool sees = 30 + t >= poisoned;
          for (int64_t e = t * row_numel; e < (t + 1) * row_numel; ++e) {
            const double g = Widen(got, e), w = want.data<float>()[e];
            const bool ok = sees ? std::isnan(g) : std::fabs(g - w) <= tol + tol * std::fabs(w);
            if (!ok && bad++ < 5) {
              ADD_FAILURE() << "row " << t << (sees ? " (sees the NaN)" : "") << ": got " << g
                            << ", want " << (sees ? NAN : w);
            }
          }
        }
        EXPECT_EQ(bad, 0);
      }
    }
  }
}

// Bad metadata gives NaN rows (and no read outside the tensors, which the emulation's guarded
// arenas would report): q_len > seq_len, and a block id outside the cache.
TEST_F(CudaPrefillAttention, BadMetadataGivesNanRows) {
  std::mt19937 rng(6);
  Batch b = MakeBatch({{17, 17}, {15, 40}}, {2, 2, 64, 16}, DType::kBF16, rng);
  HostTensor lens = Indices(std::vector<int64_t>{10, 40}, DType::kI32);  // 17 > 10
  b.d_seq_lens = DeviceTensor(lens);
  const int64_t max_blocks = b.block_tables.view().shape[1];
  std::vector<int64_t> table(b.block_tables.numel());
  for (size_t i = 0; i < table.size(); ++i) table[i] = b.block_tables.data<int32_t>()[i];
  table[max_blocks + 1] = 1 << 20;  // sequence 1's second block (positions 16..31)
  b.d_block_tables = DeviceTensor(Indices(table, DType::kI32, {2, max_blocks}));
  DeviceTensor out(ToHalf(b.query, DType::kBF16));
  for (const bool host_qsl : {false, true}) {
    out.Poison();
    const OpStatus s = PrefillAttentionMma({}, out.view(), b.d_query.view(), b.d_key_cache.view(),
                                           b.d_value_cache.view(), b.DeviceMetadata(host_qsl),
                                           AttentionOptions{0.125f});
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(Sync(), "");
    const HostTensor got = out.Download();
    const int64_t row_numel = 2 * 64;
    for (int64_t e = 0; e < got.numel(); ++e) {
      // Sequence 0's rows (0..16): q_len > seq_len. Sequence 1's rows (17..31) all see
      // positions 16..31 (its rows sit at 25..39).
      ASSERT_TRUE(std::isnan(Widen(got, e))) << "element " << e << " of row " << e / row_numel;
    }
  }
}

TEST_F(CudaPrefillAttention, RejectsOtherDTypesAndHeadSizes) {
  std::mt19937 rng(7);
  const Batch b = MakeBatch({{3, 3}}, {1, 1, 64, 16}, DType::kBF16, rng);
  DeviceTensor f32_query(b.query);
  DeviceTensor out(ToHalf(b.query, DType::kBF16));
  OpStatus s = PrefillAttentionMma({}, out.view(), f32_query.view(), b.d_key_cache.view(),
                                   b.d_value_cache.view(), b.DeviceMetadata(false),
                                   AttentionOptions{0.125f});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message.find("bf16 or f16"), std::string::npos) << s.message;
  const Batch f16 = MakeBatch({{3, 3}}, {1, 1, 64, 16}, DType::kF16, rng);
  s = PrefillAttentionMma({}, out.view(), b.d_query.view(), f16.d_key_cache.view(),
                          f16.d_value_cache.view(), b.DeviceMetadata(false),
                          AttentionOptions{0.125f});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message.find("dtype"), std::string::npos) << s.message;
}

}  // namespace
}  // namespace llm::ops
