// Thousands of random operations on a BlockSpaceManager (allocate with shared prefixes,
// chunked compute, append with lookahead, fork, swap out and in, free, misuse), with the
// manager's invariants and a shadow model checked after each one:
//   - free + held = total on each device; ref counts equal the tables holding each block;
//     no block both free and held; every cache entry's tokens hash to its key
//     (CheckInvariants);
//   - every computed token's KV sits in the slot its table maps it to, through copy-on-write
//     and swaps (a FakeKvCache applies the copy pairs as the workers would);
//   - a prefix hit serves KV that really holds the request's tokens;
//   - every cached block's KV holds exactly the tokens the cache says it does;
//   - with a sliding window, each compute first gives back the blocks before its window
//     (ReleaseOutsideWindow, as the scheduler does), and every token the window still shows
//     keeps its KV while the released blocks go to other sequences.
// Seeded; set LLM_TEST_SEED to replay one seed. The seed is printed on failure.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler_service/core/block_space_manager.h"
#include "tests/unit/scheduler_service/core/fake_kv_cache.h"

namespace llm {
namespace {

struct SeqState {
  int group = 0;  // sequences forked from one another swap together
  std::vector<TokenId> tokens;
  int num_computed = 0;
};

class RandomRun {
 public:
  RandomRun(uint32_t seed, bool caching, int window)
      : rng_(seed),
        config_{.block_size = 4,
                .num_gpu_blocks = 48,
                .num_cpu_blocks = 24,
                .watermark = 0.05,
                .enable_prefix_caching = caching,
                .sliding_window = window},
        mgr_(config_),
        kv_(config_.num_gpu_blocks, config_.num_cpu_blocks, config_.block_size) {
    for (int i = 0; i < 4; ++i) prefixes_.push_back(RandomTokens(Uniform(4, 24)));
  }

  void Run(int num_ops) {
    for (int op = 0; op < num_ops; ++op) {
      SCOPED_TRACE(absl::StrCat("op ", op));
      Step();
      Check();
      if (::testing::Test::HasFatalFailure() || ::testing::Test::HasNonfatalFailure()) return;
    }
    for (auto& [seq, s] : seqs_) ASSERT_TRUE(mgr_.Free(seq).ok());
    seqs_.clear();
    Check();
    EXPECT_EQ(mgr_.stats().num_free_gpu_blocks, config_.num_gpu_blocks);
    EXPECT_EQ(mgr_.stats().num_free_cpu_blocks, config_.num_cpu_blocks);
  }

  int64_t hits() const { return mgr_.stats().prefix_cache_hits; }
  int64_t released() const { return mgr_.stats().num_window_released_blocks; }
  int num_swaps() const { return num_swaps_; }
  int num_cows() const { return num_cows_; }

 private:
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  std::vector<TokenId> RandomTokens(int n) {
    std::vector<TokenId> t(n);
    for (TokenId& x : t) x = Uniform(0, 30);  // a small vocabulary: equal blocks are common
    return t;
  }

  // A random sequence (in a random group when `same_group` is given), or 0 when none fits.
  template <typename Pred>
  SeqId Pick(Pred pred) {
    std::vector<SeqId> candidates;
    for (const auto& [seq, s] : seqs_) {
      if (pred(seq, s)) candidates.push_back(seq);
    }
    if (candidates.empty()) return 0;
    return candidates[Uniform(0, static_cast<int>(candidates.size()) - 1)];
  }

  std::vector<SeqId> Group(int group) const {
    std::vector<SeqId> out;
    for (const auto& [seq, s] : seqs_) {
      if (s.group == group) out.push_back(seq);
    }
    return out;
  }

  Device DeviceOf(SeqId seq) const { return mgr_.GetBlockTable(seq)->device(); }

  void Step() {
    switch (Uniform(0, 9)) {
      case 0:
      case 1:
        return NewSequence();
      case 2:
      case 3:
        return Compute();
      case 4:
      case 5:
        return Append();
      case 6:
        return Fork();
      case 7:
        return Swap();
      case 8:
        return Free();
      default:
        return Misuse();
    }
  }

  void NewSequence() {
    if (seqs_.size() >= 24) return;
    std::vector<TokenId> prompt;
    if (Uniform(0, 2) > 0) prompt = prefixes_[Uniform(0, prefixes_.size() - 1)];
    const std::vector<TokenId> tail = RandomTokens(Uniform(1, 30));
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    const std::string salt = Uniform(0, 5) == 0 ? "salted" : "";
    const AllocStatus can = mgr_.CanAllocate(prompt, salt);
    if (can != AllocStatus::kOk) {
      // The manager must agree with itself: LATER/NEVER means Allocate cannot succeed
      // without crossing the watermark; NEVER only for prompts larger than the pool.
      if (can == AllocStatus::kNever) {
        EXPECT_GT(BlockTable::NumRequiredBlocks(prompt.size(), 0, config_.block_size),
                  config_.num_gpu_blocks - mgr_.watermark_blocks());
      }
      return;
    }
    const SeqId seq = next_seq_++;
    const absl::StatusOr<int> cached = mgr_.Allocate(seq, prompt, salt);
    ASSERT_TRUE(cached.ok()) << "CanAllocate said OK: " << cached.status();
    ASSERT_EQ(*cached % config_.block_size, 0);
    ASSERT_LT(*cached, static_cast<int>(prompt.size()));
    // The hit must really hold this prompt's KV.
    ASSERT_EQ(kv_.FirstMismatch(*mgr_.GetBlockTable(seq), prompt, *cached), -1)
        << "a prefix hit served KV of other tokens";
    seqs_[seq] = SeqState{.group = next_group_++, .tokens = prompt, .num_computed = *cached};
  }

