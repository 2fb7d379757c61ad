#include "protocol/batch_state.h"

#include <deque>
#include <string>
#include <vector>

#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "structured/tokenizer_info.h"

namespace llm {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

const BatchStateConfig kConfig{
    .num_gpu_blocks = 16, .num_cpu_blocks = 4, .block_size = 4, .vocab_size = 100};

// Builds a step by hand, as the scheduler would send it: Seq() adds a sequence to the request
// that the next New() or Cached() adds.
class StepBuilder {
 public:
  explicit StepBuilder(int64_t step_id) { step_.step_id = step_id; }
  StepBuilder(const StepBuilder&) = delete;

  StepBuilder& Seq(int index, bool new_to_workers, bool replace, std::vector<TokenId> tokens,
                   std::vector<BlockId> blocks) {
    ScheduledSequence s{
        .index = index, .new_to_workers = new_to_workers, .replace_block_table = replace};
    s.new_token_ids = {static_cast<uint32_t>(step_.token_ids.size()),
                       static_cast<uint32_t>(tokens.size())};
    step_.token_ids.insert(step_.token_ids.end(), tokens.begin(), tokens.end());
    s.block_ids = {static_cast<uint32_t>(step_.block_ids.size()),
                   static_cast<uint32_t>(blocks.size())};
    step_.block_ids.insert(step_.block_ids.end(), blocks.begin(), blocks.end());
    step_.seqs.push_back(s);
    ++pending_seqs_;
    return *this;
  }
  StepBuilder& New(int32_t slot, const std::string& id, std::vector<TokenId> prompt,
                   const SamplingParams& params, int computed, int scheduled, int samples) {
    ids_.push_back(id);
    prompts_.push_back(std::move(prompt));
    step_.new_requests.push_back({.slot = slot,
                                  .request_id = ids_.back(),
                                  .prompt_token_ids = prompts_.back(),
                                  .sampling_params = &params,
                                  .num_computed_tokens = computed,
                                  .num_scheduled_tokens = scheduled,
                                  .num_samples = samples,
                                  .seqs = TakeSeqs()});
    return *this;
  }
  StepBuilder& Cached(int32_t slot, const std::string& id, int computed, int scheduled, int samples,
                      bool resumed = false) {
    ids_.push_back(id);
    step_.cached_requests.push_back({.slot = slot,
                                     .request_id = ids_.back(),
                                     .resumed_from_preemption = resumed,
                                     .num_computed_tokens = computed,
                                     .num_scheduled_tokens = scheduled,
                                     .num_samples = samples,
                                     .seqs = TakeSeqs()});
    return *this;
  }
  StepBuilder& Finished(int32_t slot, const std::string& id) {
    step_.finished_slots.push_back(slot);
    step_.finished_request_ids.push_back(id);
    return *this;
  }
  SchedulerOutput& step() { return step_; }

 private:
  IndexRange TakeSeqs() {
    const IndexRange r{static_cast<uint32_t>(step_.seqs.size()) - pending_seqs_, pending_seqs_};
    pending_seqs_ = 0;
    return r;
  }

