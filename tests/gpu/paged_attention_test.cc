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
//
// The 16-bit path (query, out and caches all bf16 or all f16; decode-only batches here, the
// prefill kernel's batches are tested with it) against the CPU op on f32 tensors holding the
// same 16-bit values: |got - want| <= 1e-5 + rtol |want| with rtol 2^-8 (bf16) or 2^-11 (f16),
// the rounding of the output to the dtype (half an ulp), plus 1e-4 for the fp32 sums in
// another order (and exp2 with log2(e) folded into the scale).
//
// Sliding windows and softcaps (AttentionOptions) through every kernel against the CPU op with
// the same options, with the positions before each sequence's first window NaN in the caches:
// a kernel that reads a block before a window, rather than skipping it, fails.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/paged_attention_plan.h"
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
  std::vector<int32_t> qsl_host;  // query_start_loc's contents
  int max_seq_len = 0;
  DeviceTensor d_query, d_key_cache, d_value_cache, d_block_tables, d_seq_lens, d_qsl;

  AttentionMetadata HostMetadata() const {
    return {block_tables.view(), seq_lens.view(), query_start_loc.view(), max_seq_len};
  }
  // with_host_qsl: also the q_lens on the host (AttentionMetadata::query_start_loc_host), so
  // that kAuto launches only the kernels the batch needs.
  AttentionMetadata DeviceMetadata(int max_seq_len_override = -1,
                                   bool with_host_qsl = false) const {
    AttentionMetadata md{d_block_tables.view(), d_seq_lens.view(), d_qsl.view(),
                         max_seq_len_override >= 0 ? max_seq_len_override : max_seq_len};
    if (with_host_qsl) md.query_start_loc_host = qsl_host;
    return md;
  }
  int64_t num_tokens() const { return query.view().shape[0]; }
};

