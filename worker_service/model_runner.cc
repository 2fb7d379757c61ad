#include "worker_service/model_runner.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#ifdef LLM_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#include "worker_service/device_sampler.h"
#endif

namespace llm {
namespace {

// The process's resident set in bytes (/proc/self/statm's second field, in pages); 0 where
// there is no procfs.
int64_t ResidentSetBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long long size = 0, resident = 0;
  const int got = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return got == 2 ? resident * sysconf(_SC_PAGESIZE) : 0;
}

}  // namespace

int64_t FirstNonFinite(std::span<const float> values) {
  constexpr size_t kChunk = 4096;
  for (size_t c = 0; c < values.size(); c += kChunk) {
    const size_t end = std::min(values.size(), c + kChunk);
    uint32_t bad = 0;  // any value with all exponent bits set
    for (size_t i = c; i < end; ++i) {
      bad |=
          static_cast<uint32_t>((std::bit_cast<uint32_t>(values[i]) & 0x7F800000u) == 0x7F800000u);
    }
    if (bad == 0) continue;
    for (size_t i = c; i < end; ++i) {
      if (!std::isfinite(values[i])) return static_cast<int64_t>(i);
    }
  }
  return -1;
}

ModelRunner::ModelRunner(LlamaModel* model, CacheEngine* cache, DeviceSampler* device_sampler,
                         std::shared_ptr<structured::GrammarCache> grammars)
    : model_(model),
      cache_(cache),
      device_sampler_(model->device().is_cuda() ? device_sampler : nullptr),
      batch_({.num_gpu_blocks = cache->num_device_blocks(),
              .num_cpu_blocks = cache->num_host_blocks(),
              .block_size = cache->shape().block_size,
              .vocab_size = model->vocab_size(),
              .grammars = std::move(grammars)}) {
  stats_.sampler =
      device_sampler_ != nullptr ? WorkerStats::Sampler::kDevice : WorkerStats::Sampler::kHost;
  stats_.cuda_graphs_enabled = model_->cuda_graphs_enabled();
  stats_.graphs_captured = model_->num_graphs();
  SampleMemory(/*force=*/true);
}

void ModelRunner::SampleMemory(bool force) {
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - memory_sampled_ < std::chrono::seconds(1)) return;
  memory_sampled_ = now;
  WorkerStats::Memory& m = stats_.memory;
  m.resident = ResidentSetBytes();
  m.weights = static_cast<int64_t>(model_->weight_bytes());
  m.coded_weights = static_cast<int64_t>(model_->coded_weight_bytes());
  const CacheEngine::Memory cache = cache_->MemoryUse();
  m.kv_reserved = static_cast<int64_t>(cache.device_reserved);
  m.kv_resident = static_cast<int64_t>(cache.device_resident);
  m.swap_reserved = static_cast<int64_t>(cache.host_reserved);
  m.swap_resident = static_cast<int64_t>(cache.host_resident);
  m.activations = static_cast<int64_t>(model_->activation_bytes());
}

void ModelRunner::CountStep(int64_t graph_replays_before, bool sampled, bool on_device) {
  ++stats_.steps;
  if (model_->graph_replays() > graph_replays_before) ++stats_.graph_steps;
  stats_.graphs_captured = model_->num_graphs();
  if (sampled) ++(on_device ? stats_.device_sampled_steps : stats_.host_sampled_steps);
  stats_.cuda_graphs_enabled = model_->cuda_graphs_enabled();
#ifdef LLM_WITH_CUDA
  if (model_->device().is_cuda()) {
    const ops::cuda::LinearPlanStats plans = ops::cuda::GetLinearPlanStats();
    stats_.linear_plans = plans.plans;
    stats_.linear_plan_hits = plans.hits;
    stats_.linear_plan_misses = plans.misses;
  }
#endif
  SampleMemory(/*force=*/false);
}

ModelRunner::~ModelRunner() {
  // The device sampler outlives the runner: the slots of the requests still held go back.
  batch_.Clear();
  ReleaseDeviceSlots();
}

void ModelRunner::ReleaseDeviceSlots() {
#ifdef LLM_WITH_CUDA
  if (device_sampler_ == nullptr) return;
  for (const DeviceSlot& hold : batch_.released_device_slots()) device_sampler_->Release(hold);
#endif
}