  SchedulerOutput step_;
  uint32_t pending_seqs_ = 0;
  std::deque<std::string> ids_;  // deques: the step's views need stable addresses
  std::deque<std::vector<TokenId>> prompts_;
};

SamplingParams WithN(int n) {
  SamplingParams p;
  p.n = n;
  p.temperature = n > 1 ? 1.0 : 0.0;
  return p;
}

const SamplingParams kOne = WithN(1);
const SamplingParams kTwo = WithN(2);
const SamplingParams kThree = WithN(3);

// Step 1: request "a" (slot 0) prefills 4 of its 6 prompt tokens in blocks 3 and 5; request
// "b" (slot 1, n = 3) prefills its 3 tokens in block 7 and samples 3 tokens from its one row,
// 50, 51 and 52, which the worker appends: sequences 1 and 2 fork from sequence 0.
absl::Status ApplyStep1(BatchState* batch) {
  StepBuilder b(1);
  b.Seq(0, true, true, {}, {3, 5}).New(0, "a", {1, 2, 3, 4, 5, 6}, kOne, 0, 4, 0);
  b.Seq(0, true, true, {}, {7}).New(1, "b", {7, 8, 9}, kThree, 0, 3, 3);
  if (absl::Status s = batch->Apply(b.step()); !s.ok()) return s;
  batch->AppendSampled(std::vector<TokenId>{50, 51, 52});
  return absl::OkStatus();
}

// Step 2: "a" computes its last 2 prompt tokens and samples; "b"'s three sequences go on with
// the tokens the worker appended, no token ids sent: sequence 0 in block 7, sequences 1 and 2
// each in a block of its own (copy-on-write replaced their shared last block).
void BuildStep2(StepBuilder& b) {
  b.Seq(0, false, false, {}, {}).Cached(0, "a", 4, 2, 1);
  b.Seq(0, false, false, {}, {})
      .Seq(1, false, true, {}, {8})
      .Seq(2, false, true, {}, {9})
      .Cached(1, "b", 3, 1, 3);
}

TEST(BatchState, LaysOutAPrefillChunkAndAForkingFirstSample) {
  BatchState batch(kConfig);
  ASSERT_TRUE(ApplyStep1(&batch).ok());
  const BatchInputs& in = batch.inputs();
  EXPECT_THAT(in.token_ids, ElementsAre(1, 2, 3, 4, 7, 8, 9));
  EXPECT_THAT(in.positions, ElementsAre(0, 1, 2, 3, 0, 1, 2));
  EXPECT_THAT(in.slot_mapping, ElementsAre(12, 13, 14, 15, 28, 29, 30));
  EXPECT_EQ(in.max_blocks, 2);
  EXPECT_THAT(in.block_tables, ElementsAre(3, 5, 7, 0));
  EXPECT_THAT(in.seq_lens, ElementsAre(4, 3));
  EXPECT_THAT(in.query_start_loc, ElementsAre(0, 4, 7));
  EXPECT_THAT(in.logits_indices, ElementsAre(6));  // "a" is mid-prompt: no row
  ASSERT_EQ(in.samples.size(), 3u);                // n = 3 tokens from "b"'s one row
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(in.samples[j].batch_seq, 1);
    EXPECT_EQ(in.samples[j].logits_row, 0);
    EXPECT_EQ(in.samples[j].seq_index, j);
  }
  EXPECT_EQ(batch.FindRequest(0)->num_computed_tokens, 4);
  EXPECT_EQ(batch.FindRequest(1)->num_computed_tokens, 3);
}

// The worker keeps its own tokens: each sampled token goes to its sequence, and a forking first
// sample makes sequences 1 .. n-1 from the prompt, their token and the parent's block table.
TEST(BatchState, AppendsTheTokensItSampledAndForksAtTheFirstSample) {
  BatchState batch(kConfig);
  ASSERT_TRUE(ApplyStep1(&batch).ok());
  const BatchState::Request& b = *batch.FindRequest(1);
  for (int j = 0; j < 3; ++j) {
    EXPECT_TRUE(b.seqs[j].live) << j;
    EXPECT_THAT(b.seqs[j].token_ids, ElementsAre(7, 8, 9, 50 + j)) << j;
    EXPECT_THAT(b.seqs[j].block_table, ElementsAre(7)) << j;
  }
  EXPECT_THAT(batch.FindRequest(0)->seqs[0].token_ids, ElementsAre(1, 2, 3, 4, 5, 6));
  StepBuilder step2(2);
  BuildStep2(step2);
  ASSERT_TRUE(batch.Apply(step2.step()).ok());
  batch.AppendSampled(std::vector<TokenId>{70, 60, 61, 62});
  EXPECT_THAT(batch.FindRequest(0)->seqs[0].token_ids, ElementsAre(1, 2, 3, 4, 5, 6, 70));
  EXPECT_THAT(b.seqs[2].token_ids, ElementsAre(7, 8, 9, 52, 62));
  EXPECT_THAT(b.seqs[2].block_table, ElementsAre(9));
  // Step 3 computes the appended tokens.
  StepBuilder step3(3);
  step3.Seq(0, false, false, {}, {}).Cached(0, "a", 6, 1, 1);
  ASSERT_TRUE(batch.Apply(step3.step()).ok());
  EXPECT_THAT(batch.inputs().token_ids, ElementsAre(70));
  EXPECT_THAT(batch.inputs().positions, ElementsAre(6));
}

