// The device sampler's ops (kernels/cuda/sampling.cu), behind a host-only header (no CUDA
// headers) so that worker_service/device_sampler.cc stays plain C++.
//
// A Workspace owns everything the ops use, allocated once by CreateWorkspace for at most
// max_rows rows of vocab_size logits: the per-row parameters (pinned host staging + device),
// the scaled logits [max_rows, vocab_size] (device, 4 bytes each: 131 MB for 256 rows of
// 128256), the results (device + pinned host), and the penalty slots: `num_slots` rows of
// output-token counts (i32 [vocab_size]) and prompt token bitmaps (u32 [ceil(vocab_size /
// 32)]) on the device plus a pinned staging bitmap each, for the sequences that have penalties
// (most requests have none, so only they pay the 4.1 bytes per vocabulary entry), and the
// logit biases of a step's rows (pinned host staging + device, grown by ReserveBias to the
// largest step's total: most requests have none), and a token mask per row for structured
// outputs (pinned host staging + device, 4 bytes per 32 vocabulary entries per row).
//
// Thread-compatible: one workspace per thread at a time.
#ifndef LLM_KERNELS_SAMPLING_H_
#define LLM_KERNELS_SAMPLING_H_

#include <cstddef>
#include <cstdint>

#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace llm::ops::sampling {

// One row's parameters, as the kernel reads them. Filled on the host (Workspace::params).
struct RowParams {
  float temperature = 0;  // 0: greedy
  float log_min_p = 0;    // -inf when min-p is off
  int32_t top_k = 0;      // <= 0: off
  float repetition_penalty = 1;
  double top_p = 1;  // 1: off
  double frequency_penalty = 0;
  double presence_penalty = 0;
  uint64_t key = 0;           // Philox key of the sequence
  uint64_t sample_index = 0;  // the draw's counter
  int32_t slot = -1;          // penalty slot, -1: no penalties
  int32_t num_logprobs = -1;  // -1: no logprobs; else top-N (N <= max_logprobs)
  // The row's logit biases: BiasStaging(ws)[bias_begin, bias_begin + bias_count), distinct
  // token ids in [0, vocab_size).
  int32_t bias_begin = 0;
  int32_t bias_count = 0;
  // Nonzero: AllowedStaging(ws, row) holds the row's structured-output token mask; the logits
  // of the tokens it does not allow are -inf from the biases on (not in the raw logprobs).
  int32_t constrained = 0;
};

// One logit_bias entry: `bias` is added to the logit of `token` before the penalties.
struct TokenBias {
  int32_t token;
  float bias;
};

// Per-row result, as copied back to the host.
struct RowResult {
  int32_t token;
  float logprob;       // raw log_softmax of `token`, when logprobs were asked
  int32_t flags;       // kNonFinite, kNan
  int32_t bad_column;  // the lowest non-finite logit's column, when kNonFinite
};
inline constexpr int32_t kNonFinite = 1;
inline constexpr int32_t kNan = 2;  // the logit at bad_column is NaN (else +-inf)

struct Workspace;

// Allocates a workspace on device `ordinal` (the calling thread's current device must be it).
// max_logprobs in [0, 1024]; num_slots >= 0.
OpStatus CreateWorkspace(int ordinal, int max_rows, int vocab_size, int max_logprobs, int num_slots,
                         Workspace** out);
// Frees it (after synchronizing the device's work on it). Null is fine.
void DestroyWorkspace(Workspace* ws);

// Pinned host staging: the parameters of rows [0, rows) for the next Sample, per slot a
// prompt bitmap of ceil(vocab_size / 32) words for InitSlot, and one row of vocab_size output
// counts (all slots share it; null without slots).
RowParams* HostParams(Workspace* ws);
uint32_t* PromptStaging(Workspace* ws, int slot);
int32_t* CountStaging(Workspace* ws);

// The step's logit biases, all rows' entries (RowParams::bias_begin / bias_count index it):
// room for `entries` of them after ReserveBias(ws, entries), which may reallocate (so the
// staging pointer is taken after it; call it outside a step's pending copies: Sample returns
// synchronized).
OpStatus ReserveBias(Workspace* ws, int64_t entries);
TokenBias* BiasStaging(Workspace* ws);

// Pinned host staging of row `row`'s token mask (ceil(vocab_size / 32) words: bit (id % 32) of
// word id / 32 allows id), read by the next Sample for a row whose params say `constrained`.
uint32_t* AllowedStaging(Workspace* ws, int row);

// Stream-ordered on ctx.stream: slot `slot`'s counts set to CountStaging(ws) (with_counts) or
// to zero, and its prompt bitmap to PromptStaging(ws, slot) (with_prompt) or to zero. The
// staging stays untouched until the stream has run the copy (the next Sample synchronizes it;
// the shared count row must be waited for before it is filled again).
OpStatus InitSlot(const OpContext& ctx, Workspace* ws, int slot, bool with_prompt,
                  bool with_counts = false);
// Stream-ordered: slot `to` becomes a copy of slot `from` (counts and prompt bitmap).
OpStatus CopySlot(const OpContext& ctx, Workspace* ws, int from, int to);

// Samples rows [0, rows) of `logits` (f32 [rows, vocab_size] on the workspace's device) with
// HostParams(ws)[0, rows): logit biases, penalties (counts of rows with a slot are then incremented
// at the sampled token), greedy or temperature / min-p / top-k / top-p and the exponential race,
// logprobs. Copies the results back and synchronizes ctx.stream; then Result(ws, r) and
// TopLogprobs(ws, r) hold row r's.
OpStatus Sample(const OpContext& ctx, Workspace* ws, const TensorView& logits, int rows);
const RowResult& Result(const Workspace* ws, int row);
// Row r's top-N (N = its num_logprobs): ids and raw logprobs, most likely first.
const int32_t* TopLogprobIds(const Workspace* ws, int row);
const float* TopLogprobValues(const Workspace* ws, int row);

}  // namespace llm::ops::sampling

#endif  // LLM_KERNELS_SAMPLING_H_
