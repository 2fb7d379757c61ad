// The KV cache of one worker rank: K and V per layer on the device, and a swap space of the
// same block shape in host memory (page-locked when the device is a GPU).
//
// Layout per layer and per K or V (kernels/ops.h):
//   cache[block_id][slot_in_block][kv_head][d]   [num_blocks, block_size, num_kv_heads, head_dim]
// For the CPU backend "the device" is host memory too. On cuda the 2 * num_layers caches are
// views of ONE device allocation (layer l's K at index 2l, V at 2l + 1), so that CopyBlocks and
// SwapBlocks move a block of every layer in a few launches or copies. Every cache is allocated
// once, here. On cpu both arenas are reserved address space (HostMemory::kReserved): a page
// becomes resident when a block on it is first written, so an idle worker holds only what its
// requests have used (ResidentBytes says how much). With `poison` every cache is filled with
// all-ones bytes (NaN in f32, f16 and bf16) so that a kernel reading a slot nobody wrote shows
// at once; that touches every page, so it is for tests and debug builds (PoisonByDefault). On
// cuda the device arena is always poisoned (device memory, no cost to the host). The cache
// dtype (CacheShape::dtype) is f32 or bf16 on cpu; f32, f16 or bf16 on cuda.
//
// Thread-safety: one thread (the worker's step loop).
#ifndef LLM_WORKER_SERVICE_CACHE_ENGINE_H_
#define LLM_WORKER_SERVICE_CACHE_ENGINE_H_

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"
#include "kernels/device_tensor.h"
#include "kernels/tensor.h"
#include "worker_service/model/device_context.h"
#include "worker_service/model/llama.h"

namespace llm {

struct CacheShape {
  int num_layers = 0;
  int num_kv_heads = 0;  // this rank's
  int head_dim = 0;
  int block_size = 16;
  DType dtype = DType::kF32;
};

class CacheEngine {
 public:
  // Bytes one block takes over all layers, K and V, in the cache dtype: what the scheduler's
  // pools are sized with (num_blocks = memory budget / BytesPerBlock).
  static size_t BytesPerBlock(const CacheShape& shape);

  // Whether caches are poisoned unless the caller says: true in debug builds (no NDEBUG) or
  // when the environment has LLM_POISON_KV_CACHE=1 (the tests' CMake sets it), false with
  // LLM_POISON_KV_CACHE=0 or else.
  static bool PoisonByDefault();

  // On `context`'s device (null: cpu). num_host_blocks may be 0 (no swap space: preemption by
  // recompute only). RESOURCE_EXHAUSTED naming the bytes when the caches do not fit;
  // INVALID_ARGUMENT for a dtype the device does not take or counts out of range.
  static absl::StatusOr<std::unique_ptr<CacheEngine>> Create(const CacheShape& shape,
                                                             int num_device_blocks,
                                                             int num_host_blocks,
                                                             DeviceContext* context = nullptr,
                                                             bool poison = PoisonByDefault());
  // cpu only, poisoned; throws std::bad_alloc when the memory is not there (prefer Create).
  CacheEngine(const CacheShape& shape, int num_device_blocks, int num_host_blocks);
  CacheEngine(const CacheEngine&) = delete;
  CacheEngine& operator=(const CacheEngine&) = delete;

  const CacheShape& shape() const { return shape_; }
  int num_device_blocks() const { return num_device_blocks_; }
  int num_host_blocks() const { return num_host_blocks_; }
  std::span<const LayerKvCache> device_caches() const { return device_layers_; }

  // Host memory the caches hold, for the worker's accounting. `reserved`: the arenas' sizes;
  // `resident`: their pages in memory now (mincore; on cpu what has been written or poisoned,
  // pinned swap space is always resident). The device arena of cuda is not host memory: its
  // bytes are in device_reserved only.
  struct Memory {
    size_t device_reserved = 0, device_resident = 0;  // the KV cache
    size_t host_reserved = 0, host_resident = 0;      // the swap space
  };
  Memory MemoryUse() const;

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
  CacheEngine(const CacheShape& shape, int num_device_blocks, int num_host_blocks,
              DeviceContext* context, bool poison);
  absl::Status Allocate();
  absl::Status Swap(std::span<const BlockPair> pairs, const std::vector<TensorView>& from,
                    const std::vector<TensorView>& to);
  ops::OpContext OpContextFor() const;

  CacheShape shape_;
  int num_device_blocks_;
  int num_host_blocks_;
  DeviceContext* context_;  // null: cpu
  bool poison_;
  Tensor device_arena_;  // [2 * num_layers, num_device_blocks, block_size, heads, head_dim]
  Tensor host_arena_;    // [2 * num_layers, num_host_blocks, ...]; unallocated when 0 blocks
  std::vector<TensorView> device_;  // 2 per layer: K, V
  std::vector<TensorView> host_;
  std::vector<LayerKvCache> device_layers_;
};

}  // namespace llm

#endif  // LLM_WORKER_SERVICE_CACHE_ENGINE_H_