TEST(BatchState, LaysOutDecodesOfForkedSequences) {
  BatchState batch(kConfig);
  ASSERT_TRUE(ApplyStep1(&batch).ok());
  StepBuilder b(2);
  BuildStep2(b);
  ASSERT_TRUE(batch.Apply(b.step()).ok());
  const BatchInputs& in = batch.inputs();
  EXPECT_THAT(in.token_ids, ElementsAre(5, 6, 50, 51, 52));
  EXPECT_THAT(in.positions, ElementsAre(4, 5, 3, 3, 3));
  EXPECT_THAT(in.slot_mapping, ElementsAre(20, 21, 31, 35, 39));
  EXPECT_THAT(in.block_tables, ElementsAre(3, 5, 7, 0, 8, 0, 9, 0));
  EXPECT_THAT(in.seq_lens, ElementsAre(6, 4, 4, 4));
  EXPECT_THAT(in.query_start_loc, ElementsAre(0, 2, 3, 4, 5));
  EXPECT_THAT(in.logits_indices, ElementsAre(1, 2, 3, 4));
  ASSERT_EQ(in.samples.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(in.samples[i].batch_seq, i);
    EXPECT_EQ(in.samples[i].logits_row, i);
    EXPECT_EQ(in.samples[i].seq_index, i == 0 ? 0 : i - 1);
  }
  EXPECT_THAT(in.seqs[3].slot, 1);
  EXPECT_THAT(in.seqs[3].index, 2);
  const BatchState::Request& req = *batch.FindRequest(1);
  EXPECT_THAT(req.seqs[1].token_ids, ElementsAre(7, 8, 9, 51));
  EXPECT_THAT(req.seqs[1].block_table, ElementsAre(8));
}

