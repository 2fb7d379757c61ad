// PagedAttention on CUDA (v1 and v2 for every row, and the automatic choice through
// kernels/ops.h, which sends prefill chunks to the tiled prefill kernel) against the CPU op, on
// batches of decode rows, prefill chunks (with and without cached context) and both mixed, for head
// sizes 64 and 128, block sizes 16 and 32, MHA, GQA and MQA.
//
// Every cache is NaN except the positions each sequence owns, block tables are scattered by
// a random permutation with -1 past each sequence's last block, and the output is poisoned
// before each launch: a read past a context or an unwritten output fails the comparison.
// Tolerance: atol 1e-5, rtol 1e-4 (fp32; the GPU sums scores and values in another order than
// the CPU, over up to a few thousand keys; inputs in [-1, 1]).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/cuda/cuda_ops.h"
#include "tests/gpu/gpu_test_util.h"

namespace llm::ops {
namespace {

using cuda::PagedAttentionVersion;
using gpu_testing::Close;
using gpu_testing::CudaTest;
using gpu_testing::DeviceTensor;
using gpu_testing::Indices;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::RoundedThroughHalf;
using gpu_testing::ToHalf;

constexpr double kAtol = 1e-5, kRtol = 1e-4;

struct SeqSpec {
  int64_t q_len;    // query rows this step
  int64_t seq_len;  // context, this step's rows included
};

struct Shape {
  int64_t num_heads, num_kv_heads, head_size, block_size;
};

// A batch on the host and its copy on the device.
struct Batch {
  HostTensor query, key_cache, value_cache, block_tables, seq_lens, query_start_loc;
  int max_seq_len = 0;
  DeviceTensor d_query, d_key_cache, d_value_cache, d_block_tables, d_seq_lens, d_qsl;

  AttentionMetadata HostMetadata() const {
    return {block_tables.view(), seq_lens.view(), query_start_loc.view(), max_seq_len};
  }
  AttentionMetadata DeviceMetadata(int max_seq_len_override = -1) const {
    return {d_block_tables.view(), d_seq_lens.view(), d_qsl.view(),
            max_seq_len_override >= 0 ? max_seq_len_override : max_seq_len};
  }
};

// cache_dtype f16 or bf16: the host caches (the CPU reference's) hold the values rounded
// through that dtype, and the device caches hold them in it.
Batch MakeBatch(const std::vector<SeqSpec>& seqs, const Shape& shape, std::mt19937& rng,
                float q_range = 1.0f, DType cache_dtype = DType::kF32) {
  const int64_t bs = shape.block_size;
  const int64_t num_seqs = static_cast<int64_t>(seqs.size());
  int64_t num_tokens = 0, total_blocks = 0, max_blocks = 1;
  std::vector<int64_t> qsl = {0}, lens;
  int max_len = 0;
  for (const SeqSpec& s : seqs) {
    num_tokens += s.q_len;
    qsl.push_back(num_tokens);
    lens.push_back(s.seq_len);
    const int64_t blocks = (s.seq_len + bs - 1) / bs;
    total_blocks += blocks;
    max_blocks = std::max(max_blocks, blocks + 1);  // one spare column of -1
    max_len = std::max(max_len, static_cast<int>(s.seq_len));
  }
  const int64_t num_blocks = total_blocks + 2;  // two blocks nobody owns, left NaN
  std::vector<int64_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int64_t> table(num_seqs * max_blocks, -1);
  Batch b;
  b.key_cache = Poisoned({num_blocks, bs, shape.num_kv_heads, shape.head_size});
  b.value_cache = Poisoned({num_blocks, bs, shape.num_kv_heads, shape.head_size});
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int64_t slot_numel = shape.num_kv_heads * shape.head_size;
  int64_t next = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    for (int64_t pos = 0; pos < seqs[s].seq_len; ++pos) {
      if (pos % bs == 0) table[s * max_blocks + pos / bs] = ids[next++];
      const int64_t slot = table[s * max_blocks + pos / bs] * bs + pos % bs;
      for (int64_t i = 0; i < slot_numel; ++i) {
        b.key_cache.data<float>()[slot * slot_numel + i] = dist(rng);
        b.value_cache.data<float>()[slot * slot_numel + i] = dist(rng);
      }
    }
  }
  b.query = Random({num_tokens, shape.num_heads, shape.head_size}, rng, -q_range, q_range);
  b.block_tables = Indices(table, DType::kI32, {num_seqs, max_blocks});
  b.seq_lens = Indices(lens, DType::kI32);
  b.query_start_loc = Indices(qsl, DType::kI32);
  b.max_seq_len = max_len;
  b.d_query = DeviceTensor(b.query);
  if (cache_dtype == DType::kF32) {
    b.d_key_cache = DeviceTensor(b.key_cache);
    b.d_value_cache = DeviceTensor(b.value_cache);
  } else {
    b.key_cache = RoundedThroughHalf(b.key_cache, cache_dtype);
    b.value_cache = RoundedThroughHalf(b.value_cache, cache_dtype);
    b.d_key_cache = DeviceTensor(ToHalf(b.key_cache, cache_dtype));
    b.d_value_cache = DeviceTensor(ToHalf(b.value_cache, cache_dtype));
  }
  b.d_block_tables = DeviceTensor(b.block_tables);
  b.d_seq_lens = DeviceTensor(b.seq_lens);
  b.d_qsl = DeviceTensor(b.query_start_loc);
  return b;
}

class CudaPagedAttention : public CudaTest {
 protected:
  // The CPU op's output for `b`.
  static HostTensor Reference(const Batch& b, float scale) {
    HostTensor want =
        Poisoned({b.query.view().shape[0], b.query.view().shape[1], b.query.view().shape[2]});
    const OpStatus s = PagedAttention({}, want.view(), b.query.view(), b.key_cache.view(),
                                      b.value_cache.view(), b.HostMetadata(), scale);
    EXPECT_TRUE(s.ok()) << s.message;
    return want;
  }

