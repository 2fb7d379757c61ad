// The worker side of the step protocol (protocol/scheduler_output.h): keeps
// each request's state across steps from the diffs, applies swaps and copies, builds the
// batch (token ids, positions, slot_mapping, block tables, sequence lengths, query start
// offsets), runs the model and samples.
//
// Every step is checked before anything changes: an unknown request slot, a block id outside
// the cache, a sequence whose tokens or blocks cannot cover what is scheduled, a token id
// outside the vocabulary each give INVALID_ARGUMENT naming the request, and leave the state
// as it was. (A step that fails inside the model may leave the KV cache written.)
//
// Non-finite logits fail the step with INTERNAL: they mean a kernel bug or a read of a KV slot
// that was never written (the caches are poisoned with NaN), never something to sample.
//
// As an Executor, a ModelRunner runs the model in the scheduler's process: the engine's tests
// and the in-process engine use it; the gRPC workers wrap one each.
//
// Thread-safety: one thread.
#ifndef LLM_WORKER_SERVICE_MODEL_RUNNER_H_
#define LLM_WORKER_SERVICE_MODEL_RUNNER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/sampling_params.h"
#include "protocol/executor.h"
#include "protocol/scheduler_output.h"
#include "worker_service/cache_engine.h"
#include "worker_service/model/llama.h"
#include "worker_service/sampler.h"

namespace llm {

class ModelRunner : public Executor {
 public:
  // `model` and `cache` (not owned) outlive the runner. Only rank 0's sampled tokens are
  // used; every rank samples the same (seeded) way.
  ModelRunner(LlamaModel* model, CacheEngine* cache);

  absl::Status Execute(const SchedulerOutput& step, ModelOutput* out) override;

  int num_requests() const { return static_cast<int>(requests_.size()); }

 private:
  struct Sequence {
    std::vector<TokenId> token_ids;  // prompt + output
    std::vector<BlockId> block_table;
  };
  struct Request {
    std::string request_id;
    std::vector<TokenId> prompt;
    SamplingParams params;
    int num_computed_tokens = 0;
    std::map<int, Sequence> seqs;  // by sequence index
    // By sequence index; created at a sequence's first sample (n > 1: before it is forked).
    std::map<int, std::unique_ptr<SequenceSampler>> samplers;
  };

  absl::Status Validate(const SchedulerOutput& step) const;
  void Apply(const SchedulerOutput& step, const ScheduledRequest& r, bool is_new);
  SequenceSampler* SamplerFor(Request& req, int index);

  LlamaModel* model_;
  CacheEngine* cache_;
  absl::flat_hash_map<int32_t, Request> requests_;  // by slot
};

}  // namespace llm

#endif  // LLM_WORKER_SERVICE_MODEL_RUNNER_H_