// Every refused step names what is wrong and leaves the state as it was: the good step after
// them applies as if they never came.
TEST(BatchState, RefusesAStepItCannotApplyAndChangesNothing) {
  BatchState batch(kConfig);
  ASSERT_TRUE(ApplyStep1(&batch).ok());
  struct Case {
    const char* what;
    std::function<void(StepBuilder&)> build;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"count mismatch",
       [](StepBuilder& b) { b.Seq(0, false, false, {}, {}).Cached(0, "a", 3, 3, 1); },
       "3 tokens computed per the step; 4 per this worker"},
      {"another id", [](StepBuilder& b) { b.Seq(0, false, false, {}, {}).Cached(0, "z", 4, 2, 1); },
       "request \"z\" (slot 0) is unknown to this worker"},
      {"finished in the same step",
       [](StepBuilder& b) {
         b.Finished(0, "a").Seq(0, false, false, {}, {}).Cached(0, "a", 4, 2, 1);
       },
       "is unknown to this worker"},
      {"new again",
       [](StepBuilder& b) {
         b.Seq(0, true, true, {}, {3, 5}).New(0, "a", {1}, kOne, 0, 1, 0);
       },
       "is already known"},
      {"tokens sent for a known sequence",
       [](StepBuilder& b) { b.Seq(0, false, false, {50}, {}).Cached(1, "b", 3, 1, 1); },
       "sequence 0 is known, yet 1 token(s) come with it"},
      {"known sequence listed as new",
       [](StepBuilder& b) { b.Seq(0, true, true, {50}, {7}).Cached(1, "b", 3, 1, 1); },
       "sequence 0 is known and listed as new"},
      {"sequence past n",
       [](StepBuilder& b) { b.Seq(1, true, true, {}, {4}).Cached(0, "a", 4, 2, 1); },
       "sequence 1 is out of order or outside [0, n = 1)"},
      {"different lengths",
       [](StepBuilder& b) {
         b.Seq(0, true, true, {}, {10}).Seq(1, true, true, {5}, {11});
         b.New(2, "c", {1, 2, 3}, kTwo, 0, 3, 2);
       },
       "live sequences of different lengths (3 and 4)"},
      {"sample mid-prompt",
       [](StepBuilder& b) { b.Seq(0, false, false, {}, {}).Cached(0, "a", 4, 1, 1); },
       "samples with 5 of 6 tokens computed"},
      {"past the blocks",
       [](StepBuilder& b) { b.Seq(0, false, true, {}, {3}).Cached(0, "a", 4, 2, 1); },
       "computing up to token 6 with 6 tokens in 1 blocks of 4"},
      {"past the tokens",
       [](StepBuilder& b) { b.Seq(0, false, false, {}, {}).Cached(0, "a", 4, 3, 0); },
       "computing up to token 7 with 6 tokens"},
      {"token outside the vocabulary",
       [](StepBuilder& b) { b.Seq(0, false, false, {100}, {}).Cached(0, "a", 4, 2, 1); },
       "token id 100 outside the vocabulary [0, 100)"},
      {"copy out of range",
       [](StepBuilder& b) {
         b.Seq(0, false, false, {}, {}).Cached(0, "a", 4, 2, 1);
         b.step().blocks_to_copy = {{.src = 5, .dst = 16}};
       },
       "copy pair (5, 16) is out of range (16, 16 blocks)"},
      {"swap-out out of range",
       [](StepBuilder& b) {
         b.Finished(1, "b").step().blocks_to_swap_out = {{7, 4}};
       },
       "swap-out pair (7, 4) is out of range (16, 4 blocks)"},
  };
  const std::vector<int32_t> before(batch.inputs().token_ids);
  for (const Case& c : cases) {
    StepBuilder b(2);
    c.build(b);
    const absl::Status s = batch.Apply(b.step());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.what;
    EXPECT_EQ(batch.num_requests(), 2) << c.what;
    EXPECT_EQ(batch.FindRequest(0)->num_computed_tokens, 4) << c.what;
    EXPECT_EQ(batch.inputs().token_ids, before) << c.what;
  }
  StepBuilder good(2);
  BuildStep2(good);
  ASSERT_TRUE(batch.Apply(good.step()).ok());
  EXPECT_THAT(batch.inputs().token_ids, ElementsAre(5, 6, 50, 51, 52));
}

TEST(BatchState, ASequenceNotListedHasFinished) {
  BatchState batch(kConfig);
  ASSERT_TRUE(ApplyStep1(&batch).ok());
  StepBuilder fork(2);
  BuildStep2(fork);
  ASSERT_TRUE(batch.Apply(fork.step()).ok());
  batch.AppendSampled(std::vector<TokenId>{70, 60, 61, 62});
  StepBuilder b(3);  // sequence 1 stopped: only 0 and 2 go on
  b.Seq(0, false, false, {}, {10}).Seq(2, false, false, {}, {11}).Cached(1, "b", 4, 1, 2);
  ASSERT_TRUE(batch.Apply(b.step()).ok());
  const BatchState::Request& req = *batch.FindRequest(1);
  EXPECT_TRUE(req.seqs[0].live);
  EXPECT_FALSE(req.seqs[1].live);
  EXPECT_TRUE(req.seqs[1].token_ids.empty());
  EXPECT_THAT(req.seqs[2].token_ids, ElementsAre(7, 8, 9, 52, 62));
  EXPECT_THAT(batch.inputs().token_ids, ElementsAre(60, 62));
  EXPECT_EQ(batch.inputs().samples[1].seq_index, 2);
  batch.AppendSampled(std::vector<TokenId>{80, 82});

  StepBuilder again(4);
  again.Seq(0, false, false, {}, {}).Seq(1, false, false, {}, {}).Cached(1, "b", 5, 1, 2);
  EXPECT_THAT(std::string(batch.Apply(again.step()).message()),
              HasSubstr("sequence 1 is unknown and not listed as new"));
}