  // A chunk of prefill or the pending decode token: KV written, full blocks cached.
  void Compute() {
    const SeqId seq = Pick([&](SeqId id, const SeqState& s) {
      return DeviceOf(id) == Device::kGpu && s.num_computed < static_cast<int>(s.tokens.size());
    });
    if (seq == 0) return;
    SeqState& s = seqs_[seq];
    const BlockTable& table = *mgr_.GetBlockTable(seq);
    const int released_before = table.num_released_blocks();
    const int released = mgr_.ReleaseOutsideWindow(seq, s.num_computed);
    ASSERT_EQ(table.num_released_blocks(), released_before + released);
    // Every position the chunk's first query sees is still held; without prefix caching,
    // nothing before them is.
    const int window = config_.sliding_window, bs = config_.block_size;
    const int visible = window > 0 ? std::max(0, s.num_computed - window + 1) : 0;
    ASSERT_LE(table.num_released_blocks() * bs, visible);
    if (!config_.enable_prefix_caching) ASSERT_EQ(table.num_released_blocks(), visible / bs);
    const int end = std::min<int>(s.tokens.size(), s.num_computed + Uniform(1, 12));
    kv_.Write(*mgr_.GetBlockTable(seq), s.tokens, s.num_computed, end);
    s.num_computed = end;
    ASSERT_TRUE(mgr_.CacheComputedBlocks(seq, s.tokens, end).ok());
  }

  void Append() {
    const SeqId seq = Pick([&](SeqId id, const SeqState& s) {
      return DeviceOf(id) == Device::kGpu && s.num_computed == static_cast<int>(s.tokens.size());
    });
    if (seq == 0) return;
    const int n = Uniform(1, 3);
    const int lookahead = Uniform(0, 1) * Uniform(1, 6);
    const SeqId one[] = {seq};
    if (!mgr_.CanAppendSlots(one, n, lookahead)) {
      std::vector<BlockPair> copies;
      const absl::Status s = mgr_.AppendSlots(seq, n, lookahead, &copies);
      if (!s.ok()) {  // CanAppendSlots may be conservative, AppendSlots never lies
        ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
        ASSERT_TRUE(copies.empty());
        return;
      }
      Appended(seq, n, copies);
      return;
    }
    std::vector<BlockPair> copies;
    ASSERT_TRUE(mgr_.AppendSlots(seq, n, lookahead, &copies).ok());
    Appended(seq, n, copies);
  }

  void Appended(SeqId seq, int n, const std::vector<BlockPair>& copies) {
    kv_.Copy(copies, Device::kGpu, Device::kGpu);
    num_cows_ += copies.size();
    const std::vector<TokenId> more = RandomTokens(n);
    std::vector<TokenId>& tokens = seqs_[seq].tokens;
    tokens.insert(tokens.end(), more.begin(), more.end());
  }

  void Fork() {
    if (seqs_.size() >= 24) return;
    const SeqId parent = Pick([&](SeqId id, const SeqState& s) {
      return DeviceOf(id) == Device::kGpu && s.num_computed == static_cast<int>(s.tokens.size());
    });
    if (parent == 0) return;
    const SeqId child = next_seq_++;
    ASSERT_TRUE(mgr_.Fork(parent, child).ok());
    seqs_[child] = seqs_[parent];
  }

  void Swap() {
    const SeqId seq = Pick([](SeqId, const SeqState&) { return true; });
    if (seq == 0) return;
    const std::vector<SeqId> group = Group(seqs_[seq].group);
    if (DeviceOf(seq) == Device::kGpu) {
      if (!mgr_.CanSwapOut(group)) {
        EXPECT_EQ(mgr_.SwapOut(group).status().code(), absl::StatusCode::kResourceExhausted);
        return;
      }
      const absl::StatusOr<std::vector<BlockPair>> pairs = mgr_.SwapOut(group);
      ASSERT_TRUE(pairs.ok()) << pairs.status();
      kv_.Copy(*pairs, Device::kGpu, Device::kCpu);
    } else {
      if (mgr_.CanSwapIn(group) != AllocStatus::kOk) return;
      const absl::StatusOr<std::vector<BlockPair>> pairs = mgr_.SwapIn(group);
      ASSERT_TRUE(pairs.ok()) << pairs.status();
      kv_.Copy(*pairs, Device::kCpu, Device::kGpu);
    }
    ++num_swaps_;
  }

  void Free() {
    const SeqId seq = Pick([](SeqId, const SeqState&) { return true; });
    if (seq == 0) return;
    ASSERT_TRUE(mgr_.Free(seq).ok());
    seqs_.erase(seq);
  }

