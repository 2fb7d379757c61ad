#include "worker_service/device_sampler.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/runtime_api.h"
#include "kernels/sampling.h"

namespace llm {

absl::StatusOr<std::unique_ptr<DeviceSampler>> DeviceSampler::Create(const Options& options) {
  Options o = options;
  if (o.max_penalty_slots < 0) o.max_penalty_slots = o.max_rows;
  ops::sampling::Workspace* ws = nullptr;
  ops::OpStatus st = ops::sampling::CreateWorkspace(o.device, o.max_rows, o.vocab_size,
                                                    o.max_logprobs, o.max_penalty_slots, &ws);
  if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("DeviceSampler: ", st.message));
  return std::unique_ptr<DeviceSampler>(new DeviceSampler(o, ws));
}

DeviceSampler::DeviceSampler(const Options& options, ops::sampling::Workspace* ws)
    : options_(options), ws_(ws), leases_(std::max(0, options.max_penalty_slots), 0) {
  for (int s = options.max_penalty_slots - 1; s >= 0; --s) free_slots_.push_back(s);
}

DeviceSampler::~DeviceSampler() { ops::sampling::DestroyWorkspace(ws_); }

absl::StatusOr<int> DeviceSampler::AcquireSlot(SamplingState* state,
                                               std::span<const SampleRow> rows,
                                               const SamplingState* parent) {
  if (free_slots_.empty()) {
    // Take the slot of a sequence that does not sample in this step (swapped out, or waiting
    // for its turn); it gets a slot again, with its counts uploaded, when it next samples.
    in_step_.assign(leases_.size(), 0);
    for (const SampleRow& r : rows) {
      if (Holds(r.state->device_slot)) in_step_[r.state->device_slot.slot] = 1;
    }
    if (parent != nullptr && Holds(parent->device_slot)) in_step_[parent->device_slot.slot] = 1;
    for (int slot = 0; slot < static_cast<int>(leases_.size()); ++slot) {
      if (in_step_[slot]) continue;
      leases_[slot] = 0;
      free_slots_.push_back(slot);
      ++evictions_;
      break;
    }
  }
  if (free_slots_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("DeviceSampler: no free penalty slot for a sequence with penalties (all ",
                     options_.max_penalty_slots, " held by sequences of this step)"));
  }
  const int slot = free_slots_.back();
  free_slots_.pop_back();
  leases_[slot] = next_lease_++;
  state->device_slot = {.slot = slot, .lease = leases_[slot]};
  return slot;
}