// A request resumed after preemption by recompute gets its count and whole table anew; a slot
// finished in a step can take a new request in that same step.
TEST(BatchState, ResumesAfterPreemptionAndReusesAFinishedSlot) {
  BatchState batch(kConfig);
  ASSERT_TRUE(ApplyStep1(&batch).ok());
  StepBuilder b(2);
  b.Seq(0, false, true, {}, {10, 11}).Cached(0, "a", 0, 6, 1, /*resumed=*/true);
  b.Finished(1, "b").Seq(0, true, true, {}, {2}).New(1, "c", {40, 41}, kOne, 0, 2, 1);
  ASSERT_TRUE(batch.Apply(b.step()).ok());
  const BatchInputs& in = batch.inputs();
  EXPECT_THAT(in.token_ids, ElementsAre(40, 41, 1, 2, 3, 4, 5, 6));  // new requests first
  EXPECT_THAT(in.slot_mapping, ElementsAre(8, 9, 40, 41, 42, 43, 44, 45));
  EXPECT_EQ(batch.FindRequest(0)->num_computed_tokens, 6);
  EXPECT_EQ(batch.FindRequest(1)->request_id, "c");
  EXPECT_EQ(batch.num_requests(), 2);
}

// The arrays a GPU worker uploads stay where they are from step to step: a step no larger than
// an earlier one allocates none of them.
TEST(BatchState, TheBatchArraysKeepTheirStorageFromStepToStep) {
  BatchState batch(kConfig);
  ASSERT_TRUE(ApplyStep1(&batch).ok());
  const BatchInputs& in = batch.inputs();
  const void* tokens = in.token_ids.data();
  const void* slots = in.slot_mapping.data();
  const void* tables = in.block_tables.data();
  const void* qsl = in.query_start_loc.data();
  StepBuilder b(2);
  BuildStep2(b);  // 5 tokens, 4 sequences, 8 table entries: tables grow
  ASSERT_TRUE(batch.Apply(b.step()).ok());
  batch.AppendSampled(std::vector<TokenId>{61, 60, 61, 62});
  EXPECT_EQ(in.token_ids.data(), tokens);
  EXPECT_EQ(in.slot_mapping.data(), slots);
  tables = in.block_tables.data();
  qsl = in.query_start_loc.data();
  StepBuilder c(3);
  c.Seq(0, false, false, {}, {}).Cached(0, "a", 6, 1, 1);
  c.Seq(0, false, false, {}, {10}).Seq(1, false, false, {}, {11});
  c.Seq(2, false, false, {}, {12});
  c.Cached(1, "b", 4, 1, 3);
  ASSERT_TRUE(batch.Apply(c.step()).ok());
  EXPECT_THAT(in.token_ids, ElementsAre(61, 60, 61, 62));
  EXPECT_EQ(in.token_ids.data(), tokens);
  EXPECT_EQ(in.slot_mapping.data(), slots);
  EXPECT_EQ(in.block_tables.data(), tables);
  EXPECT_EQ(in.query_start_loc.data(), qsl);
}

SamplingParams Penalized(int n, double repetition, double frequency) {
  SamplingParams p = WithN(n);
  p.seed = 9;
  p.repetition_penalty = repetition;
  p.frequency_penalty = frequency;
  return p;
}

