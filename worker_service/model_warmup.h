// The passes a worker runs on dummy batches outside the step protocol, before it serves:
//
//   - ProfilePeakMemory: what the model's peak use of device memory is, apart from the KV cache
//     (vLLM's profile run): one forward pass over a batch of max_num_batched_tokens dummy tokens
//     (spread over up to max_num_seqs sequences), then an eager decode step of max_num_seqs
//     sequences with max_model_len tokens of context each (the attention's split-K partials at
//     their largest), then every decode CUDA graph captured and launched, all over a scratch
//     cache of one block that no token writes (slot -1) and every table entry points at. The
//     model allocates nothing per step (its activations are reserved at Init), so what is in
//     use after these passes is its peak; the caller reads the device's free memory then.
//   - CaptureDecodeGraphs: drops the graphs of an earlier cache (profiling's scratch one, which
//     may have held the same address) and captures every decode graph over the real cache, so
//     that the first steps replay them.
//
// Both wait for the device. Thread-compatible: the model's thread, its device current.
#ifndef LLM_WORKER_SERVICE_MODEL_WARMUP_H_
#define LLM_WORKER_SERVICE_MODEL_WARMUP_H_

#include <span>
#include <string>

#include "absl/status/status.h"
#include "worker_service/cache_engine.h"
#include "worker_service/model/device_context.h"
#include "worker_service/model/llama.h"

namespace llm {

// The largest step the scheduler will send (its max_num_batched_tokens and max_num_seqs) and
// the longest context (max_model_len).
struct StepLimits {
  int max_num_batched_tokens = 0;
  int max_num_seqs = 0;
  int max_model_len = 0;
};

// One decode step of `seqs` sequences with `context` tokens each, token 0 at position
// context - 1 written nowhere, the context all in block 0 of `caches`; waited for.
absl::Status RunDummyDecode(LlamaModel& model, int seqs, int context, int block_size,
                            std::span<const LayerKvCache> caches);

// See the file comment. `shape` is the KV cache's (its block size and dtype are used for the
// scratch cache). Errors name the pass that failed. Leaves the model's graphs enabled as they
// were (captured over the scratch cache: CaptureDecodeGraphs recaptures them).
absl::Status ProfilePeakMemory(LlamaModel& model, DeviceContext* context, const CacheShape& shape,
                               const StepLimits& limits);

// See the file comment. *summary (when not null) says how many graphs were captured, for which
// batch sizes, in how long.
absl::Status CaptureDecodeGraphs(LlamaModel& model, const CacheEngine& cache, std::string* summary);

}  // namespace llm

#endif  // LLM_WORKER_SERVICE_MODEL_WARMUP_H_
