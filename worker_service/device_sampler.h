// The sampler on the device: Sampler's step (worker_service/sampler.h) for f32 logits that are
// already on the device, with the same arithmetic and the same Philox draws, so that a seeded
// sequence samples the same tokens as on the host, whatever shares its batch. Only the sampled
// tokens, the requested logprobs and per-row flags come back to the host: one small
// device-to-host copy and one stream synchronization per step.
//
// Penalty state: a sequence with any penalty gets a slot of the device's penalty table at its
// first Sample (or at Fork): a row of output-token counts (i32 [vocab]) and a bitmap of its
// prompt's tokens (uploaded once, then). Sample increments the count of each sampled token on
// the device, so nothing crosses per step. Slots are dense rows rather than sparse lists so
// that the penalty pass is one coalesced read per vocabulary entry with no sort or hash; they
// are allocated (with everything else) once, for `max_penalty_slots` sequences, and only
// penalized sequences take one, since most requests have no penalties. A slot starts from the
// output counts of the sequence's SamplingState (the tokens of a sequence resumed on this
// worker, or of one whose slot was taken), uploaded with one wait. The hold is recorded in that
// state (SamplingState::device_slot) under a lease of this sampler's; the sequence's owner
// hands it back with Release when the sequence goes. When every slot is held, a sequence that
// does not sample in the step loses its slot (swapped out, say: its lease ends) and takes one
// again, from its host counts, when it next samples: so the slots never run out while they
// are at least the rows of a step.
//
// Logit biases (SamplingParams::logit_bias) travel with the step's row parameters: a staging
// buffer of every row's entries, grown to the largest step's total, copied with them; so do the
// token masks of structured outputs (SampleRow::allowed), one row of bits each.
//
// Thread-compatible. The calling thread's current device must be options.device.
#ifndef LLM_WORKER_SERVICE_DEVICE_SAMPLER_H_
#define LLM_WORKER_SERVICE_DEVICE_SAMPLER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"
#include "worker_service/sampler.h"

namespace llm {

namespace ops::sampling {
struct Workspace;
}

class DeviceSampler {
 public:
  struct Options {
    int device = 0;    // CUDA ordinal
    int max_rows = 1;  // rows per Sample
    int vocab_size = 0;
    int max_logprobs = 20;       // the largest SamplingParams::logprobs served; <= 1024
    int max_penalty_slots = -1;  // sequences with penalties at once; -1: max_rows
  };

  // Allocates every device and pinned host buffer the sampler uses.
  static absl::StatusOr<std::unique_ptr<DeviceSampler>> Create(const Options& options);
  ~DeviceSampler();
  DeviceSampler(const DeviceSampler&) = delete;
  DeviceSampler& operator=(const DeviceSampler&) = delete;

  // Samples one token per row of `logits` (f32 [rows.size(), vocab_size] on the device, read in
  // stream order on ctx.stream) for the sequence of rows[r]; the caller advances each
  // sequence's state by recording its token (BatchState::AppendSampled). Returns after
  // synchronizing ctx.stream. Errors: INVALID_ARGUMENT for bad shapes or logprobs above
  // max_logprobs, RESOURCE_EXHAUSTED when a penalized sequence finds no free slot, INTERNAL
  // naming the row (and column) of a non-finite logit, or a CUDA error.
  absl::Status Sample(const ops::OpContext& ctx, const TensorView& logits,
                      std::span<const SampleRow> rows, std::vector<SampledToken>* out);

  // Frees the slot of `hold` (its sequence finished or was aborted); a no-op when it holds
  // none, or no longer does (the slot went to another sequence).
  void Release(const DeviceSlot& hold);

  // n > 1: `child` starts from `parent`'s penalty state (a copy of its counts and prompt
  // bitmap, stream-ordered on ctx.stream). A no-op when the parent holds no slot.
  absl::Status Fork(const ops::OpContext& ctx, const SamplingState& parent, SamplingState* child);

  // Whether `hold` is still a slot of this sampler's.
  bool Holds(const DeviceSlot& hold) const {
    return hold.slot >= 0 && hold.slot < static_cast<int>(leases_.size()) &&
           leases_[hold.slot] == hold.lease;
  }
  int free_penalty_slots() const { return static_cast<int>(free_slots_.size()); }
  // Slots taken from a sequence outside the step that needed one.
  int64_t slot_evictions() const { return evictions_; }

 private:
  DeviceSampler(const Options& options, ops::sampling::Workspace* ws);
  // A slot for `state` (recorded in it); when none is free, the slot of a sequence that is
  // neither in `rows` nor `parent`.
  absl::StatusOr<int> AcquireSlot(SamplingState* state, std::span<const SampleRow> rows,
                                  const SamplingState* parent = nullptr);

  Options options_;
  ops::sampling::Workspace* ws_;
  std::vector<int> free_slots_;
  std::vector<uint64_t> leases_;  // by slot: its holder's lease; 0 when free
  uint64_t next_lease_ = 1;
  std::vector<char> in_step_;  // by slot, reused by AcquireSlot: held by a sequence it keeps
  int64_t evictions_ = 0;
};

}  // namespace llm

#endif  // LLM_WORKER_SERVICE_DEVICE_SAMPLER_H_
