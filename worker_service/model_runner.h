// The worker side of the step protocol (protocol/scheduler_output.h): each step is
// "batch -> forward -> sample -> append". The BatchState (protocol/batch_state.h) checks the diff
// against what this worker holds, applies it and lays out the batch; the runner applies the
// swaps and copies to the CacheEngine, runs the model over the batch, samples each sequence's
// next token from the sampling state the BatchState keeps with the sequence, and appends it to
// the sequence (which advances that state): the scheduler does not send a worker's tokens back.
//
// A bad step (the checks are BatchState's) gives INVALID_ARGUMENT naming the request and
// leaves the state as it was. A step that fails inside the model may leave the KV cache
// written.
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

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "kernels/device_tensor.h"
#include "kernels/tensor.h"
#include "protocol/batch_state.h"
#include "protocol/executor.h"
#include "protocol/scheduler_output.h"
#include "structured/grammar_cache.h"
#include "worker_service/cache_engine.h"
#include "worker_service/model/llama.h"
#include "worker_service/sampler.h"

namespace llm {

class DeviceSampler;

// The index of the first of `values` that is inf or NaN, or -1: a chunk at a time without an
// early exit, so that the compiler vectorizes the test; the index is looked for only in a bad
// chunk: a scalar loop with an early return does not vectorize, and a batch's logits are
// millions of floats every step.
int64_t FirstNonFinite(std::span<const float> values);

class ModelRunner : public Executor {
 public:
  // `model` and `cache` (not owned) outlive the runner. Every rank samples the same (seeded)
  // way and appends its tokens to its own sequences; only rank 0's travel to the scheduler. A
  // model on cuda samples on the device with `device_sampler` (not owned; sized for the batch's
  // rows), only token ids and logprobs crossing to the host; without one its logits are copied
  // to the host and sampled there. `grammars` (shared with the runners the worker makes later)
  // compiles the structured outputs of requests; without it a request with one is refused.
  ModelRunner(LlamaModel* model, CacheEngine* cache, DeviceSampler* device_sampler = nullptr,
              std::shared_ptr<structured::GrammarCache> grammars = nullptr);
  ~ModelRunner() override;

  absl::Status Execute(const SchedulerOutput& step, ModelOutput* out) override;

  int num_requests() const { return batch_.num_requests(); }
  // What this runner runs with and has done since it was created; every Execute that ran the
  // model also reports it in ModelOutput::worker_stats.
  const WorkerStats& stats() const { return stats_; }

 private:
  // Hands the device slots of the sequences the last Apply dropped back to the device sampler.
  void ReleaseDeviceSlots();
  // Brings the logits to the host (cuda: one copy, then the step's one wait).
  absl::Status FetchLogits();
  absl::Status CheckFinite(int64_t step_id) const;
  absl::Status Sample(ModelOutput* out);
  // The token mask of each sample under a structured output, into allowed_ (filled while the
  // forward pass runs on a GPU: call between launching it and waiting for it).
  void FillAllowed();
  // The samples' rows, in sample order, into rows_ (with their masks); true when some asks for
  // logprobs.
  bool CollectRows();
  void Emit(std::vector<SampledToken>& sampled, bool any_logprobs, ModelOutput* out);
  // The step's forward pass and sampling, once the batch is laid out; *sampled_on_device when
  // the device sampler sampled it.
  absl::Status RunModel(const SchedulerOutput& step, ModelOutput* out, bool* sampled_on_device);
  // Counts a step that ran the model into stats_.
  void CountStep(int64_t graph_replays_before, bool sampled, bool on_device);
  // Samples stats_.memory, unless `force` is false and it was sampled less than a second ago
  // (mincore over the KV arena and /proc/self/statm cost tens of microseconds per GiB).
  void SampleMemory(bool force);

  LlamaModel* model_;
  CacheEngine* cache_;
  DeviceSampler* device_sampler_;
  BatchState batch_;
  // Reused each step. logits_: the model's, on its device; host_logits_: their copy in pinned
  // memory when that is a GPU; row_logits_: the rows the host samples, one per sample.
  TensorView logits_;
  Tensor host_logits_;
  std::vector<float> row_logits_;
  std::vector<SampleRow> rows_;
  std::vector<int32_t> sample_rows_;  // device sampling: logits rows, one per sample
  std::vector<SampledToken> sampled_;
  // FillAllowed's: per sample, the offset of its mask in allowed_ words, or -1 (unconstrained).
  std::vector<uint32_t> allowed_;
  std::vector<int64_t> allowed_at_;
  WorkerStats stats_;
  std::chrono::steady_clock::time_point memory_sampled_;
};

}  // namespace llm

#endif  // LLM_WORKER_SERVICE_MODEL_RUNNER_H_