  // Runs v1, v2 and the dispatcher's choice into a freshly poisoned output each, and compares
  // each with `want`.
  static void ExpectAllVersionsMatch(const Batch& b, float scale, const HostTensor& want,
                                     int v2_max_seq_len = -1) {
    DeviceTensor out(want);
    for (const PagedAttentionVersion v :
         {PagedAttentionVersion::kV1, PagedAttentionVersion::kV2, PagedAttentionVersion::kAuto}) {
      SCOPED_TRACE(::testing::Message() << "version " << static_cast<int>(v));
      out.Poison();
      OpStatus s;
      if (v == PagedAttentionVersion::kAuto) {
        s = PagedAttention({}, out.view(), b.d_query.view(), b.d_key_cache.view(),
                           b.d_value_cache.view(), b.DeviceMetadata(), scale);
      } else {
        s = cuda::PagedAttention(nullptr, out.view(), b.d_query.view(), b.d_key_cache.view(),
                                 b.d_value_cache.view(), b.DeviceMetadata(v2_max_seq_len), scale,
                                 v);
      }
      ASSERT_TRUE(s.ok()) << s.message;
      ASSERT_EQ(Sync(), "");
      EXPECT_TRUE(Close(out.Download(), want, kAtol, kRtol));
    }
  }
};

const Shape kShapes[] = {
    {32, 8, 128, 16}, {32, 8, 128, 32}, {8, 8, 64, 16}, {8, 8, 64, 32},  // GQA, MHA
    {4, 1, 128, 16},  {4, 1, 64, 32},                                    // MQA
};

std::string Describe(const Shape& s) {
  return "heads " + std::to_string(s.num_heads) + "/" + std::to_string(s.num_kv_heads) + ", head " +
         std::to_string(s.head_size) + ", block " + std::to_string(s.block_size);
}

// Decode only: 1, 15 and 17 sequences, contexts that end inside a block, on block and
// partition (512) boundaries, and random ones up to 2100.
TEST_F(CudaPagedAttention, DecodeBatchesMatchCpu) {
  std::mt19937 rng(601);
  const std::vector<int64_t> fixed = {1, 15, 17, 1000, 512, 513, 2049, 31, 32, 1024, 16};
  for (const Shape& shape : kShapes) {
    for (const int64_t batch : {1, 15, 17}) {
      SCOPED_TRACE(Describe(shape) + ", batch " + std::to_string(batch));
      std::vector<SeqSpec> seqs;
      std::uniform_int_distribution<int64_t> len_dist(1, 2100);
      for (int64_t s = 0; s < batch; ++s) {
        seqs.push_back(
            {1, s < static_cast<int64_t>(fixed.size()) && batch > 1 ? fixed[s] : len_dist(rng)});
      }
      const Batch b = MakeBatch(seqs, shape, rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_size));
      ExpectAllVersionsMatch(b, scale, Reference(b, scale));
    }
  }
}

