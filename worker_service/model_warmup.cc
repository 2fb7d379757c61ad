#include "worker_service/model_warmup.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace llm {

absl::Status RunDummyDecode(LlamaModel& model, int seqs, int context, int block_size,
                            std::span<const LayerKvCache> caches) {
  const int width = (context + block_size - 1) / block_size;
  std::vector<int32_t> ids(seqs, 0), positions(seqs, context - 1), seq_lens(seqs, context),
      qsl(seqs + 1), rows(seqs), tables(static_cast<size_t>(seqs) * width, 0);
  std::vector<int64_t> slots(seqs, -1);
  for (int i = 0; i <= seqs; ++i) qsl[i] = i;
  for (int i = 0; i < seqs; ++i) rows[i] = i;
  const ForwardInput input{ids, positions, slots, tables, width, seq_lens, qsl, rows};
  TensorView logits;
  RETURN_IF_ERROR(model.Forward(input, caches, &logits));
  return model.Synchronize();
}

absl::Status ProfilePeakMemory(LlamaModel& model, DeviceContext* context, const CacheShape& shape,
                               const StepLimits& limits) {
  const int block_size = shape.block_size;
  const int tokens = limits.max_num_batched_tokens;
  const int seqs = std::max(1, std::min(tokens, std::max(1, limits.max_num_seqs)));
  std::vector<int32_t> ids(tokens, 0), positions(tokens), seq_lens(seqs), qsl(seqs + 1, 0),
      rows(seqs);
  std::vector<int64_t> slots(tokens, -1);
  int longest = 0;
  for (int i = 0; i < seqs; ++i) {
    seq_lens[i] = tokens / seqs + (i < tokens % seqs ? 1 : 0);
    qsl[i + 1] = qsl[i] + seq_lens[i];
    rows[i] = qsl[i + 1] - 1;
    for (int p = 0; p < seq_lens[i]; ++p) positions[qsl[i] + p] = p;
    longest = std::max(longest, seq_lens[i]);
  }
  const int max_blocks = (longest + block_size - 1) / block_size;
  std::vector<int32_t> tables(static_cast<size_t>(seqs) * max_blocks, 0);
  absl::StatusOr<std::unique_ptr<CacheEngine>> scratch = CacheEngine::Create(shape, 1, 1, context);
  if (!scratch.ok()) return scratch.status();
  const std::span<const LayerKvCache> caches = (*scratch)->device_caches();
  const ForwardInput input{ids, positions, slots, tables, max_blocks, seq_lens, qsl, rows};
  TensorView logits;
  absl::Status s = model.Forward(input, caches, &logits);
  if (s.ok()) s = model.Synchronize();
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("the profiling pass failed: ", s.message()));
  }
  // A graph's launches are planned for max_model_len whatever the step's context
  // (GraphForward), so one token of context captures the same graph at a fraction of the work.
  const int graph_batch = model.max_graph_batch();
  model.EnableCudaGraphs(0);
  absl::Status decoded = RunDummyDecode(model, std::max(1, limits.max_num_seqs),
                                        limits.max_model_len, block_size, caches);
  model.EnableCudaGraphs(graph_batch);
  for (int b : model.GraphBatchSizes()) {
    if (!decoded.ok()) break;
    decoded = RunDummyDecode(model, b, 1, block_size, caches);
  }
  if (!decoded.ok()) {
    return absl::Status(decoded.code(),
                        absl::StrCat("the decode profiling pass failed: ", decoded.message()));
  }
  return absl::OkStatus();
}

absl::Status CaptureDecodeGraphs(LlamaModel& model, const CacheEngine& cache,
                                 std::string* summary) {
  const auto start = std::chrono::steady_clock::now();
  model.EnableCudaGraphs(model.max_graph_batch());
  const std::vector<int> sizes = model.GraphBatchSizes();
  for (int b : sizes) {
    RETURN_IF_ERROR(RunDummyDecode(model, b, 1, cache.shape().block_size, cache.device_caches()));
  }
  if (summary != nullptr) {
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    *summary = absl::StrCat(
        model.num_graphs(), " of ", sizes.size(), " decode CUDA graphs captured (batch sizes ",
        sizes.empty() ? std::string("none") : absl::StrCat(sizes.front(), " to ", sizes.back()),
        ") in ", ms, " ms");
  }
  return absl::OkStatus();
}

}  // namespace llm
