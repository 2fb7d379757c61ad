#include "worker_service/cache_engine.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/ops.h"
#include "protocol/batch_state.h"

namespace llm {
namespace {

HostTensor Poisoned(const CacheShape& s, int num_blocks) {
  HostTensor t(DType::kF32, {num_blocks, s.block_size, s.num_kv_heads, s.head_dim});
  std::fill_n(t.data<float>(), t.numel(), std::numeric_limits<float>::quiet_NaN());
  return t;
}

}  // namespace

size_t CacheEngine::BytesPerBlock(const CacheShape& s) {
  return 2 * static_cast<size_t>(s.num_layers) * s.block_size * s.num_kv_heads * s.head_dim *
         sizeof(float);
}

CacheEngine::CacheEngine(const CacheShape& shape, int num_device_blocks, int num_host_blocks)
    : shape_(shape), num_device_blocks_(num_device_blocks), num_host_blocks_(num_host_blocks) {
  for (int l = 0; l < shape.num_layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      device_.push_back(Poisoned(shape, num_device_blocks));
      host_.push_back(Poisoned(shape, num_host_blocks));
    }
  }
  for (int l = 0; l < shape.num_layers; ++l) {
    device_layers_.push_back({device_[2 * l].view(), device_[2 * l + 1].view()});
  }
}

absl::Status CacheEngine::Swap(std::span<const BlockPair> pairs,
                               const std::vector<HostTensor>& from,
                               const std::vector<HostTensor>& to) {
  // Every layer's K and V caches in one call.
  std::vector<TensorView> src, dst;
  for (size_t i = 0; i < from.size(); ++i) {
    src.push_back(from[i].view());
    dst.push_back(to[i].view());
  }
  const ops::OpStatus s = ops::SwapBlocks({}, src, dst, pairs);
  if (!s.ok()) return absl::InternalError(s.message);
  return absl::OkStatus();
}

absl::Status CacheEngine::SwapOut(std::span<const BlockPair> pairs) {
  if (absl::Status s = CheckBlockPairs(pairs, num_device_blocks_, num_host_blocks_, "swap-out");
      !s.ok()) {
    return s;
  }
  return Swap(pairs, device_, host_);
}

absl::Status CacheEngine::SwapIn(std::span<const BlockPair> pairs) {
  if (absl::Status s = CheckBlockPairs(pairs, num_host_blocks_, num_device_blocks_, "swap-in");
      !s.ok()) {
    return s;
  }
  return Swap(pairs, host_, device_);
}

absl::Status CacheEngine::Copy(std::span<const BlockPair> pairs) {
  if (absl::Status s = CheckBlockPairs(pairs, num_device_blocks_, num_device_blocks_, "copy");
      !s.ok()) {
    return s;
  }
  std::vector<TensorView> keys, values;
  for (const LayerKvCache& l : device_layers_) {
    keys.push_back(l.key);
    values.push_back(l.value);
  }
  const ops::OpStatus s = ops::CopyBlocks({}, keys, values, pairs);
  return s.ok() ? absl::OkStatus() : absl::InternalError(s.message);
}

}  // namespace llm