// OpContext::workspace on cuda:0, poisoned (0xFF) when made. Move-only.
class DeviceWorkspace {
 public:
  explicit DeviceWorkspace(size_t bytes) : bytes_(bytes) {
    if (bytes_ == 0) return;
    EXPECT_EQ(cudaMalloc(&data_, bytes_), cudaSuccess);
    EXPECT_EQ(cudaMemset(data_, 0xFF, bytes_), cudaSuccess);
  }
  DeviceWorkspace(const DeviceWorkspace&) = delete;
  DeviceWorkspace& operator=(const DeviceWorkspace&) = delete;
  ~DeviceWorkspace() {
    if (data_ != nullptr) cudaFree(data_);
  }
  OpContext Context(cudaStream_t stream = nullptr) const {
    OpContext ctx;
    ctx.stream = stream;
    ctx.workspace = data_;
    ctx.workspace_bytes = bytes_;
    return ctx;
  }
  // Whether any byte differs from the poison (after the default stream's work).
  bool Written() const {
    std::vector<unsigned char> host(bytes_);
    if (bytes_ > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return std::any_of(host.begin(), host.end(), [](unsigned char c) { return c != 0xFF; });
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// The workspace v2 needs for `b` (with max_seq_len `max_seq_len`, or the batch's).
size_t V2WorkspaceBytes(const Batch& b, int max_seq_len = -1) {
  const auto& q = b.query.view().shape;
  return cuda::SplitKWorkspaceBytes(q[0], q[1], q[2],
                                    max_seq_len >= 0 ? max_seq_len : b.max_seq_len);
}

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
  b.qsl_host.assign(qsl.begin(), qsl.end());
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
  static HostTensor Reference(const Batch& b, const AttentionOptions& options) {
    HostTensor want =
        Poisoned({b.query.view().shape[0], b.query.view().shape[1], b.query.view().shape[2]});
    const OpStatus s = PagedAttention({}, want.view(), b.query.view(), b.key_cache.view(),
                                      b.value_cache.view(), b.HostMetadata(), options);
    EXPECT_TRUE(s.ok()) << s.message;
    return want;
  }
  static HostTensor Reference(const Batch& b, float scale) {
    return Reference(b, AttentionOptions{scale});
  }

  // Runs v1, v2 and the dispatcher's choice (without and with the q_lens on the host) into a
  // freshly poisoned output each, and compares each with `want`. The workspace holds v2 for
  // the batch, so kAuto splits where it would.
  static void ExpectAllVersionsMatch(const Batch& b, float scale, const HostTensor& want,
                                     int v2_max_seq_len = -1) {
    ExpectAllVersionsMatch(b, AttentionOptions{scale}, want, v2_max_seq_len);
  }
  static void ExpectAllVersionsMatch(const Batch& b, const AttentionOptions& options,
                                     const HostTensor& want, int v2_max_seq_len = -1) {
    DeviceTensor out(want);
    const DeviceWorkspace workspace(
        std::max(V2WorkspaceBytes(b, v2_max_seq_len), V2WorkspaceBytes(b)));
    const OpContext ctx = workspace.Context();
    struct Case {
      PagedAttentionVersion version;
      bool host_qsl;
    };
    for (const Case c :
         {Case{PagedAttentionVersion::kV1, false}, Case{PagedAttentionVersion::kV2, false},
          Case{PagedAttentionVersion::kAuto, false}, Case{PagedAttentionVersion::kAuto, true}}) {
      SCOPED_TRACE(::testing::Message() << "version " << static_cast<int>(c.version)
                                        << (c.host_qsl ? ", q_lens on the host" : ""));
      out.Poison();
      OpStatus s;
      if (c.version == PagedAttentionVersion::kAuto) {
        s = PagedAttention(ctx, out.view(), b.d_query.view(), b.d_key_cache.view(),
                           b.d_value_cache.view(), b.DeviceMetadata(-1, c.host_qsl), options);
      } else {
        s = cuda::PagedAttention(ctx, out.view(), b.d_query.view(), b.d_key_cache.view(),
                                 b.d_value_cache.view(), b.DeviceMetadata(v2_max_seq_len), options,
                                 c.version);
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
  const DeviceWorkspace workspace(V2WorkspaceBytes(b, 8192));
  EXPECT_EQ(cuda::PagedAttention(workspace.Context(), out.view(), b.d_query.view(),
                                 b.d_key_cache.view(), b.d_value_cache.view(), b.DeviceMetadata(0),
                                 0.125f, PagedAttentionVersion::kV2)
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
            "PagedAttention: the CUDA kernels take head sizes 16, 32, 64 and 128, got 96");
}

// b's caches with the positions before each sequence's first query row's window NaN, on the
// host (the CPU op's) and the device: no row sees them, so a kernel that reads them (rather than
// skipping the blocks before a window) gives NaN where the CPU op does not.
void PoisonBeforeWindows(Batch& b, int window) {
  if (window <= 0) return;
  const auto& shape = b.key_cache.view().shape;  // [num_blocks, block_size, Hkv, D]
  const int64_t bs = shape[1], row = shape[2] * shape[3];
  const int64_t max_blocks = b.block_tables.view().shape[1];
  for (int64_t s = 0; s < b.seq_lens.numel(); ++s) {
    const int64_t q_len = b.qsl_host[s + 1] - b.qsl_host[s];
    const int64_t first = b.seq_lens.data<int32_t>()[s] - q_len - window + 1;
    for (int64_t p = 0; p < first; ++p) {
      const int64_t slot = b.block_tables.data<int32_t>()[s * max_blocks + p / bs] * bs + p % bs;
      std::fill_n(b.key_cache.data<float>() + slot * row, row, NAN);
      std::fill_n(b.value_cache.data<float>() + slot * row, row, NAN);
    }
  }
  const DType dtype = b.d_key_cache.view().dtype;
  b.d_key_cache = DeviceTensor(dtype == DType::kF32 ? gpu_testing::Clone(b.key_cache)
                                                    : ToHalf(b.key_cache, dtype));
  b.d_value_cache = DeviceTensor(dtype == DType::kF32 ? gpu_testing::Clone(b.value_cache)
                                                      : ToHalf(b.value_cache, dtype));
}

// Sliding windows (1, 37, 100, 700 and longer than every context) and a softcap with a
// window, through v1, v2 (whose partitions cover the window only) and kAuto (v2 or v1 for the
// decode rows, the tiled kernel for the chunks): decode rows (contexts of 1, 40 and 1100), chunks
// with and without cached context, a sequence with no rows; f32 caches, and bf16 caches once.
// Queries in [-3, 3] (scores up to ~5) so that the softcap of 1 matters.
TEST_F(CudaPagedAttention, WindowAndSoftcapMatchCpu) {
  std::mt19937 rng(620);
  const std::vector<SeqSpec> batch = {{1, 40},   {1, 1100}, {17, 17}, {0, 40},
                                      {15, 530}, {1, 1},    {20, 100}};
  struct Opt {
    int window;
    float softcap;
    DType cache;
  };
  for (const Shape& shape : {Shape{8, 2, 64, 16}, Shape{4, 1, 128, 32}}) {
    for (const Opt o :
         {Opt{1, 0, DType::kF32}, Opt{37, 0, DType::kF32}, Opt{700, 0, DType::kF32},
          Opt{5000, 0, DType::kF32}, Opt{37, 1.0f, DType::kF32}, Opt{100, 1.0f, DType::kBF16}}) {
      SCOPED_TRACE(Describe(shape) + ", window " + std::to_string(o.window) + ", softcap " +
                   std::to_string(o.softcap) + ", " + DTypeName(o.cache) + " caches");
      Batch b = MakeBatch(batch, shape, rng, 3.0f, o.cache);
      PoisonBeforeWindows(b, o.window);
      const AttentionOptions options{1.0f / std::sqrt(static_cast<float>(shape.head_size)),
                                     o.window, o.softcap};
      ExpectAllVersionsMatch(b, options, Reference(b, options));
    }
  }
}

// The checks above can fail: the CPU op with a window one key longer, or without the softcap,
// differs from the CUDA op beyond the tolerance.
TEST_F(CudaPagedAttention, WrongWindowOrSoftcapIsCaught) {
  std::mt19937 rng(621);
  const Shape shape{8, 2, 64, 16};
  Batch b = MakeBatch({{1, 300}, {17, 60}}, shape, rng, 3.0f);
  PoisonBeforeWindows(b, 37);
  const AttentionOptions options{0.125f, 37, 1.0f};
  DeviceTensor out(Reference(b, options));
  out.Poison();
  ASSERT_TRUE(PagedAttention({}, out.view(), b.d_query.view(), b.d_key_cache.view(),
                             b.d_value_cache.view(), b.DeviceMetadata(), options)
                  .ok());
  ASSERT_EQ(Sync(), "");
  const HostTensor got = out.Download();
  EXPECT_TRUE(Close(got, Reference(b, options), kAtol, kRtol));
  EXPECT_FALSE(Close(got, Reference(b, AttentionOptions{0.125f, 36, 1.0f}), kAtol, kRtol));
  EXPECT_FALSE(Close(got, Reference(b, AttentionOptions{0.125f, 37, 0.0f}), kAtol, kRtol));
}

// A NaN key and value at a position of a prefill chunk (an unwritten or poisoned slot): the
// rows before it do not attend to it and must match the CPU op, in every version. The tiled
// prefill kernel loads K and V tiles shared by 16 rows, so the rows before the poisoned
// position see it in their tile, masked; multiplying its value by the masked weight (0 x NaN)
// made them NaN.
TEST_F(CudaPagedAttention, NanAtAMaskedPositionDoesNotReachTheRowsBeforeIt) {
  std::mt19937 rng(608);
  const Shape shape{8, 2, 64, 16};
  // Sequence 0: 15 rows after 32 cached (positions 32..46); sequence 1: a decode row.
  Batch b = MakeBatch({{15, 47}, {1, 40}}, shape, rng);
  const float scale = 0.125f;
  const HostTensor want = Reference(b, scale);  // on the clean caches
  constexpr int64_t kPoisonedPos = 40;          // row j of sequence 0 sits at 32 + j
  const int64_t slot_numel = shape.num_kv_heads * shape.head_size;
  const int64_t block = b.block_tables.data<int32_t>()[kPoisonedPos / shape.block_size];
  const int64_t slot = block * shape.block_size + kPoisonedPos % shape.block_size;
  for (int64_t i = 0; i < slot_numel; ++i) {
    b.key_cache.data<float>()[slot * slot_numel + i] = NAN;
    b.value_cache.data<float>()[slot * slot_numel + i] = NAN;
  }
  b.d_key_cache = DeviceTensor(b.key_cache);
  b.d_value_cache = DeviceTensor(b.value_cache);
  // Rows 0..7 of sequence 0 (positions 32..39) and sequence 1's row (t = 15) are unaffected.
  const int64_t row = shape.num_heads * shape.head_size;
  std::vector<int64_t> clean_rows = {0, 1, 2, 3, 4, 5, 6, 7, 15};
  DeviceTensor out(want);
  const DeviceWorkspace workspace(V2WorkspaceBytes(b));
  for (const PagedAttentionVersion v :
       {PagedAttentionVersion::kV1, PagedAttentionVersion::kV2, PagedAttentionVersion::kAuto}) {
    SCOPED_TRACE(::testing::Message() << "version " << static_cast<int>(v));
    out.Poison();
    ASSERT_TRUE(cuda::PagedAttention(workspace.Context(), out.view(), b.d_query.view(),
                                     b.d_key_cache.view(), b.d_value_cache.view(),
                                     b.DeviceMetadata(), scale, v)
                    .ok());
    ASSERT_EQ(Sync(), "");
    const HostTensor got = out.Download();
    for (const int64_t t : clean_rows) {
      SCOPED_TRACE(::testing::Message() << "row " << t);
      const float* w = want.data<float>() + t * row;
      EXPECT_TRUE(gpu_testing::AllClose(got.data<float>() + t * row,
                                        std::vector<double>(w, w + row), kAtol, kRtol));
    }
  }
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
  const DeviceWorkspace workspace(V2WorkspaceBytes(b));
  for (const PagedAttentionVersion v : {PagedAttentionVersion::kV1, PagedAttentionVersion::kV2}) {
    out.Poison();
    ASSERT_TRUE(cuda::PagedAttention(workspace.Context(), out.view(), b.d_query.view(),
                                     b.d_key_cache.view(), b.d_value_cache.view(),
                                     b.DeviceMetadata(), scale, v)
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

// v2 runs in the caller's workspace (OpContext::workspace) instead of allocating one per call:
// kV2 writes its partials there, says how much it needs when given too little, and kAuto with
// the workspace sized by ops::PagedAttentionWorkspaceBytes splits a long context in it.
TEST_F(CudaPagedAttention, V2RunsInTheCallersWorkspace) {
  std::mt19937 rng(609);
  const Shape shape{8, 2, 64, 16};
  const Batch b = MakeBatch({{1, 1300}, {1, 40}}, shape, rng);  // T * Hq = 16: kAuto splits
  const float scale = 0.125f;
  const HostTensor want = Reference(b, scale);
  DeviceTensor out(want);

  const DeviceWorkspace small(V2WorkspaceBytes(b) - 4);
  out.Poison();
  EXPECT_EQ(cuda::PagedAttention(small.Context(), out.view(), b.d_query.view(),
                                 b.d_key_cache.view(), b.d_value_cache.view(), b.DeviceMetadata(),
                                 scale, PagedAttentionVersion::kV2)
                .message,
            "PagedAttention: v2 needs a workspace of " + std::to_string(V2WorkspaceBytes(b)) +
                " bytes (OpContext::workspace), got " + std::to_string(V2WorkspaceBytes(b) - 4));
  // kAuto with too little workspace runs v1 instead, and leaves the workspace alone.
  ASSERT_TRUE(PagedAttention(small.Context(), out.view(), b.d_query.view(), b.d_key_cache.view(),
                             b.d_value_cache.view(), b.DeviceMetadata(), scale)
                  .ok());
  ASSERT_EQ(Sync(), "");
  EXPECT_TRUE(Close(out.Download(), want, kAtol, kRtol));
  EXPECT_FALSE(small.Written());

  for (const PagedAttentionVersion v : {PagedAttentionVersion::kV2, PagedAttentionVersion::kAuto}) {
    SCOPED_TRACE(::testing::Message() << "version " << static_cast<int>(v));
    const DeviceWorkspace workspace(
        v == PagedAttentionVersion::kV2
            ? V2WorkspaceBytes(b)
            : PagedAttentionWorkspaceBytes(/*max_num_tokens=*/2, shape.num_heads, shape.head_size,
                                           /*max_model_len=*/2048));
    out.Poison();
    ASSERT_TRUE(cuda::PagedAttention(workspace.Context(), out.view(), b.d_query.view(),
                                     b.d_key_cache.view(), b.d_value_cache.view(),
                                     b.DeviceMetadata(), scale, v)
                    .ok());
    ASSERT_EQ(Sync(), "");
    EXPECT_TRUE(Close(out.Download(), want, kAtol, kRtol));
    EXPECT_TRUE(workspace.Written());
  }
}

// With the q_lens on the host, kAuto launches only the kernels the batch has rows for: the row
// kernel for decode rows, the tiled prefill kernel (over exactly the tiles of the chunks) for
// prefill chunks. Counted as kernel nodes of a CUDA graph captured from the op's stream, then
// replayed and compared with the CPU op. Without the host q_lens both kernels run.
TEST_F(CudaPagedAttention, LaunchesOnlyTheKernelsTheBatchNeeds) {
  std::mt19937 rng(610);
  const Shape shape{8, 2, 64, 16};
  const float scale = 0.125f;
  struct Case {
    std::vector<SeqSpec> seqs;
    bool host_qsl;
    size_t kernels;
  };
  const Case cases[] = {
      {{{1, 40}, {1, 300}, {1, 7}}, true, 1},             // decode only: v1
      {{{1, 40}, {1, 300}, {1, 7}}, false, 2},            // ... q_lens unknown: v1 + prefill
      {{{17, 17}, {15, 47}, {0, 9}}, true, 1},            // prefill only: the tiled kernel
      {{{1, 40}, {33, 100}, {1, 5}, {16, 16}}, true, 2},  // mixed: both
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.seqs.size() << " sequences, first q_len "
                                      << c.seqs[0].q_len << (c.host_qsl ? ", host q_lens" : ""));
    const Batch b = MakeBatch(c.seqs, shape, rng);
    const HostTensor want = Reference(b, scale);
    DeviceTensor out(want);
    out.Poison();
    ASSERT_EQ(Sync(), "");  // the uploads and the poison ran on the legacy default stream
    OpStatus s;
    const gpu_testing::NodeCounts counts = gpu_testing::CaptureAndRun([&](cudaStream_t stream) {
      OpContext ctx;
      ctx.stream = stream;
      s = PagedAttention(ctx, out.view(), b.d_query.view(), b.d_key_cache.view(),
                         b.d_value_cache.view(), b.DeviceMetadata(-1, c.host_qsl), scale);
    });
    ASSERT_TRUE(s.ok()) << s.message;
    EXPECT_EQ(counts.kernels, c.kernels);
    EXPECT_TRUE(Close(out.Download(), want, kAtol, kRtol));
  }
}

// The host q_lens must describe the device tensor: a wrong count or a decreasing one is an
// error (checked on the host, for free), not rows left unwritten.
TEST_F(CudaPagedAttention, InconsistentHostQueryStartLocIsAnError) {
  std::mt19937 rng(611);
  const Batch b = MakeBatch({{1, 20}, {3, 30}}, {4, 1, 64, 16}, rng);
  DeviceTensor out(Poisoned({4, 4, 64}));
  AttentionMetadata md = b.DeviceMetadata();
  const std::vector<int32_t> short_qsl = {0, 4};
  md.query_start_loc_host = short_qsl;
  EXPECT_EQ(PagedAttention({}, out.view(), b.d_query.view(), b.d_key_cache.view(),
                           b.d_value_cache.view(), md, 0.125f)
                .message,
            "PagedAttention: metadata.query_start_loc_host: expected 3 entries (or none), got 2");
  const std::vector<int32_t> decreasing = {0, 5, 4};
  md.query_start_loc_host = decreasing;
  EXPECT_EQ(PagedAttention({}, out.view(), b.d_query.view(), b.d_key_cache.view(),
                           b.d_value_cache.view(), md, 0.125f)
                .message,
            "PagedAttention: query_start_loc_host decreases at sequence 1 (5 then 4)");
}

// ---------------------------------------------------------------------------------------------
// The 16-bit path: decode rows through the GQA-shared split-KV kernel.

// Head sizes 16 and 32 (the project's own models: tiny-llama and tiny-qwen2 16, fortune-llama
// 32), where a warp has more lanes than dims: MHA, GQA and MQA, block sizes 16 and 32, decode
// batches of 1, 15 and 17 sequences (contexts inside a block, on block and partition
// boundaries, up to 1000 and random up to 700), prefill chunks (1000 tokens, 160 under the
// emulation) and mixed batches, in v1, v2 and kAuto. Fewer and shorter cases than the head 64/128
// sweeps above, to keep the emulated run short.
const Shape kSmallHeadShapes[] = {
    {4, 2, 16, 16}, {4, 4, 16, 32}, {4, 1, 16, 16},  // head 16: GQA, MHA, MQA
    {4, 2, 32, 32}, {4, 4, 32, 16}, {4, 1, 32, 32},  // head 32
};

TEST_F(CudaPagedAttention, SmallHeadSizeDecodeBatchesMatchCpu) {
  std::mt19937 rng(612);
  const std::vector<int64_t> fixed = {1, 15, 17, 1000, 512, 513, 31, 32, 16, 33, 600};
  for (const Shape& shape : kSmallHeadShapes) {
    for (const int64_t batch : {1, 15, 17}) {
      SCOPED_TRACE(Describe(shape) + ", batch " + std::to_string(batch));
      std::vector<SeqSpec> seqs;
      std::uniform_int_distribution<int64_t> len_dist(1, 700);
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

TEST_F(CudaPagedAttention, SmallHeadSizePrefillAndMixedBatchesMatchCpu) {
  std::mt19937 rng(613);
  const std::vector<std::vector<SeqSpec>> batches = {
      {{kLongPrefill, kLongPrefill}},
      {{15, 47}},
      {{17, 17}},
      {{1, 700}, {17, 17}, {0, 40}, {15, 530}, {1, 1}, {33, 600}},
  };
  const Shape shapes[] = {{4, 2, 16, 16}, {4, 1, 16, 32}, {4, 4, 32, 16}, {4, 2, 32, 32}};
  for (const Shape& shape : shapes) {
    for (size_t i = 0; i < batches.size(); ++i) {
      SCOPED_TRACE(Describe(shape) + ", batch " + std::to_string(i));
      const Batch b = MakeBatch(batches[i], shape, rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_size));
      ExpectAllVersionsMatch(b, scale, Reference(b, scale));
    }
  }
}

// f16 or bf16 `t` as f32 (exact).
HostTensor HalfToFloat(const HostTensor& t) {
  HostTensor f(DType::kF32, std::span<const int64_t>(t.view().shape.data(), t.view().ndim));
  for (int64_t i = 0; i < t.numel(); ++i) {
    f.data<float>()[i] = t.view().dtype == DType::kF16
                             ? __half2float(t.data<__half>()[i])
                             : __bfloat162float(t.data<__nv_bfloat16>()[i]);
  }
  return f;
}

double Rtol16(DType dtype) { return (dtype == DType::kF16 ? 1.0 / 2048 : 1.0 / 256) + 1e-4; }
constexpr double kAtol16 = 1e-5;

// A decode batch whose query and caches hold dtype's values: the host tensors (the CPU
// reference's) as f32, the device ones in dtype.
Batch MakeBatch16(const std::vector<SeqSpec>& seqs, const Shape& shape, std::mt19937& rng,
                  DType dtype) {
  Batch b = MakeBatch(seqs, shape, rng, 1.0f, dtype);
  b.query = RoundedThroughHalf(b.query, dtype);
  b.d_query = DeviceTensor(ToHalf(b.query, dtype));
  return b;
}

std::vector<int32_t> SeqLensHost(const Batch& b) {
  const int32_t* p = b.seq_lens.data<int32_t>();
  return std::vector<int32_t>(p, p + b.seq_lens.numel());
}

// The decode plan the dispatcher makes for `b` on the emulated or real device 0.
cuda::DecodePlan PlanFor(const Batch& b, const Shape& shape, size_t workspace_bytes,
                         std::span<const int32_t> lens_host, int sliding_window = 0) {
  int num_sms = 0;
  EXPECT_EQ(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  cuda::DecodePlanInput in;
  in.num_seqs = b.seq_lens.numel();
  in.num_heads = shape.num_heads;
  in.num_kv_heads = shape.num_kv_heads;
  in.head_size = shape.head_size;
  in.num_sms = num_sms;
  in.max_seq_len = b.max_seq_len;
  in.query_start_loc_host = b.qsl_host;
  in.seq_lens_host = lens_host;
  in.workspace_bytes = workspace_bytes;
  in.sliding_window = sliding_window;
  cuda::DecodePlan plan;
  EXPECT_EQ(cuda::PlanDecode(in, &plan), "");
  return plan;
}

class CudaPagedAttention16 : public CudaPagedAttention {
 public:
  using CudaPagedAttention::Reference;

  // Runs ops::PagedAttention on `b` into a freshly poisoned 16-bit output; returns it as f32.
  static HostTensor Run(const Batch& b, DType dtype, float scale, const OpContext& ctx,
                        bool with_lens, bool with_qsl = true, int max_seq_len = -1) {
    return Run(b, dtype, AttentionOptions{scale}, ctx, with_lens, with_qsl, max_seq_len);
  }
  static HostTensor Run(const Batch& b, DType dtype, const AttentionOptions& options,
                        const OpContext& ctx, bool with_lens, bool with_qsl = true,
                        int max_seq_len = -1) {
    const auto& qs = b.query.view().shape;
    DeviceTensor out(HostTensor(dtype, std::span<const int64_t>(qs.data(), 3)));
    out.Poison();
    const std::vector<int32_t> lens = SeqLensHost(b);
    AttentionMetadata md = b.DeviceMetadata(max_seq_len, with_qsl);
    if (with_lens) md.seq_lens_host = lens;
    const OpStatus s = PagedAttention(ctx, out.view(), b.d_query.view(), b.d_key_cache.view(),
                                      b.d_value_cache.view(), md, options);
    EXPECT_TRUE(s.ok()) << s.message;
    EXPECT_EQ(Sync(), "");
    return HalfToFloat(out.Download());
  }
};

// Decode batches at every shape, bf16 and f16, with and without the host seq_lens (and q_lens),
// with the workspace PagedAttentionWorkspaceBytes gives: contexts of 1, 15, 17 and 1000 tokens,
// ending inside a block, on a block boundary, and on and around the split boundaries (the plan
// is checked to split at 256 keys).
void ExpectDecodeMatchesCpu(DType dtype, std::mt19937& rng) {
  const std::vector<std::vector<SeqSpec>> batches = {
      {{1, 1}},
      {{1, 1000}},
      {{1, 15}, {1, 17}, {1, 256}, {1, 512}, {1, 513}, {1, 255}, {1, 32}, {1, 767}},
  };
  {
    for (const Shape& shape : kShapes) {
      for (size_t bi = 0; bi < batches.size(); ++bi) {
        SCOPED_TRACE(std::string(DTypeName(dtype)) + ", " + Describe(shape) + ", batch " +
                     std::to_string(bi));
        const Batch b = MakeBatch16(batches[bi], shape, rng, dtype);
        const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_size));
        const HostTensor want = CudaPagedAttention16::Reference(b, scale);
        const size_t ws_bytes = PagedAttentionWorkspaceBytes(
            static_cast<int64_t>(batches[bi].size()), shape.num_heads, shape.head_size, 2048);
        const DeviceWorkspace workspace(ws_bytes);
        const std::vector<int32_t> lens = SeqLensHost(b);
        if (bi == 2) {  // the split boundaries are at multiples of 256 keys
          for (const bool with_lens : {false, true}) {
            const cuda::DecodePlan plan =
                PlanFor(b, shape, ws_bytes,
                        with_lens ? std::span<const int32_t>(lens) : std::span<const int32_t>());
            EXPECT_GT(plan.num_splits, 1);
            EXPECT_EQ(plan.split_keys, 256);
          }
        }
        for (const bool with_lens : {false, true}) {
          SCOPED_TRACE(with_lens ? "host seq_lens" : "no host seq_lens");
          EXPECT_TRUE(
              Close(CudaPagedAttention16::Run(b, dtype, scale, workspace.Context(), with_lens),
                    want, kAtol16, Rtol16(dtype)));
        }
        // Without host q_lens: the same decode kernel (no prefill rows: T == S).
        if (bi == 2) {
          EXPECT_TRUE(
              Close(CudaPagedAttention16::Run(b, dtype, scale, workspace.Context(), true, false),
                    want, kAtol16, Rtol16(dtype)));
        }
      }
    }
  }
}

TEST_F(CudaPagedAttention16, Bf16DecodeMatchesCpu) {
  std::mt19937 rng(1701);
  ExpectDecodeMatchesCpu(DType::kBF16, rng);
}

// A CUDA graph of decode steps is captured with the plan for the longest context the engine
// admits (max_seq_len = max_model_len, no host seq_lens) and replayed for shorter ones: splits
// past a sequence's context hold no keys and must not change its output.
TEST_F(CudaPagedAttention16, APlanForLongerContextsThanTheBatchHasGivesTheSameOutput) {
  std::mt19937 rng(1708);
  const Shape shape = kShapes[0];
  const Batch b = MakeBatch16({{1, 1}, {1, 40}, {1, 300}, {1, 17}}, shape, rng, DType::kBF16);
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_size));
  const HostTensor want = CudaPagedAttention16::Reference(b, scale);
  const DeviceWorkspace workspace(
      PagedAttentionWorkspaceBytes(4, shape.num_heads, shape.head_size, 4096));
  EXPECT_TRUE(Close(CudaPagedAttention16::Run(b, DType::kBF16, scale, workspace.Context(),
                                              /*with_lens=*/false, /*with_qsl=*/true, 4096),
                    want, kAtol16, Rtol16(DType::kBF16)));
}

TEST_F(CudaPagedAttention16, F16DecodeMatchesCpu) {
  std::mt19937 rng(1706);
  ExpectDecodeMatchesCpu(DType::kF16, rng);
}

// Enough sequences to fill the device: no split (and no workspace needed); with no workspace a
// long context is not split either, and both are still right.
TEST_F(CudaPagedAttention16, NoSplitWhenTheBatchFillsTheDeviceOrWithoutWorkspace) {
  std::mt19937 rng(1702);
  const Shape shape{32, 8, 128, 16};
  const DType dtype = DType::kBF16;
  const float scale = 0.0883883f;
  std::vector<SeqSpec> many;
  for (int s = 0; s < 140; ++s) many.push_back({1, 1 + s % 23});
  many.push_back({1, 600});
  const Batch b = MakeBatch16(many, shape, rng, dtype);
  const size_t ws_bytes = PagedAttentionWorkspaceBytes(141, 32, 128, 2048);
  const std::vector<int32_t> lens = SeqLensHost(b);
  EXPECT_EQ(PlanFor(b, shape, ws_bytes, lens).num_splits, 1);  // 141 x 8 CTAs >= two waves
  const DeviceWorkspace workspace(ws_bytes);
  EXPECT_TRUE(Close(Run(b, dtype, scale, workspace.Context(), true), Reference(b, scale), kAtol16,
                    Rtol16(dtype)));
  EXPECT_FALSE(workspace.Written());

  const Batch one = MakeBatch16({{1, 1000}}, shape, rng, dtype);
  EXPECT_EQ(PlanFor(one, shape, 0, {}).num_splits, 1);
  EXPECT_TRUE(Close(Run(one, dtype, scale, OpContext{}, false), Reference(one, scale), kAtol16,
                    Rtol16(dtype)));
}

// Bad metadata gives NaN rows of its sequence only, split or not: a block id outside the
// cache, a context longer than the block table, and (split) a context longer than max_seq_len
// said; the other sequences are right. Group sizes 3 and 12 (CTAs with idle heads, two head
// chunks) and block size 7 (a page lookup per position) on the way.
TEST_F(CudaPagedAttention16, BadMetadataGivesNanRowsOfItsSequenceOnly) {
  std::mt19937 rng(1703);
  for (const Shape& shape : {Shape{12, 4, 64, 16}, Shape{12, 1, 128, 7}}) {
    SCOPED_TRACE(Describe(shape));
    const DType dtype = DType::kBF16;
    Batch b = MakeBatch16({{1, 40}, {1, 700}, {1, 300}, {1, 520}}, shape, rng, dtype);
    const float scale = 0.125f;
    const HostTensor want = Reference(b, scale);
    const int64_t max_blocks = b.block_tables.view().shape[1];
    b.block_tables.data<int32_t>()[0 * max_blocks + 1] = 1 << 20;  // sequence 0, block 1
    b.block_tables.data<int32_t>()[1 * max_blocks + 2] = -5;       // sequence 1, block 2
    b.d_block_tables = DeviceTensor(b.block_tables);
    b.seq_lens.data<int32_t>()[2] = static_cast<int32_t>(max_blocks * shape.block_size + 1);
    b.d_seq_lens = DeviceTensor(b.seq_lens);
    const DeviceWorkspace workspace(
        PagedAttentionWorkspaceBytes(4, shape.num_heads, shape.head_size, 4096));
    const int64_t row = shape.num_heads * shape.head_size;
    for (const int max_seq_len : {-1, 0}) {  // the batch's (split), unknown (not split)
      SCOPED_TRACE(::testing::Message() << "max_seq_len " << max_seq_len);
      const HostTensor got = Run(b, dtype, scale, workspace.Context(), false, true, max_seq_len);
      for (int64_t i = 0; i < 3 * row; ++i) ASSERT_TRUE(std::isnan(got.data<float>()[i])) << i;
      EXPECT_TRUE(gpu_testing::AllClose(
          got.data<float>() + 3 * row,
          std::vector<double>(want.data<float>() + 3 * row, want.data<float>() + 4 * row), kAtol16,
          Rtol16(dtype)));
    }
    // max_seq_len below the truth when split: sequence 3 (520) past 2 splits of 256 is NaN.
    const HostTensor got = Run(b, dtype, scale, workspace.Context(), false, true, 500);
    for (int64_t i = 3 * row; i < 4 * row; ++i) ASSERT_TRUE(std::isnan(got.data<float>()[i])) << i;
  }
}

// A cache of more than 2^31 elements (two 4.3 GB caches, sparse: only the pages the sequences
// own are written) whose sequences live in its last blocks: 64-bit offsets all the way.
TEST_F(CudaPagedAttention16, CacheLargerThan2To31Elements) {
  std::mt19937 rng(1704);
  const Shape shape{32, 8, 128, 16};
  const DType dtype = DType::kBF16;
  const int64_t slot_numel = shape.num_kv_heads * shape.head_size;
  const int64_t block_numel = shape.block_size * slot_numel;
  const int64_t num_blocks = (int64_t{1} << 31) / block_numel + 64;  // > 2^31 elements
  Batch b = MakeBatch16({{1, 300}, {1, 33}}, shape, rng, dtype);
  const float scale = 0.0883883f;
  const HostTensor want = Reference(b, scale);
  // The same blocks at the end of a large cache: block id i becomes num_blocks - 1 - i.
  const int64_t small_blocks = b.key_cache.view().shape[0];
  void* big[2] = {nullptr, nullptr};
  const size_t bytes = static_cast<size_t>(num_blocks * block_numel) * 2;
  ASSERT_EQ(cudaMalloc(&big[0], bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&big[1], bytes), cudaSuccess);
  const HostTensor k16 = ToHalf(b.key_cache, dtype), v16 = ToHalf(b.value_cache, dtype);
  for (int64_t i = 0; i < small_blocks; ++i) {
    const size_t dst = static_cast<size_t>((num_blocks - 1 - i) * block_numel) * 2;
    const size_t src = static_cast<size_t>(i * block_numel) * 2;
    ASSERT_EQ(cudaMemcpy(static_cast<char*>(big[0]) + dst,
                         static_cast<const char*>(k16.view().data) + src, block_numel * 2,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(static_cast<char*>(big[1]) + dst,
                         static_cast<const char*>(v16.view().data) + src, block_numel * 2,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  int32_t* table = b.block_tables.data<int32_t>();
  for (int64_t i = 0; i < b.block_tables.numel(); ++i) {
    if (table[i] >= 0) table[i] = static_cast<int32_t>(num_blocks - 1 - table[i]);
  }
  b.d_block_tables = DeviceTensor(b.block_tables);
  TensorView kc = b.d_key_cache.view(), vc = b.d_value_cache.view();
  kc.data = big[0];
  vc.data = big[1];
  kc.shape[0] = vc.shape[0] = num_blocks;
  ASSERT_GT(kc.numel(), int64_t{1} << 31);
  const DeviceWorkspace workspace(PagedAttentionWorkspaceBytes(2, 32, 128, 2048));
  const auto& qs = b.query.view().shape;
  DeviceTensor out(HostTensor(dtype, std::span<const int64_t>(qs.data(), 3)));
  out.Poison();
  const std::vector<int32_t> lens = SeqLensHost(b);
  AttentionMetadata md = b.DeviceMetadata(-1, true);
  md.seq_lens_host = lens;
  const OpStatus s =
      PagedAttention(workspace.Context(), out.view(), b.d_query.view(), kc, vc, md, scale);
  EXPECT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(Sync(), "");
  EXPECT_TRUE(Close(HalfToFloat(out.Download()), want, kAtol16, Rtol16(dtype)));
  cudaFree(big[0]);
  cudaFree(big[1]);
}

// A decode-only 16-bit batch is one kernel, or two with a split (the decode kernel and its
// reduction): no prefill launch when the host knows the q_lens; without them the prefill kernel
// is launched too (it finds on the device that no sequence has q_len > 1, and its CTAs exit).
// Counted as kernel nodes of a CUDA graph captured from the op's stream, then replayed and compared
// with the CPU.
TEST_F(CudaPagedAttention16, DecodeOnlyBatchesLaunchTheDecodeKernelAndItsReductionOnly) {
  std::mt19937 rng(1707);
  const Shape shape{8, 2, 64, 16};
  const DType dtype = DType::kF16;
  const float scale = 0.125f;
  struct Case {
    std::vector<SeqSpec> seqs;
    bool host_qsl;
    size_t kernels;
  };
  const Case cases[] = {
      {{{1, 40}, {1, 200}, {1, 7}}, true, 1},  // contexts <= 256: never split
      {{{1, 40}, {1, 900}, {1, 7}}, true, 2},  // split: + the reduction
      {{{1, 40}, {1, 900}, {1, 7}}, false, 3},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "longest " << c.seqs[1].seq_len << (c.host_qsl ? ", host q_lens" : ""));
    const Batch b = MakeBatch16(c.seqs, shape, rng, dtype);
    const HostTensor want = Reference(b, scale);
    const DeviceWorkspace workspace(
        PagedAttentionWorkspaceBytes(3, shape.num_heads, shape.head_size, 1024));
    const auto& qs = b.query.view().shape;
    DeviceTensor out(HostTensor(dtype, std::span<const int64_t>(qs.data(), 3)));
    out.Poison();
    ASSERT_EQ(Sync(), "");
    OpStatus s;
    const gpu_testing::NodeCounts counts = gpu_testing::CaptureAndRun([&](cudaStream_t stream) {
      s = PagedAttention(workspace.Context(stream), out.view(), b.d_query.view(),
                         b.d_key_cache.view(), b.d_value_cache.view(),
                         b.DeviceMetadata(-1, c.host_qsl), scale);
    });
    ASSERT_TRUE(s.ok()) << s.message;
    EXPECT_EQ(counts.kernels, c.kernels);
    EXPECT_TRUE(Close(HalfToFloat(out.Download()), want, kAtol16, Rtol16(dtype)));
  }
}

// Wrong dtypes are errors naming the argument. (An explicit v1 / v2 with 16-bit queries runs
// the SIMT kernels: CudaPagedAttentionHalfQuery.)
TEST_F(CudaPagedAttention16, MixedDtypesAreErrors) {
  std::mt19937 rng(1705);
  const Shape shape{4, 1, 64, 16};
  const Batch b = MakeBatch16({{1, 20}}, shape, rng, DType::kBF16);
  const Batch f = MakeBatch({{1, 20}}, shape, rng);  // f32 caches
  DeviceTensor out(HostTensor(DType::kBF16, {1, 4, 64}));
  DeviceTensor out32(Poisoned({1, 4, 64}));
  // bf16 query with f32 caches.
  EXPECT_EQ(PagedAttention({}, out.view(), b.d_query.view(), f.d_key_cache.view(),
                           f.d_value_cache.view(), b.DeviceMetadata(), 0.125f)
                .message,
            "PagedAttention: key_cache: expected bf16 [?, ?, ?, 64], got f32 [4, 16, 1, 64] on "
            "cuda:0");
  // bf16 query into an f32 output.
  EXPECT_EQ(PagedAttention({}, out32.view(), b.d_query.view(), b.d_key_cache.view(),
                           b.d_value_cache.view(), b.DeviceMetadata(), 0.125f)
                .message,
            "PagedAttention: out: expected bf16 [1, 4, 64], got f32 [1, 4, 64] on cuda:0");
  AttentionMetadata md = b.DeviceMetadata();
  const std::vector<int32_t> lens = {20, 20};
  md.seq_lens_host = lens;
  EXPECT_EQ(PagedAttention({}, out.view(), b.d_query.view(), b.d_key_cache.view(),
                           b.d_value_cache.view(), md, 0.125f)
                .message,
            "PagedAttention: metadata.seq_lens_host: expected 1 entries (or none), got 2");
}

// Decode rows with a sliding window and a softcap through the split-KV decode kernel: windows of
// 1, 5, 64, 100, 257 and 700 and longer than every context (2000), softcap 1 alone and with a
// window, split (the workspace PagedAttentionWorkspaceBytes gives) and not, with and without the
// host seq_lens; bf16 at three shapes (block size 7: a page lookup per position), f16 at one.
// The positions before each window are NaN in the caches. With a window the split covers the
// window only: a context of 1000 under a window of 700 reads from 256 (the window's first
// position 300 rounded down to 64) and splits 744 keys in 3, not 1000 in 4.
TEST_F(CudaPagedAttention16, DecodeWithWindowAndSoftcapMatchesCpu) {
  std::mt19937 rng(1730);
  const std::vector<SeqSpec> seqs = {{1, 1000}, {1, 15}, {1, 300}, {1, 77}, {1, 700}};
  struct Opt {
    int window;
    float softcap;
  };
  struct Run16 {
    Shape shape;
    DType dtype;
  };
  for (const Run16 r : {Run16{{8, 2, 64, 16}, DType::kBF16}, Run16{{8, 2, 128, 32}, DType::kBF16},
                        Run16{{4, 1, 64, 7}, DType::kBF16}, Run16{{8, 2, 128, 16}, DType::kF16}}) {
    for (const Opt o : {Opt{1, 0}, Opt{5, 0}, Opt{64, 0}, Opt{100, 0}, Opt{257, 0}, Opt{700, 0},
                        Opt{2000, 0}, Opt{0, 1.0f}, Opt{100, 1.0f}}) {
      SCOPED_TRACE(std::string(DTypeName(r.dtype)) + ", " + Describe(r.shape) + ", window " +
                   std::to_string(o.window) + ", softcap " + std::to_string(o.softcap));
      Batch b = MakeBatch(seqs, r.shape, rng, 1.0f, r.dtype);
      b.query = RoundedThroughHalf(Random({5, r.shape.num_heads, r.shape.head_size}, rng, -3, 3),
                                   r.dtype);
      b.d_query = DeviceTensor(ToHalf(b.query, r.dtype));
      PoisonBeforeWindows(b, o.window);
      const AttentionOptions options{1.0f / std::sqrt(static_cast<float>(r.shape.head_size)),
                                     o.window, o.softcap};
      const HostTensor want = CudaPagedAttention16::Reference(b, options);
      const size_t ws_bytes =
          PagedAttentionWorkspaceBytes(5, r.shape.num_heads, r.shape.head_size, 2048);
      const DeviceWorkspace workspace(ws_bytes);
      const DeviceWorkspace none(0);
      for (const bool with_lens : {false, true}) {
        SCOPED_TRACE(with_lens ? "host seq_lens" : "no host seq_lens");
        EXPECT_TRUE(
            Close(CudaPagedAttention16::Run(b, r.dtype, options, workspace.Context(), with_lens),
                  want, kAtol16, Rtol16(r.dtype)));
      }
      EXPECT_TRUE(Close(CudaPagedAttention16::Run(b, r.dtype, options, none.Context(), true), want,
                        kAtol16, Rtol16(r.dtype)))
          << "unsplit";
    }
  }
  // The split of one context of 1000 keys, with and without a window of 700.
  const Shape shape{8, 2, 64, 16};
  const Batch one = MakeBatch16({{1, 1000}}, shape, rng, DType::kBF16);
  const std::vector<int32_t> lens = SeqLensHost(one);
  const size_t ws_bytes = PagedAttentionWorkspaceBytes(1, 8, 64, 2048);
  const cuda::DecodePlan whole = PlanFor(one, shape, ws_bytes, lens);
  const cuda::DecodePlan windowed = PlanFor(one, shape, ws_bytes, lens, 700);
  EXPECT_EQ(whole.split_keys, 256);
  EXPECT_EQ(whole.num_splits, 4);
  EXPECT_EQ(windowed.split_keys, 256);
  EXPECT_EQ(windowed.num_splits, 3);
}

// 16-bit queries and outputs (f16 and bf16, with caches of the same dtype) against the CPU op on
// the same values: queries and caches rounded to the dtype, then given to the CPU op in f32.
// Scores, softmax and sums are fp32 on both, so the difference is fp32's (kAtol, kRtol) plus
// the one rounding of the output to the dtype: 2^-8 relative for bf16 (8 significant bits),
// 2^-11 for f16. The output is poisoned (0xFFFF: NaN in both dtypes) before each launch.
class CudaPagedAttentionHalfQuery : public CudaPagedAttention {
 protected:
  // b's query replaced by its values rounded to `dtype`: on the host as f32, on the device in
  // `dtype`.
  static void RoundQuery(Batch& b, DType dtype) {
    b.query = RoundedThroughHalf(b.query, dtype);
    b.d_query = DeviceTensor(ToHalf(b.query, dtype));
  }

  static void ExpectAllVersionsMatchInHalf(const Batch& b, DType dtype, float scale,
                                           const HostTensor& want) {
    ExpectAllVersionsMatchInHalf(b, dtype, AttentionOptions{scale}, want);
  }
  static void ExpectAllVersionsMatchInHalf(const Batch& b, DType dtype,
                                           const AttentionOptions& options,
                                           const HostTensor& want) {
    const double simt_rtol = kRtol + (dtype == DType::kBF16 ? 1.0 / 256 : 1.0 / 2048);
    // kAuto at head sizes 64 and 128 runs the tensor-core prefill kernel, which rounds the
    // probabilities to the 16-bit type before the P.V MMA (as FlashAttention-2 does): the bound
    // of paged_attention_prefill_test.cc.
    const int64_t head_size = b.query.view().shape[2];
    const bool tensor_cores = head_size == 64 || head_size == 128;
    const double mma_tol = dtype == DType::kBF16 ? 8e-3 : 1.5e-3;
    DeviceTensor out(ToHalf(want, dtype));
    const DeviceWorkspace workspace(V2WorkspaceBytes(b));
    const OpContext ctx = workspace.Context();
    for (const PagedAttentionVersion v :
         {PagedAttentionVersion::kV1, PagedAttentionVersion::kV2, PagedAttentionVersion::kAuto}) {
      for (const bool host_qsl : {false, true}) {
        if (host_qsl && v != PagedAttentionVersion::kAuto) continue;
        SCOPED_TRACE(::testing::Message() << "version " << static_cast<int>(v)
                                          << (host_qsl ? ", q_lens on the host" : ""));
        out.Poison();
        const OpStatus s =
            v == PagedAttentionVersion::kAuto
                ? PagedAttention(ctx, out.view(), b.d_query.view(), b.d_key_cache.view(),
                                 b.d_value_cache.view(), b.DeviceMetadata(-1, host_qsl), options)
                : cuda::PagedAttention(ctx, out.view(), b.d_query.view(), b.d_key_cache.view(),
                                       b.d_value_cache.view(), b.DeviceMetadata(), options, v);
        ASSERT_TRUE(s.ok()) << s.message;
        ASSERT_EQ(Sync(), "");
        const HostTensor got = out.Download();
        ASSERT_EQ(got.view().dtype, dtype);
        const bool mma = tensor_cores && v == PagedAttentionVersion::kAuto;
        EXPECT_TRUE(
            Close(HalfToFloat(got), want, mma ? mma_tol : kAtol, mma ? mma_tol : simt_rtol));
      }
    }
  }
};

TEST_F(CudaPagedAttentionHalfQuery, MatchesCpuOnTheSameValuesForEveryHeadSize) {
  std::mt19937 rng(614);
  // Decode rows (contexts of 1, 17, 600 and 1030: two partitions), a chunk after cached
  // context, a fresh chunk.
  const std::vector<SeqSpec> batch = {{1, 1}, {1, 17}, {15, 47}, {1, 600}, {17, 17}, {1, 1030}};
  const Shape shapes[] = {
      {4, 1, 16, 16}, {8, 2, 32, 32}, {8, 2, 64, 16}, {4, 4, 128, 32},  // MQA, GQA, MHA
  };
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const Shape& shape : shapes) {
      SCOPED_TRACE(Describe(shape) + ", " + DTypeName(dtype));
      Batch b = MakeBatch(batch, shape, rng, 1.0f, dtype);
      RoundQuery(b, dtype);
      const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_size));
      ExpectAllVersionsMatchInHalf(b, dtype, scale, Reference(b, scale));
    }
  }
}

// A sliding window and a softcap on mixed 16-bit batches: kAuto sends the decode rows to the
// decode kernel and the chunks (from scratch, after cached context, longer than the tensor-core
// kernel's 64-row tile) to the tensor-core prefill kernel; v1 and v2 run every row on the SIMT
// kernels. Windows of 1, 20 (with softcap 1) and 300; the positions before each window NaN;
// bf16 at head sizes 64 and 128, f16 at 64.
TEST_F(CudaPagedAttentionHalfQuery, WindowAndSoftcapMatchCpu) {
  std::mt19937 rng(1731);
  const std::vector<SeqSpec> batch = {{1, 17}, {15, 47}, {1, 600}, {17, 17}, {70, 100}};
  struct Opt {
    int window;
    float softcap;
  };
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const Shape& shape : {Shape{8, 2, 64, 16}, Shape{4, 4, 128, 32}}) {
      if (dtype == DType::kF16 && shape.head_size == 128) continue;  // fewer cases
      for (const Opt o : {Opt{1, 0}, Opt{20, 1.0f}, Opt{300, 0}}) {
        SCOPED_TRACE(Describe(shape) + ", " + DTypeName(dtype) + ", window " +
                     std::to_string(o.window) + ", softcap " + std::to_string(o.softcap));
        Batch b = MakeBatch(batch, shape, rng, 3.0f, dtype);
        RoundQuery(b, dtype);
        PoisonBeforeWindows(b, o.window);
        const AttentionOptions options{1.0f / std::sqrt(static_cast<float>(shape.head_size)),
                                       o.window, o.softcap};
        ExpectAllVersionsMatchInHalf(b, dtype, options, Reference(b, options));
      }
    }
  }
}

// A 16-bit query takes a cache of its own dtype and an output of its own dtype; the CPU backend
// takes f32 queries only.
TEST_F(CudaPagedAttentionHalfQuery, MismatchedDTypesAreRejected) {
  std::mt19937 rng(615);
  const Shape shape{4, 1, 32, 16};
  Batch f32_cache = MakeBatch({{1, 20}}, shape, rng);
  RoundQuery(f32_cache, DType::kBF16);
  DeviceTensor out(ToHalf(Poisoned({1, 4, 32}), DType::kBF16));
  EXPECT_EQ(PagedAttention({}, out.view(), f32_cache.d_query.view(), f32_cache.d_key_cache.view(),
                           f32_cache.d_value_cache.view(), f32_cache.DeviceMetadata(), 0.1f)
                .message,
            "PagedAttention: key_cache: expected bf16 [?, ?, ?, 32], got f32 [4, 16, 1, 32] on "
            "cuda:0");
  Batch f16_cache = MakeBatch({{1, 20}}, shape, rng, 1.0f, DType::kF16);
  RoundQuery(f16_cache, DType::kBF16);
  EXPECT_EQ(PagedAttention({}, out.view(), f16_cache.d_query.view(), f16_cache.d_key_cache.view(),
                           f16_cache.d_value_cache.view(), f16_cache.DeviceMetadata(), 0.1f)
                .message,
            "PagedAttention: key_cache: expected bf16 [?, ?, ?, 32], got f16 [4, 16, 1, 32] on "
            "cuda:0");
  DeviceTensor f32_out(Poisoned({1, 4, 32}));
  Batch bf16 = MakeBatch({{1, 20}}, shape, rng, 1.0f, DType::kBF16);
  RoundQuery(bf16, DType::kBF16);
  EXPECT_EQ(PagedAttention({}, f32_out.view(), bf16.d_query.view(), bf16.d_key_cache.view(),
                           bf16.d_value_cache.view(), bf16.DeviceMetadata(), 0.1f)
                .message,
            "PagedAttention: out: expected bf16 [1, 4, 32], got f32 [1, 4, 32] on cuda:0");
  // On the CPU: bf16 query, out and caches pass the dtype checks and are refused by name.
  HostTensor host_query = ToHalf(bf16.query, DType::kBF16);
  HostTensor host_out = ToHalf(Poisoned({1, 4, 32}), DType::kBF16);
  HostTensor host_keys = ToHalf(bf16.key_cache, DType::kBF16);
  HostTensor host_values = ToHalf(bf16.value_cache, DType::kBF16);
  EXPECT_EQ(PagedAttention({}, host_out.view(), host_query.view(), host_keys.view(),
                           host_values.view(), bf16.HostMetadata(), 0.1f)
                .message,
            "PagedAttention: query: the CPU backend takes f32 queries, got bf16 [1, 4, 32] on cpu");
}

// The model's query: a token-strided view of the q columns of fused qkv rows (the k and v
// columns and a pad poisoned). f32 (v1, v2 and kAuto's tiled prefill) and bf16 (the decode and
// tensor-core prefill kernels): the same bytes as from the contiguous query. A bf16 row stride
// that is not a multiple of 16 bytes cannot take the 16-byte loads of the 16-bit kernels; the
// SIMT kernels run it, within their tolerance of the CPU op.
TEST_F(CudaPagedAttention, TokenStridedQueryGivesTheSameOutput) {
  std::mt19937 rng(1720);
  const std::vector<SeqSpec> seqs = {{1, 40}, {17, 17}, {5, 600}, {1, 1000}, {1, 300}};
  for (const Shape& shape : {Shape{8, 2, 128, 16}, Shape{4, 1, 64, 32}}) {
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(Describe(shape) + ", " + DTypeName(dtype));
      const Batch b =
          dtype == DType::kF32 ? MakeBatch(seqs, shape, rng) : MakeBatch16(seqs, shape, rng, dtype);
      const int64_t tokens = b.num_tokens(), d = shape.head_size;
      const int64_t q_cols = shape.num_heads * d, kv_cols = shape.num_kv_heads * d;
      const HostTensor query =
          dtype == DType::kF32 ? gpu_testing::Clone(b.query) : ToHalf(b.query, dtype);
      const float scale = 1.0f / std::sqrt(static_cast<float>(d));
      const size_t ws_bytes = std::max(
          V2WorkspaceBytes(b), PagedAttentionWorkspaceBytes(tokens, shape.num_heads, d, 1024));
      const DeviceWorkspace workspace(ws_bytes);
      const HostTensor want = Reference(b, scale);
      for (const int64_t pad : {8, 4}) {  // elements after v: 16- and 8-byte bf16 row strides
        SCOPED_TRACE("pad " + std::to_string(pad));
        HostTensor qkv = testing::PoisonedRows(dtype, tokens, q_cols + 2 * kv_cols + pad);
        testing::PutHeads(qkv, 0, query);
        DeviceTensor d_qkv(qkv);
        const TensorView strided = testing::HeadsView(d_qkv.view(), 0, shape.num_heads, d);
        const std::vector<PagedAttentionVersion> versions =
            dtype == DType::kF32
                ? std::vector{PagedAttentionVersion::kV1, PagedAttentionVersion::kV2,
                              PagedAttentionVersion::kAuto}
                : std::vector{PagedAttentionVersion::kAuto};
        for (const PagedAttentionVersion v : versions) {
          SCOPED_TRACE("version " + std::to_string(static_cast<int>(v)));
          auto run = [&](const TensorView& q) {
            DeviceTensor out(gpu_testing::Clone(query));
            out.Poison();
            const AttentionMetadata md = b.DeviceMetadata(-1, /*with_host_qsl=*/true);
            const OpStatus s =
                v == PagedAttentionVersion::kAuto
                    ? PagedAttention(workspace.Context(), out.view(), q, b.d_key_cache.view(),
                                     b.d_value_cache.view(), md, scale)
                    : cuda::PagedAttention(workspace.Context(), out.view(), q, b.d_key_cache.view(),
                                           b.d_value_cache.view(), md, scale, v);
            EXPECT_TRUE(s.ok()) << s.message;
            EXPECT_EQ(Sync(), "");
            return out.Download();
          };
          const HostTensor got = run(strided);
          if (dtype == DType::kF32 || pad == 8) {
            EXPECT_TRUE(gpu_testing::BitEqual(got, run(b.d_query.view())));
          }
          if (dtype == DType::kF32) {
            EXPECT_TRUE(Close(got, want, kAtol, kRtol));
          } else if (pad == 8) {  // the tensor-core prefill's bound (see HalfQuery above)
            EXPECT_TRUE(Close(HalfToFloat(got), want, 8e-3, 8e-3));
          } else {
            EXPECT_TRUE(Close(HalfToFloat(got), want, kAtol, kRtol + 1.0 / 256));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace llm::ops