// Prefill chunks: 1000 fresh tokens; 15 after 32 cached; 17 fresh; and a mixed batch of
// chunks, decode rows and a sequence with no rows this step. Under the CUDA emulation the long
// chunk is 160 tokens (10 prefill tiles), since its row kernels (v1, v2) alone would take
// minutes there.
#ifdef LLM_CUDA_EMU
constexpr int64_t kLongPrefill = 160;
#else
constexpr int64_t kLongPrefill = 1000;
#endif
TEST_F(CudaPagedAttention, PrefillAndMixedBatchesMatchCpu) {
  std::mt19937 rng(602);
  const std::vector<std::vector<SeqSpec>> batches = {
      {{kLongPrefill, kLongPrefill}},
      {{15, 47}},
      {{17, 17}},
      {{1, 700}, {17, 17}, {0, 40}, {15, 530}, {1, 1}, {33, 1100}},
  };
  const Shape shapes[] = {{8, 2, 128, 16}, {8, 2, 64, 32}, {4, 1, 128, 32}, {8, 8, 64, 16}};
  for (const Shape& shape : shapes) {
    for (size_t i = 0; i < batches.size(); ++i) {
      SCOPED_TRACE(Describe(shape) + ", batch " + std::to_string(i));
      const Batch b = MakeBatch(batches[i], shape, rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_size));
      ExpectAllVersionsMatch(b, scale, Reference(b, scale));
    }
  }
}

// f16 and bf16 caches, read into fp32: against the CPU op on the same values in f32, so the
// tolerance stays fp32's.
TEST_F(CudaPagedAttention, HalfCachesMatchCpuOnTheSameValues) {
  std::mt19937 rng(607);
  const std::vector<SeqSpec> batch = {{1, 1}, {1, 17}, {1, 1000}, {15, 47}, {1, 2049}};
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    for (const Shape& shape : {Shape{32, 8, 128, 16}, Shape{8, 2, 64, 32}}) {
      SCOPED_TRACE(Describe(shape) + ", " + DTypeName(dtype));
      const Batch b = MakeBatch(batch, shape, rng, 1.0f, dtype);
      const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_size));
      ExpectAllVersionsMatch(b, scale, Reference(b, scale));
    }
  }
}

// Peaked softmax (scale 1, queries in [-3, 3]: scores up to ~40 apart) over long contexts,
// where the running-max rescaling across chunks and partitions matters.
TEST_F(CudaPagedAttention, PeakedSoftmaxOverLongContextsMatchesCpu) {
  std::mt19937 rng(603);
  const Shape shape{8, 2, 128, 16};
  const Batch b = MakeBatch({{1, 3000}, {1, 1537}, {3, 1030}}, shape, rng, 3.0f);
  ExpectAllVersionsMatch(b, 1.0f, Reference(b, 1.0f));
}