  // Caller bugs must be refused without changing anything.
  void Misuse() {
    EXPECT_EQ(mgr_.Free(next_seq_ + 1000).code(), absl::StatusCode::kNotFound);
    const SeqId seq = Pick([](SeqId, const SeqState&) { return true; });
    if (seq == 0) return;
    const SeqId one[] = {seq};
    if (DeviceOf(seq) == Device::kGpu) {
      EXPECT_EQ(mgr_.SwapIn(one).status().code(), absl::StatusCode::kFailedPrecondition);
    } else {
      EXPECT_EQ(mgr_.SwapOut(one).status().code(), absl::StatusCode::kFailedPrecondition);
      std::vector<BlockPair> copies;
      EXPECT_EQ(mgr_.AppendSlots(seq, 1, 0, &copies).code(), absl::StatusCode::kFailedPrecondition);
    }
    EXPECT_EQ(mgr_.Allocate(seq, seqs_[seq].tokens).status().code(),
              absl::StatusCode::kAlreadyExists);
  }

  void Check() {
    const absl::Status inv = mgr_.CheckInvariants();
    ASSERT_TRUE(inv.ok()) << inv;
    ASSERT_EQ(mgr_.num_sequences(), static_cast<int>(seqs_.size()));
    for (const auto& [seq, s] : seqs_) {
      const BlockTable& t = *mgr_.GetBlockTable(seq);
      ASSERT_EQ(t.num_tokens(), static_cast<int>(s.tokens.size())) << "sequence " << seq;
      const int held_from = t.num_released_blocks() * config_.block_size;
      ASSERT_EQ(kv_.FirstMismatch(t, s.tokens, s.num_computed, held_from), -1)
          << "sequence " << seq << " lost the KV of a computed token";
      // The cache's record of each hashed block matches the sequence's tokens.
      const BlockPool& pool = t.device() == Device::kGpu ? mgr_.gpu_pool() : mgr_.cpu_pool();
      for (int i = t.num_released_blocks(); i < t.num_hashed_blocks(); ++i) {
        const std::span<const TokenId> stored = pool.tokens(t.block_ids()[i]);
        ASSERT_TRUE(
            std::equal(stored.begin(), stored.end(), s.tokens.begin() + i * config_.block_size))
            << "sequence " << seq << " block " << i;
      }
    }
    // Every hashed GPU block, held or free, holds in KV exactly the tokens it is cached as.
    const BlockPool& gpu = mgr_.gpu_pool();
    for (BlockId id = 0; id < gpu.num_blocks(); ++id) {
      if (!gpu.block(id).is_hashed()) continue;
      const std::span<const TokenId> stored = gpu.tokens(id);
      const std::span<const TokenId> in_kv = kv_.Block(Device::kGpu, id);
      ASSERT_TRUE(std::equal(stored.begin(), stored.end(), in_kv.begin()))
          << "cached block " << id << " does not hold the tokens it is cached as";
    }
  }

  std::mt19937 rng_;
  BlockSpaceManagerConfig config_;
  BlockSpaceManager mgr_;
  FakeKvCache kv_;
  std::vector<std::vector<TokenId>> prefixes_;
  std::map<SeqId, SeqState> seqs_;
  SeqId next_seq_ = 1;
  int next_group_ = 1;
  int num_swaps_ = 0;
  int num_cows_ = 0;
};

std::vector<uint32_t> Seeds() {
  if (const char* env = std::getenv("LLM_TEST_SEED")) {
    return {static_cast<uint32_t>(std::strtoul(env, nullptr, 10))};
  }
  return {1, 2, 3, 4, 5, 6, 7, 8};
}

// Prefix caching on or off; no sliding window, or one of 10 positions (2.5 blocks).
class BlockSpaceManagerRandomTest : public ::testing::TestWithParam<std::tuple<bool, int>> {};

TEST_P(BlockSpaceManagerRandomTest, InvariantsHoldThroughRandomOperations) {
  const auto [caching, window] = GetParam();
  int64_t hits = 0, released = 0;
  int swaps = 0, cows = 0;
  for (uint32_t seed : Seeds()) {
    SCOPED_TRACE(absl::StrCat("seed ", seed, " (replay: LLM_TEST_SEED=", seed, ")"));
    RandomRun run(seed, caching, window);
    run.Run(3000);
    if (HasFailure()) return;
    hits += run.hits();
    released += run.released();
    swaps += run.num_swaps();
    cows += run.num_cows();
  }
  // The run must have exercised what it claims to test.
  EXPECT_GT(swaps, 50);
  EXPECT_GT(cows, 50);
  if (caching) EXPECT_GT(hits, 100);
  if (window > 0) {
    EXPECT_GT(released, 500);
  } else {
    EXPECT_EQ(released, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(PrefixCachingAndWindow, BlockSpaceManagerRandomTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(0, 10)),
                         [](const auto& info) {
                           return absl::StrCat(std::get<0>(info.param) ? "CachingOn" : "CachingOff",
                                               "Window", std::get<1>(info.param));
                         });

}  // namespace
}  // namespace llm
