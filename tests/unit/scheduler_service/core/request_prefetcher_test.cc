// The premise of the prefetch pipeline: every field a decode step reads of a one-sequence
// request lies in the request's first two cache lines, the ones PrefetchRequestHotLines asks
// for. A field added before them, or a sequence that grows past its line, fails here.
#include "scheduler_service/core/request_prefetcher.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler_service/core/request.h"

namespace llm {
namespace {

constexpr size_t kHotBytes = 128;  // the two lines PrefetchRequestHotLines prefetches

class HotLines {
 public:
  explicit HotLines(const Request& req) : base_(reinterpret_cast<uintptr_t>(&req)) {}

  template <typename T>
  void Expect(const T& field, const std::string& name) const {
    ExpectBytes(&field, sizeof(T), name);
  }
  void ExpectBytes(const void* field, size_t size, const std::string& name) const {
    const uintptr_t at = reinterpret_cast<uintptr_t>(field);
    EXPECT_GE(at, base_) << name;
    EXPECT_LE(at + size, base_ + kHotBytes)
        << name << " lies at bytes [" << at - base_ << ", " << at - base_ + size
        << ") of the request, past its two hot cache lines";
  }

 private:
  uintptr_t base_;
};

TEST(RequestPrefetcher, ARequestStartsACacheLine) {
  static_assert(alignof(Request) == 64);
  auto req = std::make_unique<Request>();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(req.get()) % 64, 0u);
}

TEST(RequestPrefetcher, WhatADecodeReadsLiesInTheTwoHotLines) {
  auto req = std::make_unique<Request>();
  Sequence& seq = req->seqs.emplace_back();
  const HotLines hot(*req);
  // The request's counts, stop rules and id (scheduling, output, stop checks).
  hot.Expect(req->slot, "slot");
  hot.Expect(req->state, "state");
  hot.Expect(req->known_to_workers, "known_to_workers");
  hot.Expect(req->has_stop_lists, "has_stop_lists");
  hot.Expect(req->n, "n");
  hot.Expect(req->num_live, "num_live");
  hot.Expect(req->num_tokens, "num_tokens");
  hot.Expect(req->num_computed_tokens, "num_computed_tokens");
  hot.Expect(req->num_prompt_tokens, "num_prompt_tokens");
  hot.Expect(req->num_cached_prompt_tokens, "num_cached_prompt_tokens");
  hot.Expect(req->min_num_tokens, "min_num_tokens");
  hot.Expect(req->max_num_tokens, "max_num_tokens");
  hot.Expect(req->eos_token_id, "eos_token_id");
  hot.Expect(req->id_view, "id_view");
  // The sequence count (forked()): first in absl::InlinedVector's layout.
  hot.ExpectBytes(&req->seqs, sizeof(size_t), "seqs' size");
  // Sequence 0, stored inline (AppendSlots, the diff, the sampled token).
  hot.Expect(seq.id, "seqs[0].id");
  hot.Expect(seq.tokens, "seqs[0].tokens");
  hot.Expect(seq.num_slots, "seqs[0].num_slots");
  hot.Expect(seq.num_blocks_sent, "seqs[0].num_blocks_sent");
  hot.Expect(seq.last_token, "seqs[0].last_token");
  hot.Expect(seq.index, "seqs[0].index");
  hot.Expect(seq.status, "seqs[0].status");
  hot.Expect(seq.known_to_workers, "seqs[0].known_to_workers");
  hot.Expect(seq.resend_table, "seqs[0].resend_table");
}

}  // namespace
}  // namespace llm
