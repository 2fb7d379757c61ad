// llm-block-demo: walks the paged KV-cache block manager through what a serving engine does
// with it (prefix sharing, n > 1 with copy-on-write, decode growth, swap under pressure) and
// prints the block tables and pool statistics at each step. Every figure printed is read
// from the manager, none is computed here.
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "scheduler_service/core/block_space_manager.h"

namespace llm {
namespace {

constexpr int kBs = 16;

std::vector<TokenId> Tokens(int n, int first) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<TokenId> Concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void Die(const absl::Status& s) {
  std::fprintf(stderr, "demo failed: %s\n", s.ToString().c_str());
  std::exit(1);
}

template <typename T>
T Must(absl::StatusOr<T> v) {
  if (!v.ok()) Die(v.status());
  return *std::move(v);
}

void Must(const absl::Status& s) {
  if (!s.ok()) Die(s);
}

void Table(const BlockSpaceManager& m, SeqId seq) {
  const BlockTable* t = m.GetBlockTable(seq);
  std::printf("    seq %lld on %s: %d tokens, blocks [%s]\n", static_cast<long long>(seq),
              DeviceName(t->device()), t->num_tokens(), absl::StrJoin(t->block_ids(), " ").c_str());
}

void Stats(const BlockSpaceManager& m) {
  const BlockSpaceManagerStats s = m.stats();
  std::printf(
      "    gpu %d/%d free (usage %.0f%%), cpu %d/%d free, cached blocks %d, "
      "prefix hit rate %.1f%% (%lld of %lld prompt tokens)\n",
      s.num_free_gpu_blocks, m.gpu_pool().num_blocks(), 100 * s.gpu_usage, s.num_free_cpu_blocks,
      m.cpu_pool().num_blocks(), s.num_cached_gpu_blocks, 100 * s.prefix_cache_hit_rate(),
      static_cast<long long>(s.prefix_cache_hits), static_cast<long long>(s.prefix_cache_queries));
}

std::string Pairs(const std::vector<BlockPair>& pairs) {
  std::vector<std::string> parts;
  for (const BlockPair& p : pairs)
    parts.push_back(std::to_string(p.src) + "->" + std::to_string(p.dst));
  return absl::StrJoin(parts, " ");
}

void Run() {
  BlockSpaceManagerConfig config{.block_size = kBs,
                                 .num_gpu_blocks = 24,
                                 .num_cpu_blocks = 16,
                                 .watermark = 0.05,
                                 .enable_prefix_caching = true};
  BlockSpaceManager m(config);
  std::printf(
      "Pools: %d GPU blocks and %d CPU blocks of %d tokens; watermark %d blocks; "
      "prefix caching on\n\n",
      config.num_gpu_blocks, config.num_cpu_blocks, kBs, m.watermark_blocks());

  const std::vector<TokenId> system = Tokens(64, 1000);  // a shared 64-token system prompt
  const std::vector<TokenId> a = Concat(system, Tokens(10, 1));
  std::printf("1. Request A: 64-token system prompt + 10 tokens -> %s\n",
              AllocStatusName(m.CanAllocate(a)));
  std::printf("    cached tokens: %d\n", Must(m.Allocate(1, a)));
  Must(m.CacheComputedBlocks(1, a, static_cast<int>(a.size())));  // its prefill ran
  Table(m, 1);
  Stats(m);

  const std::vector<TokenId> b = Concat(system, Tokens(20, 500));
  std::printf("\n2. Request B shares the system prompt: its 4 full blocks come from the cache\n");
  std::printf("    cached tokens: %d\n", Must(m.Allocate(2, b)));
  Must(m.CacheComputedBlocks(2, b, static_cast<int>(b.size())));
  Table(m, 2);
  Stats(m);

  std::printf("\n3. Request B asks for n = 2: sequence 3 forks from 2, sharing every block\n");
  Must(m.Fork(2, 3));
  Table(m, 3);
  std::vector<BlockPair> copies;
  Must(m.AppendSlots(2, 1, 0, &copies));
  Must(m.AppendSlots(3, 1, 0, &copies));
  std::printf("    each appends its own token: copy-on-write of the shared last block: %s\n",
              Pairs(copies).c_str());
  Table(m, 2);
  Table(m, 3);
  Stats(m);

  std::printf("\n4. Decode 40 tokens on A, B and B' (new blocks as the last ones fill)\n");
  const SeqId running[] = {1, 2, 3};
  int steps = 0;
  for (; steps < 40 && m.CanAppendSlots(running, 1); ++steps) {
    for (SeqId seq : running) Must(m.AppendSlots(seq, 1, 0, &copies));
  }
  std::printf("    %d steps fit\n", steps);
  for (SeqId seq : running) Table(m, seq);
  Stats(m);

  const std::vector<TokenId> c = Tokens(150, 9000);
  std::printf("\n5. Request C, 150 tokens: %s with %d free blocks\n",
              AllocStatusName(m.CanAllocate(c)), m.stats().num_free_gpu_blocks);
  const SeqId group_b[] = {2, 3};
  std::printf("    preempt B by swapping (B and B' together): CanSwapOut %s\n",
              m.CanSwapOut(group_b) ? "yes" : "no");
  const std::vector<BlockPair> out = Must(m.SwapOut(group_b));
  std::printf("    %zu blocks gpu->cpu (shared ones once): %s\n", out.size(), Pairs(out).c_str());
  std::printf("    Request C now: %s\n", AllocStatusName(m.CanAllocate(c)));
  Must(m.Allocate(4, c).status());
  Table(m, 4);
  Stats(m);

  std::printf("\n6. C and A finish; B comes back\n");
  Must(m.Free(4));
  Must(m.Free(1));
  std::printf("    CanSwapIn: %s\n", AllocStatusName(m.CanSwapIn(group_b)));
  const std::vector<BlockPair> in = Must(m.SwapIn(group_b));
  std::printf("    %zu blocks cpu->gpu: %s\n", in.size(), Pairs(in).c_str());
  Table(m, 2);
  Table(m, 3);
  Stats(m);

  std::printf("\n7. Request D repeats A's prompt after A finished: A's freed blocks are revived\n");
  std::printf("    cached tokens: %d\n", Must(m.Allocate(5, a)));
  Stats(m);
  Must(m.Free(5));
  Must(m.Free(2));
  Must(m.Free(3));
  std::printf("\nAll sequences freed: ");
  Stats(m);
  const absl::Status inv = m.CheckInvariants();
  std::printf("Invariants: %s\n", inv.ok() ? "hold" : inv.ToString().c_str());
  if (!inv.ok()) std::exit(1);
}

}  // namespace
}  // namespace llm

int main() {
  llm::Run();
  return 0;
}