// v2 sized for a longer max_seq_len than any context: the extra partitions are empty.
TEST_F(CudaPagedAttention, V2WithLooseMaxSeqLenMatchesCpu) {
  std::mt19937 rng(604);
  const Shape shape{8, 2, 64, 16};
  const Batch b = MakeBatch({{1, 600}, {1, 5}, {2, 513}}, shape, rng);
  const float scale = 0.125f;
  ExpectAllVersionsMatch(b, scale, Reference(b, scale), /*v2_max_seq_len=*/8192);
}

TEST_F(CudaPagedAttention, V2NeedsMaxSeqLenAndOtherHeadSizesAreRejected) {
  std::mt19937 rng(605);
  const Batch b = MakeBatch({{1, 20}}, {4, 1, 64, 16}, rng);
  DeviceTensor out(Poisoned({1, 4, 64}));
  EXPECT_EQ(cuda::PagedAttention(nullptr, out.view(), b.d_query.view(), b.d_key_cache.view(),
                                 b.d_value_cache.view(), b.DeviceMetadata(0), 0.125f,
                                 PagedAttentionVersion::kV2)
                .message,
            "PagedAttention: v2 needs metadata.max_seq_len > 0 to size its grid");
  // Unknown max_seq_len: the dispatcher runs v1.
  out.Poison();
  ASSERT_TRUE(PagedAttention({}, out.view(), b.d_query.view(), b.d_key_cache.view(),
                             b.d_value_cache.view(), b.DeviceMetadata(0), 0.125f)
                  .ok());
  ASSERT_EQ(Sync(), "");
  EXPECT_TRUE(Close(out.Download(), Reference(b, 0.125f), kAtol, kRtol));

  const Batch b96 = MakeBatch({{1, 20}}, {4, 1, 96, 16}, rng);
  DeviceTensor out96(Poisoned({1, 4, 96}));
  EXPECT_EQ(PagedAttention({}, out96.view(), b96.d_query.view(), b96.d_key_cache.view(),
                           b96.d_value_cache.view(), b96.DeviceMetadata(), 0.1f)
                .message,
            "PagedAttention: the CUDA kernels take head sizes 64 and 128, got 96");
}

// A block id outside the cache (the CPU op reports it; the device cannot without a
// synchronization) gives NaN rows for its sequence only; the other sequence is right.
TEST_F(CudaPagedAttention, BadBlockIdGivesNanRowsOfItsSequenceOnly) {
  std::mt19937 rng(606);
  const Shape shape{4, 1, 64, 16};
  Batch b = MakeBatch({{1, 40}, {1, 700}}, shape, rng);
  const float scale = 0.125f;
  const HostTensor want = Reference(b, scale);
  const int64_t max_blocks = b.block_tables.view().shape[1];
  b.block_tables.data<int32_t>()[0 * max_blocks + 1] = 1 << 20;  // sequence 0, block 1
  b.d_block_tables = DeviceTensor(b.block_tables);
  DeviceTensor out(want);
  for (const PagedAttentionVersion v : {PagedAttentionVersion::kV1, PagedAttentionVersion::kV2}) {
    out.Poison();
    ASSERT_TRUE(cuda::PagedAttention(nullptr, out.view(), b.d_query.view(), b.d_key_cache.view(),
                                     b.d_value_cache.view(), b.DeviceMetadata(), scale, v)
                    .ok());
    ASSERT_EQ(Sync(), "");
    const HostTensor got = out.Download();
    const int64_t row = shape.num_heads * shape.head_size;
    for (int64_t i = 0; i < row; ++i) EXPECT_TRUE(std::isnan(got.data<float>()[i])) << i;
    for (int64_t i = row; i < 2 * row; ++i) {
      EXPECT_NEAR(got.data<float>()[i], want.data<float>()[i],
                  kAtol + kRtol * std::abs(want.data<float>()[i]));
    }
  }
}

}  // namespace
}  // namespace llm::ops
