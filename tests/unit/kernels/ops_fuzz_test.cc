// Random, mostly invalid metadata never makes an op read or write out of bounds: each call
// either succeeds with finite outputs or returns an error. (Run under ASan to see overruns.)
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/test_util.h"

namespace llm::ops {
namespace {

using testing::Indices;
using testing::Poisoned;
using testing::Random;

constexpr int64_t kBlocks = 5, kBlockSize = 4, kKvHeads = 2, kHeadSize = 4;

TEST(OpsFuzz, PagedAttentionWithRandomMetadata) {
  std::mt19937 rng(90);
  HostTensor key_cache = Random({kBlocks, kBlockSize, kKvHeads, kHeadSize}, rng);
  HostTensor value_cache = Random({kBlocks, kBlockSize, kKvHeads, kHeadSize}, rng);
  auto uniform = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  int ok = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t num_seqs = uniform(0, 3), max_blocks = uniform(0, 4);
    const int64_t num_tokens = uniform(0, 6);
    std::vector<int64_t> tables(num_seqs * max_blocks), seq_lens(num_seqs);
    std::vector<int64_t> qsl(num_seqs + 1);
    for (int64_t& b : tables) b = uniform(-2, kBlocks + 1);
    for (int64_t& l : seq_lens) l = uniform(-1, 18);
    // Mostly well-formed starts so that many calls get past the first check.
    qsl[0] = uniform(0, 3) == 0 ? uniform(-1, 2) : 0;
    for (int64_t s = 1; s <= num_seqs; ++s) qsl[s] = qsl[s - 1] + uniform(-1, 3);
    if (uniform(0, 1) == 0) qsl[num_seqs] = num_tokens;
    HostTensor t = Indices(tables, DType::kI32, {num_seqs, max_blocks});
    HostTensor l = Indices(seq_lens, DType::kI32);
    HostTensor q = Indices(qsl, DType::kI32);
    HostTensor query = Random({num_tokens, 2 * kKvHeads, kHeadSize}, rng);
    HostTensor out = Poisoned({num_tokens, 2 * kKvHeads, kHeadSize});
    const AttentionMetadata md{t.view(), l.view(), q.view(), static_cast<int>(uniform(0, 20))};
    const OpStatus s = PagedAttention({}, out.view(), query.view(), key_cache.view(),
                                      value_cache.view(), md, 0.5f);
    if (!s.ok()) {
      EXPECT_EQ(s.message.rfind("PagedAttention: ", 0), 0u) << s.message;
      continue;
    }
    ++ok;
    for (float v : testing::ToVector(out)) ASSERT_TRUE(std::isfinite(v)) << "trial " << trial;
  }
  EXPECT_GT(ok, 50) << "too few valid batches to mean anything";
}

TEST(OpsFuzz, ReshapeAndCacheAndEmbeddingWithRandomIndices) {
  std::mt19937 rng(91);
  HostTensor key = Random({4, kKvHeads, kHeadSize}, rng);
  HostTensor value = Random({4, kKvHeads, kHeadSize}, rng);
  HostTensor key_cache = Random({kBlocks, kBlockSize, kKvHeads, kHeadSize}, rng);
  HostTensor value_cache = Random({kBlocks, kBlockSize, kKvHeads, kHeadSize}, rng);
  HostTensor table = Random({7, 3}, rng);
  HostTensor emb = Poisoned({4, 3});
  std::uniform_int_distribution<int64_t> slot(-3, kBlocks * kBlockSize + 2), id(-2, 8);
  int ok_slots = 0, ok_ids = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    HostTensor slots = Indices({slot(rng), slot(rng), slot(rng), slot(rng)}, DType::kI64);
    ok_slots += ReshapeAndCache({}, key.view(), value.view(), key_cache.view(), value_cache.view(),
                                slots.view())
                    .ok();
    HostTensor ids = Indices({id(rng), id(rng), id(rng), id(rng)}, DType::kI32);
    ok_ids += Embedding({}, emb.view(), ids.view(), table.view()).ok();
  }
  EXPECT_GT(ok_slots, 100);
  EXPECT_GT(ok_ids, 100);
}

}  // namespace
}  // namespace llm::ops
