// Software prefetching for the scheduler's two passes over a batch of requests: it asks for
// the memory a request's step will read some requests before the step reads it.
//
// Why: the requests of a batch, their token lists and their block-table entries (in the block
// manager's hash map) are scattered over the heap, each on a page of its own, and a pass
// reaches them through pointers that the hardware prefetcher cannot predict: past a thousand
// or so running requests, TLB and cache misses grow a step's cost per request
// (bench_scheduler; docs/performance/results.md has the figures). Two things keep it flat:
// how little a decode reads (Request's layout, request.h: the request's first two cache
// lines, its table entry and the tail of its tokens; the rest only when a block is added or a
// stop list may apply), and this pipeline, which asks for exactly those lines.
//
// Each pass is a pipeline of stages at decreasing distances ahead of the request in use; a
// stage reads only what an earlier stage brought in (a pointer, a sequence id), so that no
// prefetch waits on a miss:
//
//   Schedule(), the running requests (PrefetchForScheduling; from kPrefetchMinBatch on):
//     request i + 2d   its two hot cache lines (the counts; sequence 0's id and slots)
//     request i + d    its sequence 0's block-table entry (a hash lookup by that id)
//     request i        scheduled: chunk size, AppendSlots, its diff in the output
//   UpdateFromOutput(), the scheduled requests (PrefetchForSampling; every batch):
//     request k + d    its two hot cache lines (the counts, the stop rules, the token list)
//     request k + d/2  the end of its sequence 0's token list, where the token goes
//     request k        its sampled token appended, its stop rules checked
//
// with d = kPrefetchDistance. A multi-sequence request gets only sequence 0's lines; the
// others are read on demand. Hints only: nothing here changes any state, so the scheduler's
// output does not depend on it.
#ifndef LLM_SCHEDULER_SERVICE_CORE_REQUEST_PREFETCHER_H_
#define LLM_SCHEDULER_SERVICE_CORE_REQUEST_PREFETCHER_H_

#include <cstddef>
#include <span>

#include "scheduler_service/core/block_space_manager.h"
#include "scheduler_service/core/request.h"

namespace llm {

// The running batch size from which a scheduling pass prefetches. Below it the requests stay
// in cache from step to step, and the table-entry stage (a hash computation of its own) only
// costs time.
inline constexpr size_t kPrefetchMinBatch = 512;
// Requests between one stage and the next.
inline constexpr size_t kPrefetchDistance = 8;

// The request's hot fields and its sequence 0's: its first two cache lines (request.h).
inline void PrefetchRequestHotLines(const Request* req) {
  const char* p = reinterpret_cast<const char*>(req);
  __builtin_prefetch(p);
  __builtin_prefetch(p + 64);
}

// Call before scheduling running[i]; running[end..] are no longer scheduled this step.
inline void PrefetchForScheduling(std::span<Request* const> running, size_t i, size_t end,
                                  const BlockSpaceManager& blocks) {
  if (end < kPrefetchMinBatch) return;
  constexpr size_t d = kPrefetchDistance;
  if (i + 2 * d < end) PrefetchRequestHotLines(running[i + 2 * d]);
  if (i + d < end) blocks.Prefetch(running[i + d]->seqs[0].id);
}

// Call before applying the samples of scheduled[k].
inline void PrefetchForSampling(std::span<Request* const> scheduled, size_t k) {
  constexpr size_t d = kPrefetchDistance;
  if (k + d < scheduled.size()) PrefetchRequestHotLines(scheduled[k + d]);
  if (k + d / 2 < scheduled.size()) {
    const Request* ahead = scheduled[k + d / 2];
    __builtin_prefetch(ahead->seqs[0].tokens.data() + ahead->num_tokens, /*rw=*/1);
  }
}

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_CORE_REQUEST_PREFETCHER_H_
