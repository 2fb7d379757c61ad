// The KV cache of one worker rank: K and V per layer on the device, and a swap space of the
// same block shape in host memory.
//
// Layout per layer and per K or V (kernels/ops.h):
//   cache[block_id][slot_in_block][kv_head][d]   [num_blocks, block_size, num_kv_heads, head_dim]
// For the CPU backend "the device" is host memory too. Every cache is allocated once, here,
// and poisoned with NaN so that a kernel reading a slot nobody wrote shows at once.
//
// Thread-safety: one thread (the worker's step loop).
#ifndef LLM_WORKER_SERVICE_CACHE_ENGINE_H_
#define LLM_WORKER_SERVICE_CACHE_ENGINE_H_

#include <cstddef>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/types.h"
#include "kernels/tensor.h"
#include "worker_service/model/llama.h"

namespace llm {

struct CacheShape {
  int num_layers = 0;
  int num_kv_heads = 0;  // this rank's
  int head_dim = 0;
  int block_size = 16;
};

class CacheEngine {
 public:
  // Bytes one block takes over all layers, K and V, fp32: what the scheduler's pools are
  // sized with (num_blocks = memory budget / BytesPerBlock).
  static size_t BytesPerBlock(const CacheShape& shape);

  CacheEngine(const CacheShape& shape, int num_device_blocks, int num_host_blocks);
  CacheEngine(const CacheEngine&) = delete;
  CacheEngine& operator=(const CacheEngine&) = delete;

  const CacheShape& shape() const { return shape_; }
  int num_device_blocks() const { return num_device_blocks_; }
  int num_host_blocks() const { return num_host_blocks_; }
  std::span<const LayerKvCache> device_caches() const { return device_layers_; }

  // Each of the three answers INVALID_ARGUMENT, before copying anything, when a pair is out of
  // range. (A worker's steps are checked whole before, by its BatchState.)
  //
  // Device -> host, (device block, host block) pairs.
  absl::Status SwapOut(std::span<const BlockPair> pairs);
  // Host -> device, (host block, device block) pairs.
  absl::Status SwapIn(std::span<const BlockPair> pairs);
  // Device -> device (copy-on-write), all layers.
  absl::Status Copy(std::span<const BlockPair> pairs);

 private:
  absl::Status Swap(std::span<const BlockPair> pairs, const std::vector<HostTensor>& from,
                    const std::vector<HostTensor>& to);

  CacheShape shape_;
  int num_device_blocks_;
  int num_host_blocks_;
  std::vector<HostTensor> device_;  // 2 per layer: K, V
  std::vector<HostTensor> host_;
  std::vector<LayerKvCache> device_layers_;
};

}  // namespace llm

#endif  // LLM_WORKER_SERVICE_CACHE_ENGINE_H_
