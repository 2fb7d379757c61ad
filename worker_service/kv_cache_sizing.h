// How many KV-cache blocks a GPU worker allocates, as vLLM sizes them: after a profiling
// forward pass at max_num_batched_tokens has measured the peak memory of everything but the
// KV cache (weights, activations, workspaces),
//
//   budget         = total_device_memory * gpu_memory_utilization
//   num_gpu_blocks = floor((budget - peak_memory) / bytes_per_block)
//   num_cpu_blocks = floor(swap_space_gib * 2^30 / bytes_per_block)   (pinned host memory)
//
// and the answer must hold at least one sequence of max_model_len tokens
// (ceil(max_model_len / block_size) blocks), or the engine could never finish a long prompt.
// Block counts are capped at 2^31 - 1 (block ids are int32).
//
// Pure functions of their arguments (no device is touched): thread-safe.
#ifndef LLM_WORKER_SERVICE_KV_CACHE_SIZING_H_
#define LLM_WORKER_SERVICE_KV_CACHE_SIZING_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace llm {

struct KvCacheSizingInput {
  uint64_t total_device_memory = 0;     // bytes of the device (cudaMemGetInfo's total)
  double gpu_memory_utilization = 0.9;  // the fraction of it the worker may use, (0, 1]
  uint64_t peak_memory = 0;             // bytes in use at the profiling pass's peak
  uint64_t bytes_per_block = 0;         // one block, all layers, K and V, this rank's heads
  int block_size = 16;                  // tokens per block
  int max_model_len = 0;                // the longest sequence the engine admits
  double swap_space_gib = 0;            // host memory for swapped-out blocks
};

struct KvCacheSizing {
  uint32_t num_gpu_blocks = 0;
  uint32_t num_cpu_blocks = 0;
};

// The block counts, or:
//   INVALID_ARGUMENT   an input out of range (named, with its value);
//   RESOURCE_EXHAUSTED the model does not fit the budget ("the model needs X GiB, the budget
//                      is Y GiB (gpu_memory_utilization U of Z GiB)"), or the KV cache left
//                      does not hold one max_model_len sequence ("... max_model_len can be at
//                      most N with this budget; lower --max-model-len or raise
//                      --gpu-memory-utilization").
absl::StatusOr<KvCacheSizing> SizeKvCache(const KvCacheSizingInput& input);

// floor(gib * 2^30 / bytes_per_block), capped at 2^31 - 1; 0 for gib <= 0. bytes_per_block > 0.
uint32_t BlocksInGib(double gib, uint64_t bytes_per_block);

}  // namespace llm

#endif  // LLM_WORKER_SERVICE_KV_CACHE_SIZING_H_