// The sampling state of each sequence: made with the request, advanced by every token appended
// (a fork's children from their own first token), output counts kept only under a penalty, and
// the prompt's distinct tokens only under the repetition penalty.
TEST(BatchState, KeepsEachSequencesSamplingState) {
  const SamplingParams plain = kThree;
  const SamplingParams frequency = Penalized(3, 1.0, 0.5);
  const SamplingParams repetition = Penalized(1, 1.2, 0.0);
  BatchState batch(kConfig);
  StepBuilder b(1);
  b.Seq(0, true, true, {}, {1}).New(0, "plain", {7, 8, 9}, plain, 0, 3, 3);
  b.Seq(0, true, true, {}, {2}).New(1, "freq", {7, 8, 9}, frequency, 0, 3, 3);
  b.Seq(0, true, true, {}, {3}).New(2, "rep", {9, 4, 9, 1}, repetition, 0, 4, 1);
  ASSERT_TRUE(batch.Apply(b.step()).ok());
  batch.AppendSampled(std::vector<TokenId>{50, 51, 50, 60, 60, 61, 70});

  const BatchState::Request& p = *batch.FindRequest(0);
  const BatchState::Request& f = *batch.FindRequest(1);
  const BatchState::Request& r = *batch.FindRequest(2);
  EXPECT_TRUE(p.prompt_token_set.empty());
  EXPECT_TRUE(f.prompt_token_set.empty());
  EXPECT_THAT(r.prompt_token_set, ElementsAre(1, 4, 9));
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(p.seqs[j].sampling.num_samples, 1u) << j;
    EXPECT_TRUE(p.seqs[j].sampling.output_counts.empty()) << j;
    EXPECT_EQ(f.seqs[j].sampling.num_samples, 1u) << j;
    EXPECT_EQ(f.seqs[j].sampling.output_counts.size(), 1u) << j;
  }
  EXPECT_EQ(f.seqs[1].sampling.output_counts.at(60), 1);
  EXPECT_EQ(r.seqs[0].sampling.output_counts.at(70), 1);

  StepBuilder d(2);
  d.Seq(0, false, false, {}, {}).Seq(1, false, false, {}, {}).Seq(2, false, false, {}, {});
  d.Cached(1, "freq", 3, 1, 3);
  ASSERT_TRUE(batch.Apply(d.step()).ok());
  batch.AppendSampled(std::vector<TokenId>{60, 60, 62});
  EXPECT_EQ(f.seqs[0].sampling.num_samples, 2u);
  EXPECT_EQ(f.seqs[1].sampling.output_counts.at(60), 2);
  EXPECT_EQ(f.seqs[2].sampling.output_counts.size(), 2u);
  EXPECT_EQ(p.seqs[0].sampling.num_samples, 1u);  // not in the step
}

// A sequence that comes to the workers with its output (its request resumed on workers that
// never held it) continues from that output: its counter and counts are those of the workers
// that sampled it.
TEST(BatchState, ASequenceResumedWithItsOutputContinuesItsState) {
  const SamplingParams frequency = Penalized(2, 1.0, 0.5);
  BatchState batch(kConfig);
  StepBuilder b(1);
  b.Seq(0, true, true, {50, 51, 50}, {1, 2}).Seq(1, true, true, {52, 53, 53}, {3, 4});
  b.New(0, "r", {7, 8}, frequency, 0, 5, 2);
  ASSERT_TRUE(batch.Apply(b.step()).ok());
  const BatchState::Request& r = *batch.FindRequest(0);
  EXPECT_EQ(r.seqs[0].sampling.num_samples, 3u);
  EXPECT_EQ(r.seqs[0].sampling.output_counts.at(50), 2);
  EXPECT_EQ(r.seqs[1].sampling.output_counts.at(53), 2);
  batch.AppendSampled(std::vector<TokenId>{50, 54});
  EXPECT_EQ(r.seqs[0].sampling.num_samples, 4u);
  EXPECT_EQ(r.seqs[0].sampling.output_counts.at(50), 3);
  EXPECT_EQ(r.seqs[1].sampling.output_counts.at(54), 1);

  BatchState plain(kConfig);
  StepBuilder c(1);
  c.Seq(0, true, true, {50, 51, 50}, {1, 2}).New(0, "r", {7, 8}, kOne, 0, 5, 1);
  ASSERT_TRUE(plain.Apply(c.step()).ok());
  EXPECT_EQ(plain.FindRequest(0)->seqs[0].sampling.num_samples, 3u);
  EXPECT_TRUE(plain.FindRequest(0)->seqs[0].sampling.output_counts.empty());
}

// A request's seed is its params' or, without one, drawn at random: two unseeded requests draw
// from different streams.
TEST(BatchState, UnseededRequestsGetSeedsOfTheirOwn) {
  SamplingParams seeded = kOne;
  seeded.seed = 1234;
  const SamplingParams unseeded = kOne;
  BatchState batch(kConfig);
  StepBuilder b(1);
  b.Seq(0, true, true, {}, {1}).New(0, "a", {7}, unseeded, 0, 1, 1);
  b.Seq(0, true, true, {}, {2}).New(1, "b", {7}, unseeded, 0, 1, 1);
  b.Seq(0, true, true, {}, {3}).New(2, "c", {7}, seeded, 0, 1, 1);
  ASSERT_TRUE(batch.Apply(b.step()).ok());
  EXPECT_NE(batch.FindRequest(0)->seed, batch.FindRequest(1)->seed);
  EXPECT_EQ(batch.FindRequest(2)->seed, 1234u);
}

