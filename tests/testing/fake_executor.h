// A worker stand-in for the engine's tests and the simulator. It keeps the batch exactly as a
// worker does, through the same BatchState (protocol/batch_state.h: the same checks and the
// same batch layout), and "computes" KV by writing each token's id into its slot of a fake KV
// memory (GPU and CPU pools, with swaps and copy-on-write applied as pairs).
//
// The next token of a sequence is a hash of the last few token ids READ BACK FROM THAT KV
// MEMORY through the batch's block table, the sequence's index and the seed (mod vocab_size),
// with an optional deterministic EOS. So the same sequence prefix always yields the same token
// whatever the batching, chunking, preemption or caching, and a wrong block id, a lost swap or
// copy, or a token the worker's sequence lacks or holds twice changes the stream. Like a
// worker, it appends the tokens it samples (BatchState::AppendSampled). With verify_kv, every
// sample also checks that the sequence's whole context is in the KV memory (INTERNAL
// otherwise); a diff the BatchState refuses fails Execute with its INVALID_ARGUMENT.
//
// Not thread-safe (the engine thread).
#ifndef LLM_TESTS_TESTING_FAKE_EXECUTOR_H_
#define LLM_TESTS_TESTING_FAKE_EXECUTOR_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/types.h"
#include "protocol/batch_state.h"
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
  // > 0: the model attends to the last `attention_window` positions only (a sliding window, as
  // the scheduler's BlockSpaceManagerConfig::sliding_window): verify_kv checks those, the
  // blocks before them being the pool's again. At least context_window.
  int attention_window = 0;
};

class FakeExecutor : public Executor {
 public:
  explicit FakeExecutor(const FakeExecutorConfig& config);

  absl::Status Execute(const SchedulerOutput& step, ModelOutput* out) override;

  // The token a sequence with this context and index samples (what Execute returns).
  TokenId NextToken(std::span<const TokenId> context_tail, int seq_index,
                    uint64_t request_seed) const;

  int num_requests() const { return batch_.num_requests(); }
  int64_t num_steps() const { return num_steps_; }
  int64_t num_copies() const { return num_copies_; }
  int64_t num_swapped_blocks() const { return num_swapped_blocks_; }

 private:
  void CopyBlocks(std::span<const BlockPair> pairs, const std::vector<TokenId>& from,
                  std::vector<TokenId>* to);
  absl::Status Sample(const BatchInputs::Sample& sample, ModelOutput* out);

  const FakeExecutorConfig config_;
  BatchState batch_;
  std::vector<TokenId> gpu_kv_;  // token id whose KV a slot holds; -1: never written
  std::vector<TokenId> cpu_kv_;
  std::vector<TokenId> scratch_;
  int64_t num_steps_ = 0;
  int64_t num_copies_ = 0;
  int64_t num_swapped_blocks_ = 0;
};

}  // namespace llm

#endif  // LLM_TESTS_TESTING_FAKE_EXECUTOR_H_