absl::Status ModelRunner::Execute(const SchedulerOutput& step, ModelOutput* out) {
  out->step_id = step.step_id;
  out->sampled_token_ids.clear();
  out->logprobs.clear();
  out->worker_stats = stats_;
  RETURN_IF_ERROR(batch_.Apply(step));
  ReleaseDeviceSlots();
  RETURN_IF_ERROR(cache_->SwapOut(step.blocks_to_swap_out));
  RETURN_IF_ERROR(cache_->SwapIn(step.blocks_to_swap_in));
  RETURN_IF_ERROR(cache_->Copy(step.blocks_to_copy));

  const BatchInputs& in = batch_.inputs();
  if (in.num_tokens() == 0) return absl::OkStatus();
  const auto start = std::chrono::steady_clock::now();
  const int64_t replays = model_->graph_replays();
  bool on_device = false;
  const absl::Status s = RunModel(step, out, &on_device);
  // The worker keeps its own tokens; appending them advances the sequences' sampling state.
  if (s.ok()) batch_.AppendSampled(out->sampled_token_ids);
  // Counted also when the step failed: it ran (part of) the model.
  CountStep(replays, !in.samples.empty(), on_device);
  out->worker_stats = stats_;
  VLOG(1)
      << "step " << step.step_id << ": " << in.num_tokens() << " tokens of " << in.num_seqs()
      << " sequences, " << (model_->graph_replays() > replays ? "cuda graph" : "eager")
      << (in.samples.empty() ? ""
          : on_device        ? ", sampled on the device"
                             : ", sampled on the host")
      << ", "
      << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count()
      << " ms" << (s.ok() ? "" : ", failed");
  return s;
}

absl::Status ModelRunner::RunModel(const SchedulerOutput& step, ModelOutput* out,
                                   bool* sampled_on_device) {
  const BatchInputs& in = batch_.inputs();
  ForwardInput input{in.token_ids,  in.positions, in.slot_mapping,    in.block_tables,
                     in.max_blocks, in.seq_lens,  in.query_start_loc, in.logits_indices};
#ifdef LLM_WITH_CUDA
  if (device_sampler_ != nullptr) {
    // One logits row per sample, in sample order: the n sequences of a request that sample
    // their first token all sample the prompt's last row, which the model computes once for
    // each of them.
    sample_rows_.clear();
    for (const BatchInputs::Sample& s : in.samples) {
      sample_rows_.push_back(in.logits_indices[s.logits_row]);
    }
    input.logits_indices = sample_rows_;
    RETURN_IF_ERROR(model_->Forward(input, cache_->device_caches(), &logits_));
    FillAllowed();
    // With a group, the step's wait goes through the communicator's deadline (a dead peer fails
    // it instead of hanging it) and the sampler's own wait then covers only its kernel. At one
    // rank the sampler's wait is the step's.
    if (model_->world_size() > 1 || in.samples.empty()) RETURN_IF_ERROR(model_->Synchronize());
    if (in.samples.empty()) return absl::OkStatus();
    *sampled_on_device = true;
    const bool any_logprobs = CollectRows();
    sampled_.clear();
    absl::Status s =
        device_sampler_->Sample(model_->context()->op_context(), logits_, rows_, &sampled_);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("step ", step.step_id, ": ", s.message()));
    }
    Emit(sampled_, any_logprobs, out);
    return absl::OkStatus();
  }
#endif
  RETURN_IF_ERROR(model_->Forward(input, cache_->device_caches(), &logits_));
  FillAllowed();
  RETURN_IF_ERROR(FetchLogits());
  RETURN_IF_ERROR(CheckFinite(step.step_id));
  return Sample(out);
}

absl::Status ModelRunner::FetchLogits() {
  if (logits_.device.is_cpu()) return model_->Synchronize();
  if (host_logits_.capacity_bytes() < logits_.nbytes()) {
    if (std::string err = Tensor::Allocate(DType::kF32, {logits_.numel()}, TensorDevice::Cpu(),
                                           &host_logits_, HostMemory::kPinned);
        !err.empty()) {
      return absl::ResourceExhaustedError(err);
    }
  }
  if (std::string err = CopyBytes(logits_.device, host_logits_.view().data, logits_.data,
                                  logits_.nbytes(), model_->context()->stream());
      !err.empty()) {
    return absl::InternalError(err);
  }
  RETURN_IF_ERROR(model_->Synchronize());
  TensorView host = logits_;
  host.data = host_logits_.view().data;
  host.device = TensorDevice::Cpu();
  logits_ = host;
  return absl::OkStatus();
}