// The device slots of the sequences a step drops (a finished request, a finished sequence) are
// listed for their holder to release, once; a refused step and sequences without one list none.
TEST(BatchState, ListsTheDeviceSlotsOfTheSequencesItDrops) {
  BatchState batch(kConfig);
  ASSERT_TRUE(ApplyStep1(&batch).ok());
  batch.MutableSamplingState(0, 0)->device_slot = {.slot = 4, .lease = 40};
  for (int j = 0; j < 3; ++j) {
    batch.MutableSamplingState(1, j)->device_slot = {.slot = j, .lease = uint64_t(10 + j)};
  }
  StepBuilder bad(2);
  bad.Finished(0, "a").Seq(0, false, false, {}, {}).Cached(1, "b", 2, 1, 1);
  ASSERT_FALSE(batch.Apply(bad.step()).ok());
  EXPECT_TRUE(batch.released_device_slots().empty());

  StepBuilder b(2);  // "a" finishes; "b"'s sequence 1 stopped
  b.Finished(0, "a").Seq(0, false, false, {}, {}).Seq(2, false, true, {}, {9});
  b.Cached(1, "b", 3, 1, 2);
  ASSERT_TRUE(batch.Apply(b.step()).ok());
  std::vector<int> slots;
  for (const DeviceSlot& d : batch.released_device_slots()) slots.push_back(d.slot);
  EXPECT_THAT(slots, ::testing::UnorderedElementsAre(4, 1));
  EXPECT_EQ(batch.FindRequest(1)->seqs[1].sampling.device_slot.slot, -1);

  batch.AppendSampled(std::vector<TokenId>{60, 62});
  StepBuilder c(3);
  c.Seq(0, false, false, {}, {10}).Seq(2, false, false, {}, {11}).Cached(1, "b", 4, 1, 2);
  ASSERT_TRUE(batch.Apply(c.step()).ok());
  EXPECT_TRUE(batch.released_device_slots().empty());
  batch.Clear();
  slots.clear();
  for (const DeviceSlot& d : batch.released_device_slots()) slots.push_back(d.slot);
  EXPECT_THAT(slots, ::testing::UnorderedElementsAre(0, 2));
  EXPECT_EQ(batch.num_requests(), 0);
}

namespace grammar_test {

// A vocabulary of ids 0..4 spelling "a", "b", "c", "d" and a stop token (4), for masks one can
// read: bit i allows token i.
std::shared_ptr<structured::GrammarCache> Grammars() {
  auto vocab = structured::TokenizerInfo::Create({"a", "b", "c", "d", ""}, 100, {4}, {});
  CHECK(vocab.ok());
  return std::make_shared<structured::GrammarCache>(*vocab);
}

SamplingParams Choice(int n) {
  SamplingParams p = WithN(n);
  p.structured.kind = StructuredOutputParams::Kind::kChoice;
  p.structured.choices = {"ab", "cd"};
  return p;
}

// The tokens the sequence's grammar allows next, as a bit set of ids 0..4.
uint32_t Allowed(BatchState& batch, int32_t slot, int seq) {
  SamplingState* state = batch.MutableSamplingState(slot, seq);
  if (state->grammar == nullptr) return ~0u;
  std::vector<uint32_t> mask(state->grammar->grammar().tokenizer().bitmask_words());
  state->grammar->FillNextTokenBitmask(mask.data());
  return mask[0];
}

}  // namespace grammar_test

