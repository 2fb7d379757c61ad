#include "worker_service/kv_cache_sizing.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace llm {
namespace {

constexpr double kGiB = 1073741824.0;
constexpr uint64_t kMaxBlocks = std::numeric_limits<int32_t>::max();

// "14.40 GiB".
std::string GiB(double bytes) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.2f GiB", bytes / kGiB);
  return text;
}

}  // namespace

uint32_t BlocksInGib(double gib, uint64_t bytes_per_block) {
  if (!(gib > 0) || bytes_per_block == 0) return 0;
  const double blocks = std::floor(gib * kGiB / static_cast<double>(bytes_per_block));
  return static_cast<uint32_t>(std::min(blocks, static_cast<double>(kMaxBlocks)));
}

absl::StatusOr<KvCacheSizing> SizeKvCache(const KvCacheSizingInput& in) {
  const double util = in.gpu_memory_utilization;
  if (!(util > 0.0 && util <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu_memory_utilization must be in (0, 1], got ", util));
  }
  if (in.total_device_memory == 0) {
    return absl::InvalidArgumentError("total_device_memory must be > 0 bytes");
  }
  if (in.bytes_per_block == 0) {
    return absl::InvalidArgumentError("bytes_per_block must be > 0");
  }
  if (in.block_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("block_size must be >= 1, got ", in.block_size));
  }
  if (in.max_model_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_model_len must be >= 1, got ", in.max_model_len));
  }
  if (!std::isfinite(in.swap_space_gib) || in.swap_space_gib < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("swap_space_gib must be finite and >= 0, got ", in.swap_space_gib));
  }

  const double total = static_cast<double>(in.total_device_memory);
  const uint64_t budget = static_cast<uint64_t>(std::floor(total * util));
  const std::string budget_text = absl::StrCat(
      GiB(static_cast<double>(budget)), " (gpu_memory_utilization ", util, " of ", GiB(total), ")");
  if (in.peak_memory >= budget) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the model does not fit: the model needs ", GiB(static_cast<double>(in.peak_memory)),
        " (weights and activations at the profiling pass's peak), the budget is ", budget_text,
        "; raise --gpu-memory-utilization, or use more tensor-parallel ranks or a larger device"));
  }
  const uint64_t kv_bytes = budget - in.peak_memory;
  const uint64_t num_gpu_blocks = std::min(kv_bytes / in.bytes_per_block, kMaxBlocks);
  const uint64_t block_size = static_cast<uint64_t>(in.block_size);
  const uint64_t blocks_per_seq =
      (static_cast<uint64_t>(in.max_model_len) + block_size - 1) / block_size;
  if (num_gpu_blocks < blocks_per_seq) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "not even one sequence of max_model_len ", in.max_model_len,
        " fits the KV cache: it needs ", blocks_per_seq, " blocks of ", in.block_size,
        " tokens, the ", GiB(static_cast<double>(kv_bytes)), " left after the model's ",
        GiB(static_cast<double>(in.peak_memory)), " of the budget of ", budget_text, " hold ",
        num_gpu_blocks, "; max_model_len can be at most ", num_gpu_blocks * block_size,
        " with this budget; lower --max-model-len or raise --gpu-memory-utilization"));
  }
  KvCacheSizing sizing;
  sizing.num_gpu_blocks = static_cast<uint32_t>(num_gpu_blocks);
  sizing.num_cpu_blocks = BlocksInGib(in.swap_space_gib, in.bytes_per_block);
  return sizing;
}

}  // namespace llm