absl::Status DeviceSampler::Sample(const ops::OpContext& ctx, const TensorView& logits,
                                   std::span<const SampleRow> rows,
                                   std::vector<SampledToken>* out) {
  const int n = static_cast<int>(rows.size());
  if (n > options_.max_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DeviceSampler::Sample: ", n, " rows; the sampler holds at most ", options_.max_rows));
  }
  if (logits.dtype != DType::kF32 || logits.ndim != 2 || logits.shape[0] != n ||
      logits.shape[1] != options_.vocab_size ||
      !(logits.device == TensorDevice::Cuda(options_.device))) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceSampler::Sample: logits: expected f32 [", n, ", ", options_.vocab_size,
                     "] on cuda:", options_.device, ", got ", logits.ToString()));
  }
  for (int r = 0; r < n; ++r) {
    const SamplingParams& p = *rows[r].params;
    if (p.logprobs.has_value() && *p.logprobs > options_.max_logprobs) {
      return absl::InvalidArgumentError(
          absl::StrCat("DeviceSampler::Sample: row ", r, " asks for ", *p.logprobs,
                       " top logprobs; the sampler serves at most ", options_.max_logprobs));
    }
  }
  // The rows' logit biases, staged one after another.
  int64_t bias_entries = 0;
  for (const SampleRow& row : rows)
    bias_entries += static_cast<int64_t>(row.params->logit_bias.size());
  if (bias_entries > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceSampler::Sample: ", bias_entries, " logit_bias entries in one step"));
  }
  ops::sampling::TokenBias* bias = nullptr;
  if (bias_entries > 0) {
    ops::OpStatus st = ops::sampling::ReserveBias(ws_, bias_entries);
    if (!st.ok()) return absl::InternalError(absl::StrCat("DeviceSampler::", st.message));
    bias = ops::sampling::BiasStaging(ws_);
  }
  int32_t bias_used = 0;
  ops::sampling::RowParams* params = ops::sampling::HostParams(ws_);
  const int words = (options_.vocab_size + 31) / 32;
  for (int r = 0; r < n; ++r) {
    const SampleRow& row = rows[r];
    SamplingState& state = *row.state;
    const SamplingParams& p = *row.params;
    const bool penalized = p.has_penalties();
    if (penalized && !Holds(state.device_slot)) {
      absl::StatusOr<int> slot = AcquireSlot(&state, rows);
      if (!slot.ok()) return slot.status();
      const bool with_prompt = !row.prompt_tokens.empty();
      if (with_prompt) {
        uint32_t* bits = ops::sampling::PromptStaging(ws_, *slot);
        std::memset(bits, 0, words * sizeof(uint32_t));
        for (TokenId t : row.prompt_tokens) {
          if (t >= 0 && t < options_.vocab_size) bits[t >> 5] |= 1u << (t & 31);
        }
      }
      // The sequence's output so far (a sequence resumed on this worker, or one whose slot was
      // taken) starts the device counts, which Sample keeps from then on.
      const bool with_counts = !state.output_counts.empty();
      if (with_counts) {
        int32_t* counts = ops::sampling::CountStaging(ws_);
        std::memset(counts, 0, static_cast<size_t>(options_.vocab_size) * sizeof(int32_t));
        for (const auto& [t, c] : state.output_counts) {
          if (t >= 0 && t < options_.vocab_size) counts[t] = c;
        }
      }
      ops::OpStatus st = ops::sampling::InitSlot(ctx, ws_, *slot, with_prompt, with_counts);
      if (!st.ok()) return absl::InternalError(st.message);
      // The count staging is one row for all slots: the copy must be done before another
      // sequence's counts are written into it (rare: resumed or evicted sequences only).
      if (with_counts) {
        if (std::string err = cuda::StreamSynchronize(ctx.stream); !err.empty()) {
          return absl::InternalError(absl::StrCat("DeviceSampler::Sample: ", err));
        }
      }
    }
    ops::sampling::RowParams& rp = params[r];
    rp.temperature = Sampler::IsGreedy(p) ? 0.0f : static_cast<float>(p.temperature);
    rp.log_min_p = Sampler::LogMinP(p);
    rp.top_k = p.top_k;
    rp.top_p = p.top_p;
    rp.repetition_penalty = static_cast<float>(p.repetition_penalty);
    rp.frequency_penalty = p.frequency_penalty;
    rp.presence_penalty = p.presence_penalty;
    rp.key = row.key;
    rp.sample_index = state.num_samples;
    rp.slot = penalized ? state.device_slot.slot : -1;
    rp.num_logprobs = p.logprobs.has_value() ? *p.logprobs : -1;
    rp.bias_begin = bias_used;
    rp.bias_count = 0;
    for (const auto& [t, b] : p.logit_bias) {
      if (t < 0 || t >= options_.vocab_size) continue;  // refused by Validate; never applied
      bias[bias_used++] = {.token = t, .bias = b};
      ++rp.bias_count;
    }
    rp.constrained = row.allowed != nullptr ? 1 : 0;
    if (row.allowed != nullptr) {
      std::memcpy(ops::sampling::AllowedStaging(ws_, r), row.allowed, words * sizeof(uint32_t));
    }
  }
  ops::OpStatus st = ops::sampling::Sample(ctx, ws_, logits, n);
  if (!st.ok()) return absl::InternalError(absl::StrCat("DeviceSampler::", st.message));
  for (int r = 0; r < n; ++r) {
    const ops::sampling::RowResult& res = ops::sampling::Result(ws_, r);
    if (res.flags & ops::sampling::kNonFinite) {
      return absl::InternalError(
          absl::StrCat("DeviceSampler::Sample: logit ", res.bad_column, " of row ", r, " is ",
                       (res.flags & ops::sampling::kNan) ? "NaN" : "infinite"));
    }
  }
  out->assign(n, SampledToken{});
  for (int r = 0; r < n; ++r) {
    const SamplingParams& p = *rows[r].params;
    const ops::sampling::RowResult& res = ops::sampling::Result(ws_, r);
    SampledToken& s = (*out)[r];
    s.token = res.token;
    if (!p.logprobs.has_value()) continue;
    s.logprob = res.logprob;
    const int top = std::min(*p.logprobs, options_.vocab_size);
    const int32_t* ids = ops::sampling::TopLogprobIds(ws_, r);
    const float* values = ops::sampling::TopLogprobValues(ws_, r);
    s.top_logprobs.reserve(top);
    for (int i = 0; i < top; ++i) s.top_logprobs.emplace_back(ids[i], values[i]);
  }
  return absl::OkStatus();
}

void DeviceSampler::Release(const DeviceSlot& hold) {
  if (!Holds(hold)) return;
  leases_[hold.slot] = 0;
  free_slots_.push_back(hold.slot);
}

absl::Status DeviceSampler::Fork(const ops::OpContext& ctx, const SamplingState& parent,
                                 SamplingState* child) {
  if (!Holds(parent.device_slot)) return absl::OkStatus();
  if (!Holds(child->device_slot)) {
    absl::StatusOr<int> slot = AcquireSlot(child, {}, &parent);
    if (!slot.ok()) return slot.status();
  }
  ops::OpStatus st =
      ops::sampling::CopySlot(ctx, ws_, parent.device_slot.slot, child->device_slot.slot);
  if (!st.ok()) return absl::InternalError(absl::StrCat("DeviceSampler::Fork: ", st.message));
  return absl::OkStatus();
}

}  // namespace llm