// A request's structured output gives each of its sequences a matcher that every recorded token
// advances: the sampled ones, the n a fork draws (each sequence from the start), and the tokens a
// sequence resumed on a worker that never held it brings.
TEST(BatchStateTest, StructuredOutputMatchersFollowEachSequencesTokens) {
  using grammar_test::Allowed;
  BatchStateConfig config = kConfig;
  config.grammars = grammar_test::Grammars();
  BatchState batch(config);
  const SamplingParams one = grammar_test::Choice(1);
  const SamplingParams two = grammar_test::Choice(2);
  StepBuilder b1(1);
  b1.Seq(0, true, true, {}, {3}).New(0, "one", {7, 8}, one, 0, 2, 1);
  b1.Seq(0, true, true, {}, {5}).New(1, "two", {7, 8}, two, 0, 2, 2);
  ASSERT_TRUE(batch.Apply(b1.step()).ok());
  EXPECT_EQ(Allowed(batch, 0, 0), 0b0101u);            // "a" or "c"
  EXPECT_EQ(Allowed(batch, 1, 1), 0b0101u);            // the sequence a fork makes starts there too
  batch.AppendSampled(std::vector<TokenId>{0, 0, 2});  // "a"; the fork: "a" and "c"
  EXPECT_EQ(Allowed(batch, 0, 0), 0b0010u);            // "b"
  EXPECT_EQ(Allowed(batch, 1, 0), 0b0010u);
  EXPECT_EQ(Allowed(batch, 1, 1), 0b1000u);  // "d"

  StepBuilder b2(2);
  b2.Seq(0, false, false, {}, {}).Cached(0, "one", 2, 1, 1);
  b2.Seq(0, false, false, {}, {}).Seq(1, false, true, {}, {6}).Cached(1, "two", 2, 1, 2);
  ASSERT_TRUE(batch.Apply(b2.step()).ok());
  batch.AppendSampled(std::vector<TokenId>{1, 1, 3});
  EXPECT_EQ(Allowed(batch, 0, 0), 0b10000u);  // complete: only the stop token
  EXPECT_EQ(Allowed(batch, 1, 1), 0b10000u);
  EXPECT_TRUE(batch.MutableSamplingState(0, 0)->constrained());
  StepBuilder b3(3);
  b3.Seq(0, false, false, {}, {}).Cached(0, "one", 3, 1, 1);
  b3.Seq(0, false, false, {}, {}).Seq(1, false, false, {}, {}).Cached(1, "two", 3, 1, 2);
  ASSERT_TRUE(batch.Apply(b3.step()).ok());
  batch.AppendSampled(std::vector<TokenId>{4, 4, 4});
  EXPECT_FALSE(batch.MutableSamplingState(0, 0)->constrained());  // ended: sampled freely

  // A worker that never held "one" gets it resumed with its output so far ("a"): its matcher
  // replays it.
  BatchState fresh(config);
  StepBuilder b4(4);
  b4.Seq(0, true, true, {0}, {3}).New(0, "one", {7, 8}, one, 0, 3, 1);
  ASSERT_TRUE(fresh.Apply(b4.step()).ok());
  EXPECT_EQ(Allowed(fresh, 0, 0), 0b0010u);
}

TEST(BatchStateTest, StructuredOutputIsRefusedWithoutGrammarsOrWhenItDoesNotCompile) {
  BatchState without(kConfig);
  const SamplingParams choice = grammar_test::Choice(1);
  StepBuilder b1(1);
  b1.Seq(0, true, true, {}, {3}).New(0, "x", {7, 8}, choice, 0, 2, 1);
  absl::Status s = without.Apply(b1.step());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("request x has a structured output"));
  EXPECT_EQ(without.num_requests(), 0);

  BatchStateConfig config = kConfig;
  config.grammars = grammar_test::Grammars();
  BatchState batch(config);
  SamplingParams bad = WithN(1);
  bad.structured.kind = StructuredOutputParams::Kind::kRegex;
  bad.structured.text = "(ab";
  StepBuilder b2(1);
  b2.Seq(0, true, true, {}, {3}).New(0, "y", {7, 8}, bad, 0, 2, 1);
  s = batch.Apply(b2.step());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("request y: structured output: "));
  EXPECT_EQ(batch.num_requests(), 0);
}

}  // namespace
}  // namespace llm