// Non-finite logits mean a kernel or model bug (or KV read from a slot never written): fail
// the step rather than sample garbage.
absl::Status ModelRunner::CheckFinite(int64_t step_id) const {
  const int64_t i =
      FirstNonFinite({logits_.data_as<float>(), static_cast<size_t>(logits_.numel())});
  if (i < 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("step ", step_id, ": logit ", i % model_->vocab_size(),
                                          " of row ", i / model_->vocab_size(), " is not finite"));
}

void ModelRunner::FillAllowed() {
  const BatchInputs& in = batch_.inputs();
  allowed_at_.assign(in.samples.size(), -1);
  const auto start = std::chrono::steady_clock::now();
  int64_t constrained = 0;
  size_t used = 0;
  for (size_t i = 0; i < in.samples.size(); ++i) {
    const BatchInputs::Sample& s = in.samples[i];
    SamplingState* state = batch_.MutableSamplingState(in.seqs[s.batch_seq].slot, s.seq_index);
    if (!state->constrained()) continue;
    const structured::TokenizerInfo& vocab = state->grammar->grammar().tokenizer();
    const size_t words = static_cast<size_t>(vocab.bitmask_words());
    if (allowed_.size() < used + words) allowed_.resize(used + words);
    uint32_t* mask = allowed_.data() + used;
    state->grammar->FillNextTokenBitmask(mask);
    // A grammar with no token to go on with (its text cannot be continued by any token of the
    // vocabulary) may end: else the row is left unconstrained rather than sampled from nothing.
    if (std::all_of(mask, mask + words, [](uint32_t w) { return w == 0; })) {
      for (int32_t id : vocab.stop_token_ids()) mask[id / 32] |= 1u << (id % 32);
      if (vocab.stop_token_ids().empty()) continue;
    }
    allowed_at_[i] = static_cast<int64_t>(used);
    used += words;
    ++constrained;
  }
  if (constrained == 0) return;
  stats_.constrained_samples += constrained;
  stats_.grammar_mask_micros += std::chrono::duration_cast<std::chrono::microseconds>(
                                    std::chrono::steady_clock::now() - start)
                                    .count();
}

bool ModelRunner::CollectRows() {
  const BatchInputs& in = batch_.inputs();
  rows_.clear();
  bool any_logprobs = false;
  for (size_t i = 0; i < in.samples.size(); ++i) {
    const BatchInputs::Sample& s = in.samples[i];
    SampleRow& row =
        rows_.emplace_back(SampleRowOf(batch_, in.seqs[s.batch_seq].slot, s.seq_index));
    if (i < allowed_at_.size() && allowed_at_[i] >= 0) row.allowed = &allowed_[allowed_at_[i]];
    any_logprobs |= row.params->logprobs.has_value();
  }
  return any_logprobs;
}

void ModelRunner::Emit(std::vector<SampledToken>& sampled, bool any_logprobs, ModelOutput* out) {
  for (size_t i = 0; i < sampled.size(); ++i) {
    out->sampled_token_ids.push_back(sampled[i].token);
    if (!any_logprobs) continue;
    SampleLogprobs& lp = out->logprobs.emplace_back();
    if (!rows_[i].params->logprobs.has_value()) continue;
    lp.logprob = sampled[i].logprob;
    lp.top = std::move(sampled[i].top_logprobs);
  }
}

absl::Status ModelRunner::Sample(ModelOutput* out) {
  const BatchInputs& in = batch_.inputs();
  const int vocab = model_->vocab_size();
  row_logits_.resize(in.samples.size() * static_cast<size_t>(vocab));
  for (size_t i = 0; i < in.samples.size(); ++i) {
    const float* src =
        logits_.data_as<float>() + static_cast<size_t>(in.samples[i].logits_row) * vocab;
    std::copy(src, src + vocab, row_logits_.begin() + i * vocab);
  }
  const bool any_logprobs = CollectRows();
  std::vector<SampledToken> sampled = Sampler::Sample(row_logits_, vocab, rows_);
  Emit(sampled, any_logprobs, out);
  return absl::OkStatus();
}

}  // namespace llm
