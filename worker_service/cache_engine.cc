#include "worker_service/cache_engine.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "kernels/ops.h"
#include "protocol/batch_state.h"

#ifdef LLM_WITH_CUDA
#include "kernels/cuda/runtime_api.h"
#endif

namespace llm {

size_t CacheEngine::BytesPerBlock(const CacheShape& s) {
  return 2 * static_cast<size_t>(s.num_layers) * s.block_size * s.num_kv_heads * s.head_dim *
         DTypeSize(s.dtype);
}

bool CacheEngine::PoisonByDefault() {
  const char* env = std::getenv("LLM_POISON_KV_CACHE");
  if (env != nullptr && *env != '\0') return std::string_view(env) != "0";
#ifdef NDEBUG
  return false;
#else
  return true;
#endif
}

absl::StatusOr<std::unique_ptr<CacheEngine>> CacheEngine::Create(const CacheShape& shape,
                                                                 int num_device_blocks,
                                                                 int num_host_blocks,
                                                                 DeviceContext* context,
                                                                 bool poison) {
  const bool cuda = context != nullptr && context->is_cuda();
  if (num_device_blocks < 1 || num_host_blocks < 0 || shape.num_layers < 1 ||
      shape.block_size < 1 || shape.num_kv_heads < 1 || shape.head_dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: ", num_device_blocks, " device and ", num_host_blocks,
                     " host blocks of ", shape.num_layers,
                     " layers: the device blocks and every size must be >= 1, the host "
                     "blocks >= 0"));
  }
  if (!(shape.dtype == DType::kF32 || shape.dtype == DType::kBF16 ||
        (cuda && shape.dtype == DType::kF16))) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache dtype ", DTypeName(shape.dtype),
                                                   " is not supported on ", cuda ? "cuda" : "cpu",
                                                   cuda ? " (f32, f16, bf16)" : " (f32, bf16)"));
  }
  std::unique_ptr<CacheEngine> engine(
      new CacheEngine(shape, num_device_blocks, num_host_blocks, context, poison));
  if (absl::Status s = engine->Allocate(); !s.ok()) return s;
  return engine;
}

CacheEngine::CacheEngine(const CacheShape& shape, int num_device_blocks, int num_host_blocks)
    : CacheEngine(shape, num_device_blocks, num_host_blocks, nullptr, true) {
  if (!Allocate().ok()) throw std::bad_alloc();
}

CacheEngine::CacheEngine(const CacheShape& shape, int num_device_blocks, int num_host_blocks,
                         DeviceContext* context, bool poison)
    : shape_(shape),
      num_device_blocks_(num_device_blocks),
      num_host_blocks_(num_host_blocks),
      context_(context),
      poison_(poison) {}

absl::Status CacheEngine::Allocate() {
  const CacheShape& s = shape_;
  const TensorDevice device = context_ != nullptr ? context_->device() : TensorDevice::Cpu();
  const int64_t caches = 2 * static_cast<int64_t>(s.num_layers);
  auto allocate = [&](TensorDevice where, int64_t blocks, HostMemory host,
                      Tensor* arena) -> absl::Status {
    if (std::string err =
            Tensor::Allocate(s.dtype, {caches, blocks, s.block_size, s.num_kv_heads, s.head_dim},
                             where, arena, host);
        !err.empty()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("KV cache: ", blocks, " blocks of ", BytesPerBlock(s), " bytes on ",
                       where.is_cpu() ? "the host" : where.ToString(), " do not fit: ", err));
    }
    // Poison: all-ones bytes are NaN in every float dtype.
    if (where.is_cpu()) {
      if (poison_) std::memset(arena->view().data, 0xFF, arena->view().nbytes());
      return absl::OkStatus();
    }
#ifdef LLM_WITH_CUDA
    return CudaStatus(
        cuda::MemsetAsync(arena->view().data, 0xFF, arena->view().nbytes(), context_->stream()));
#endif
    return absl::OkStatus();
  };
  const bool cuda = device.is_cuda();
  if (absl::Status st = allocate(device, num_device_blocks_, HostMemory::kReserved, &device_arena_);
      !st.ok()) {
    return st;
  }
  if (num_host_blocks_ > 0) {
    if (absl::Status st =
            allocate(TensorDevice::Cpu(), num_host_blocks_,
                     cuda ? HostMemory::kPinned : HostMemory::kReserved, &host_arena_);
        !st.ok()) {
      return st;
    }
  }
  const size_t esize = DTypeSize(s.dtype);
  const int64_t per_block = static_cast<int64_t>(s.block_size) * s.num_kv_heads * s.head_dim;
  for (int64_t c = 0; c < caches; ++c) {
    device_.push_back(TensorView::Contiguous(
        static_cast<char*>(device_arena_.view().data) + c * num_device_blocks_ * per_block * esize,
        s.dtype, {num_device_blocks_, s.block_size, s.num_kv_heads, s.head_dim}, device));
    if (num_host_blocks_ > 0) {
      host_.push_back(TensorView::Contiguous(
          static_cast<char*>(host_arena_.view().data) + c * num_host_blocks_ * per_block * esize,
          s.dtype, {num_host_blocks_, s.block_size, s.num_kv_heads, s.head_dim}));
    }
  }
  for (int l = 0; l < s.num_layers; ++l) {
    device_layers_.push_back({device_[2 * l], device_[2 * l + 1]});
  }
  if (context_ != nullptr) return context_->Synchronize();
  return absl::OkStatus();
}

CacheEngine::Memory CacheEngine::MemoryUse() const {
  Memory m;
  m.device_reserved = device_arena_.view().nbytes();
  m.device_resident = device_arena_.ResidentBytes();
  if (host_arena_.allocated()) {
    m.host_reserved = host_arena_.view().nbytes();
    m.host_resident = host_arena_.ResidentBytes();
  }
  return m;
}

ops::OpContext CacheEngine::OpContextFor() const {
  return context_ != nullptr ? context_->op_context() : ops::OpContext{};
}

absl::Status CacheEngine::Swap(std::span<const BlockPair> pairs,
                               const std::vector<TensorView>& from,
                               const std::vector<TensorView>& to) {
  if (pairs.empty()) return absl::OkStatus();
  // Every layer's K and V caches in one call: a copy per run of consecutive blocks per cache.
  const ops::OpStatus s = ops::SwapBlocks(OpContextFor(), from, to, pairs);
  return s.ok() ? absl::OkStatus() : absl::InternalError(s.message);
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
  if (pairs.empty()) return absl::OkStatus();
  std::vector<TensorView> keys, values;
  for (const LayerKvCache& l : device_layers_) {
    keys.push_back(l.key);
    values.push_back(l.value);
  }
  const ops::OpStatus s = ops::CopyBlocks(OpContextFor(), keys, values, pairs);
  return s.ok() ? absl::OkStatus() : absl::InternalError(s.message);
}

}  // namespace llm
