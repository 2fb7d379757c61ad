// A worker stand-in that keeps per-request state exactly as a worker would, from the
// SchedulerOutput diffs alone, and "computes" KV by writing each token's id into its slot of a
// fake KV memory (GPU and CPU pools, with swaps and copy-on-write applied as pairs).
//
// The next token of a sequence is a hash of the last few token ids READ BACK FROM THAT KV
// MEMORY, the sequence's index and the seed (mod vocab_size), with an optional deterministic
// EOS. So the same sequence prefix always yields the same token whatever the batching,
// chunking, preemption or caching — and a wrong block id, a lost swap or copy, or a diff that
// drops a token changes the stream. With verify_kv, every sampling step also checks that the
// whole context is in the KV memory, and any inconsistency in the diff (unknown request,
// block id out of range, token counts that do not add up) fails Execute with INTERNAL.
//
// Not thread-safe (the engine thread).
#ifndef LLM_TESTS_TESTING_FAKE_EXECUTOR_H_
#define LLM_TESTS_TESTING_FAKE_EXECUTOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/types.h"
#include "protocol/executor.h"
#include "protocol/scheduler_output.h"

namespace llm {

struct FakeExecutorConfig {
  int num_gpu_blocks = 0;  // as the scheduler's BlockSpaceManagerConfig
  int num_cpu_blocks = 0;
  int block_size = 16;
  int vocab_size = 32000;
  TokenId eos_token_id = -1;     // < 0: never sampled
  double eos_probability = 0.0;  // per sampled token, a deterministic function of the context
  uint64_t seed = 0;
  int context_window = 4;  // tokens the next token depends on
  bool verify_kv = true;   // check the whole context in the KV memory at each sample
};

class FakeExecutor : public Executor {
 public:
  explicit FakeExecutor(const FakeExecutorConfig& config);

  absl::Status Execute(const SchedulerOutput& step, ModelOutput* out) override;

  // The token a sequence with this context and index samples (what Execute returns).
  TokenId NextToken(std::span<const TokenId> context_tail, int seq_index,
                    uint64_t request_seed) const;

  int num_requests() const { return static_cast<int>(requests_.size()); }
  int64_t num_steps() const { return num_steps_; }
  int64_t num_copies() const { return num_copies_; }
  int64_t num_swapped_blocks() const { return num_swapped_blocks_; }

 private:
  struct WorkerSeq {
    std::vector<TokenId> tokens;
    std::vector<BlockId> table;
  };
  struct WorkerRequest {
    std::string id;
    std::vector<TokenId> prompt;
    uint64_t seed = 0;
    int num_computed_tokens = 0;
    std::vector<WorkerSeq> seqs;  // by index; a forgotten one has no tokens
  };

  absl::Status CopyBlocks(std::span<const BlockPair> pairs, std::vector<TokenId>* from,
                          int from_blocks, std::vector<TokenId>* to, int to_blocks,
                          const char* what);
  absl::Status Apply(const ScheduledRequest& r, bool is_new, const SchedulerOutput& step,
                     ModelOutput* out);
  int64_t Slot(const WorkerSeq& seq, int i) const {
    return static_cast<int64_t>(seq.table[i / config_.block_size]) * config_.block_size +
           i % config_.block_size;
  }

  const FakeExecutorConfig config_;
  std::vector<TokenId> gpu_kv_;  // token id whose KV a slot holds; -1: never written
  std::vector<TokenId> cpu_kv_;
  absl::flat_hash_map<int32_t, WorkerRequest> requests_;
  std::vector<TokenId> scratch_;
  int64_t num_steps_ = 0;
  int64_t num_copies_ = 0;
  int64_t num_swapped_blocks_ = 0;
};

}  // namespace llm

#endif  // LLM_TESTS_TESTING_FAKE_EXECUTOR_H_
