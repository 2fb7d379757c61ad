#include "protocol/step_codec.h"

#include <map>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protocol/batch_state.h"
#include "scheduler_service/engine/engine_core.h"
#include "tests/testing/fake_executor.h"

namespace llm {
namespace {

using ::testing::HasSubstr;

// An Executor that sends each step through the wire form (encode, serialize, parse, decode)
// before the fake worker sees it, and the answer back the same way. The fake worker checks
// every token's KV, so a field the codec drops or garbles changes or fails the streams.
class WireExecutor : public Executor {
 public:
  explicit WireExecutor(Executor* worker) : worker_(worker) {}

  absl::Status Execute(const SchedulerOutput& step, ModelOutput* out) override {
    v1::StepRequest request;
    EncodeStepRequest(step, &request);
    v1::StepRequest received;
    if (!received.ParseFromString(request.SerializeAsString())) {
      return absl::InternalError("StepRequest does not parse");
    }
    DecodedStep decoded;
    if (absl::Status s = DecodeStepRequest(received, SamplingLimits{}, &decoded); !s.ok()) {
      return s;
    }
    ExpectSameStep(step, decoded.output);
    ++steps_;
    ModelOutput worker_out;
    if (absl::Status s = worker_->Execute(decoded.output, &worker_out); !s.ok()) return s;
    v1::StepResult result;
    EncodeStepResult(worker_out, &result);
    v1::StepResult result_received;
    if (!result_received.ParseFromString(result.SerializeAsString())) {
      return absl::InternalError("StepResult does not parse");
    }
    return DecodeStepResult(result_received, out);
  }

  int steps() const { return steps_; }

 private:
  static void ExpectSameRequests(const SchedulerOutput& a, const std::vector<ScheduledRequest>& ra,
                                 const SchedulerOutput& b,
                                 const std::vector<ScheduledRequest>& rb) {
    ASSERT_EQ(ra.size(), rb.size());
    for (size_t i = 0; i < ra.size(); ++i) {
      const ScheduledRequest& x = ra[i];
      const ScheduledRequest& y = rb[i];
      EXPECT_EQ(x.slot, y.slot);
      EXPECT_EQ(x.request_id, y.request_id);
      EXPECT_THAT(std::vector<TokenId>(y.prompt_token_ids.begin(), y.prompt_token_ids.end()),
                  ::testing::ElementsAreArray(x.prompt_token_ids));
      EXPECT_EQ(x.sampling_params == nullptr, y.sampling_params == nullptr);
      if (x.sampling_params != nullptr && y.sampling_params != nullptr) {
        EXPECT_EQ(x.sampling_params->n, y.sampling_params->n);
        EXPECT_EQ(x.sampling_params->seed, y.sampling_params->seed);
        EXPECT_EQ(x.sampling_params->max_tokens, y.sampling_params->max_tokens);
      }
      EXPECT_EQ(x.resumed_from_preemption, y.resumed_from_preemption);
      EXPECT_EQ(x.num_computed_tokens, y.num_computed_tokens);
      EXPECT_EQ(x.num_scheduled_tokens, y.num_scheduled_tokens);
      EXPECT_EQ(x.num_samples, y.num_samples);
      const auto sx = a.Seqs(x);
      const auto sy = b.Seqs(y);
      ASSERT_EQ(sx.size(), sy.size());
      for (size_t j = 0; j < sx.size(); ++j) {
        EXPECT_EQ(sx[j].index, sy[j].index);
        EXPECT_EQ(sx[j].new_to_workers, sy[j].new_to_workers);
        EXPECT_EQ(sx[j].replace_block_table, sy[j].replace_block_table);
        EXPECT_THAT(std::vector<TokenId>(b.NewTokenIds(sy[j]).begin(), b.NewTokenIds(sy[j]).end()),
                    ::testing::ElementsAreArray(a.NewTokenIds(sx[j])));
        EXPECT_THAT(std::vector<BlockId>(b.BlockIds(sy[j]).begin(), b.BlockIds(sy[j]).end()),
                    ::testing::ElementsAreArray(a.BlockIds(sx[j])));
      }
    }
  }

  static void ExpectSameStep(const SchedulerOutput& a, const SchedulerOutput& b) {
    EXPECT_EQ(a.step_id, b.step_id);
    ExpectSameRequests(a, a.new_requests, b, b.new_requests);
    ExpectSameRequests(a, a.cached_requests, b, b.cached_requests);
    EXPECT_EQ(a.finished_request_ids, b.finished_request_ids);
    EXPECT_EQ(a.finished_slots, b.finished_slots);
    EXPECT_EQ(a.blocks_to_swap_in, b.blocks_to_swap_in);
    EXPECT_EQ(a.blocks_to_swap_out, b.blocks_to_swap_out);
    EXPECT_EQ(a.blocks_to_copy, b.blocks_to_copy);
    EXPECT_EQ(a.total_num_scheduled_tokens, b.total_num_scheduled_tokens);
    EXPECT_EQ(a.total_num_samples, b.total_num_samples);
  }

  Executor* worker_;
  int steps_ = 0;
};

struct RunResult {
  std::map<std::string, std::vector<TokenId>> tokens;  // "id/seq" -> tokens
  int64_t preemptions = 0;
  int64_t swap_outs = 0;
  int64_t copies = 0;
};

// A mixed workload (shared prefixes, n > 1, long prompts) on a pool small enough to preempt.
RunResult RunWorkload(PreemptionMode mode, bool through_wire) {
  const BlockSpaceManagerConfig cache{.block_size = 16,
                                      .num_gpu_blocks = 40,
                                      .num_cpu_blocks = 200,
                                      .watermark = 0,
                                      .enable_prefix_caching = true};
  SchedulerConfig config;
  config.max_model_len = 256;
  config.max_num_batched_tokens = 128;
  config.enable_chunked_prefill = true;
  config.long_prefill_token_threshold = 48;
  config.preemption_mode = mode;
  FakeExecutorConfig fc{.num_gpu_blocks = cache.num_gpu_blocks,
                        .num_cpu_blocks = cache.num_cpu_blocks,
                        .block_size = cache.block_size,
                        .vocab_size = 1000};
  FakeExecutor fake(fc);
  WireExecutor wire(&fake);
  EngineCore engine(config, cache, through_wire ? static_cast<Executor*>(&wire) : &fake);
  RunResult result;
  std::mt19937 rng(7);
  for (int i = 0; i < 24; ++i) {
    EngineRequest r;
    r.request_id = "r" + std::to_string(i);
    const int shared = i % 3 == 0 ? 40 : 0;
    for (int t = 0; t < shared; ++t) r.prompt_token_ids.push_back(t + 1);
    const int own = 5 + static_cast<int>(rng() % 60);
    for (int t = 0; t < own; ++t) r.prompt_token_ids.push_back(static_cast<TokenId>(rng() % 999));
    r.sampling_params.n = i % 5 == 0 ? 3 : 1;
    r.sampling_params.seed = i;
    r.sampling_params.max_tokens = 10 + static_cast<int>(rng() % 30);
    r.sampling_params.ignore_eos = true;
    const std::string id = r.request_id;
    EXPECT_TRUE(engine
                    .AddRequest(std::move(r),
                                [&result, id](const StreamUpdate& u) {
                                  ASSERT_TRUE(u.status.ok()) << u.status;
                                  for (const SequenceOutput& s : u.outputs->Seqs(*u.output)) {
                                    auto& out = result.tokens[id + "/" + std::to_string(s.index)];
                                    for (TokenId t : u.outputs->NewTokenIds(s)) out.push_back(t);
                                  }
                                })
                    .ok());
  }
  EXPECT_TRUE(engine.RunUntilIdle().ok());
  result.preemptions = engine.scheduler().stats().num_preemptions;
  result.swap_outs = engine.scheduler().stats().num_swap_outs;
  result.copies = fake.num_copies();
  if (through_wire) EXPECT_GT(wire.steps(), 0);
  return result;
}

TEST(StepCodec, StreamsThroughTheWireEqualInProcessUnderPreemptionCowAndPrefixHits) {
  for (PreemptionMode mode : {PreemptionMode::kRecompute, PreemptionMode::kSwap}) {
    const RunResult direct = RunWorkload(mode, /*through_wire=*/false);
    const RunResult wire = RunWorkload(mode, /*through_wire=*/true);
    // The workload must exercise what the codec carries: preemption, copy-on-write.
    EXPECT_GT(direct.preemptions, 0);
    EXPECT_GT(direct.copies, 0);
    if (mode == PreemptionMode::kSwap) EXPECT_GT(direct.swap_outs, 0);
    EXPECT_EQ(direct.tokens.size(), wire.tokens.size());
    EXPECT_EQ(direct.tokens, wire.tokens);
  }
}

TEST(StepCodec, SamplingParamsRoundTripAndDefaults) {
  SamplingParams p;
  p.n = 3;
  p.temperature = 0.5;
  p.top_p = 0.25;
  p.top_k = 7;
  p.min_p = 0.125;
  p.seed = 1ull << 40;
  p.max_tokens = 99;
  p.min_tokens = 4;
  p.stop = {"\n\n", "END"};
  p.stop_token_ids = {5, 6};
  p.include_stop_str_in_output = true;
  p.ignore_eos = true;
  p.skip_special_tokens = false;
  p.logprobs = 2;
  p.presence_penalty = -0.5;
  p.frequency_penalty = 1.5;
  p.repetition_penalty = 1.25;
  p.logit_bias = {{9, -100.0f}, {2, 0.5f}, {40, 7.25f}};
  v1::SamplingParams proto;
  SamplingParamsToProto(p, &proto);
  const SamplingParams q = SamplingParamsFromProto(proto);
  EXPECT_EQ(q.n, 3);
  EXPECT_EQ(q.temperature, 0.5);
  EXPECT_EQ(q.top_p, 0.25);
  EXPECT_EQ(q.top_k, 7);
  EXPECT_EQ(q.min_p, 0.125);
  EXPECT_EQ(q.seed, p.seed);
  EXPECT_EQ(q.max_tokens, 99);
  EXPECT_EQ(q.min_tokens, 4);
  EXPECT_EQ(q.stop, p.stop);
  EXPECT_EQ(q.stop_token_ids, p.stop_token_ids);
  EXPECT_TRUE(q.include_stop_str_in_output);
  EXPECT_TRUE(q.ignore_eos);
  EXPECT_FALSE(q.skip_special_tokens);
  EXPECT_EQ(q.logprobs, 2);
  EXPECT_EQ(q.presence_penalty, -0.5);
  EXPECT_EQ(q.frequency_penalty, 1.5);
  EXPECT_EQ(q.repetition_penalty, 1.25);
  // Sorted by token id, whatever order the proto map keeps.
  EXPECT_EQ(q.logit_bias,
            (std::vector<std::pair<TokenId, float>>{{2, 0.5f}, {9, -100.0f}, {40, 7.25f}}));

  // An empty message means the defaults a user of the API expects.
  const SamplingParams d = SamplingParamsFromProto(v1::SamplingParams());
  const SamplingParams want;
  EXPECT_EQ(d.n, want.n);
  EXPECT_EQ(d.temperature, want.temperature);
  EXPECT_EQ(d.top_p, want.top_p);
  EXPECT_EQ(d.top_k, want.top_k);
  EXPECT_EQ(d.max_tokens, want.max_tokens);
  EXPECT_FALSE(d.seed.has_value());
  EXPECT_FALSE(d.logprobs.has_value());
  EXPECT_EQ(d.repetition_penalty, 1.0);
  EXPECT_TRUE(d.skip_special_tokens);
  EXPECT_TRUE(d.logit_bias.empty());
}

// A valid one-request step to break in the tests below.
v1::StepRequest GoodStep() {
  v1::StepRequest step;
  step.set_step_id(3);
  v1::ScheduledRequest* r = step.add_new_requests();
  r->set_slot(0);
  r->set_request_id("a");
  r->add_prompt_token_ids(1);
  r->add_prompt_token_ids(2);
  r->mutable_sampling_params()->set_temperature(0);
  r->set_num_scheduled_tokens(2);
  r->set_num_samples(1);
  v1::ScheduledSequence* s = r->add_seqs();
  s->set_new_to_workers(true);
  s->set_replace_block_table(true);
  s->add_block_ids(4);
  return step;
}

// What a worker does with a message: decode it, then apply it to its batch state (an empty
// one with an 8-block cache, a 2-block swap space and a vocabulary of 100).
absl::Status DecodeAndApply(const v1::StepRequest& step) {
  DecodedStep out;
  if (absl::Status s = DecodeStepRequest(step, SamplingLimits{}, &out); !s.ok()) return s;
  BatchState batch({.num_gpu_blocks = 8, .num_cpu_blocks = 2, .block_size = 16, .vocab_size = 100});
  return batch.Apply(out.output);
}

// Each malformed message is refused, by the codec for what only the wire form can carry and by
// the BatchState for the rest, with a message naming the request and the field.
TEST(StepCodec, MalformedStepsAreRefusedNamingTheRequest) {
  ASSERT_TRUE(DecodeAndApply(GoodStep()).ok());
  struct Case {
    const char* what;
    std::function<void(v1::StepRequest&)> corrupt;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"no sequences", [](v1::StepRequest& s) { s.mutable_new_requests(0)->clear_seqs(); },
       "request \"a\" (slot 0) lists no sequences"},
      {"negative block",
       [](v1::StepRequest& s) { s.mutable_new_requests(0)->mutable_seqs(0)->set_block_ids(0, -2); },
       "block id -2 outside the cache [0, 8)"},
      {"block past the cache",
       [](v1::StepRequest& s) { s.mutable_new_requests(0)->mutable_seqs(0)->set_block_ids(0, 8); },
       "block id 8 outside the cache [0, 8)"},
      {"negative token",
       [](v1::StepRequest& s) { s.mutable_new_requests(0)->set_prompt_token_ids(1, -1); },
       "token id -1 outside the vocabulary [0, 100)"},
      {"no prompt", [](v1::StepRequest& s) { s.mutable_new_requests(0)->clear_prompt_token_ids(); },
       "comes without a prompt or sampling params"},
      {"no params", [](v1::StepRequest& s) { s.mutable_new_requests(0)->clear_sampling_params(); },
       "comes without a prompt or sampling params"},
      {"bad params",
       [](v1::StepRequest& s) {
         s.mutable_new_requests(0)->mutable_sampling_params()->set_top_p(2);
       },
       "sampling_params: top_p"},
      {"no id", [](v1::StepRequest& s) { s.mutable_new_requests(0)->clear_request_id(); },
       "has no request_id"},
      {"negative slot", [](v1::StepRequest& s) { s.mutable_new_requests(0)->set_slot(-1); },
       "negative slot"},
      {"sequences out of order",
       [](v1::StepRequest& s) {
         *s.mutable_new_requests(0)->add_seqs() = s.new_requests(0).seqs(0);
       },
       "sequence 0 is out of order"},
      {"slot twice",
       [](v1::StepRequest& s) {
         v1::ScheduledRequest copy = s.new_requests(0);
         copy.set_request_id("b");
         copy.clear_prompt_token_ids();
         copy.clear_sampling_params();
         *s.add_cached_requests() = copy;
       },
       "slot 0 is scheduled twice"},
      {"cached with prompt",
       [](v1::StepRequest& s) { *s.add_cached_requests() = s.new_requests(0); },
       "a cached request carries a prompt"},
      {"finished lists differ", [](v1::StepRequest& s) { s.add_finished_request_ids("x"); },
       "1 finished_request_ids but 0 finished_slots"},
      {"negative swap",
       [](v1::StepRequest& s) {
         v1::BlockPair* p = s.add_blocks_to_swap_in();
         p->set_src(-1);
       },
       "swap-in pair (-1, 0) is out of range"},
      {"huge count",
       [](v1::StepRequest& s) { s.mutable_new_requests(0)->set_num_scheduled_tokens(1u << 31); },
       "a token count is out of range"},
  };
  for (const Case& c : cases) {
    v1::StepRequest step = GoodStep();
    c.corrupt(step);
    const absl::Status s = DecodeAndApply(step);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.what;
  }
}

TEST(StepCodec, StepResultCarriesTokensAndErrors) {
  ModelOutput out{.step_id = 9, .sampled_token_ids = {4, 5, 6}};
  out.logprobs = {{-0.5f, {{4, -0.5f}, {8, -1.5f}}}, {}, {-2.25f, {}}};
  v1::StepResult result;
  EncodeStepResult(out, &result);
  ModelOutput back;
  ASSERT_TRUE(DecodeStepResult(result, &back).ok());
  EXPECT_EQ(back.step_id, 9);
  EXPECT_EQ(back.sampled_token_ids, out.sampled_token_ids);
  ASSERT_EQ(back.logprobs.size(), 3u);
  EXPECT_EQ(back.logprobs[0].logprob, -0.5f);
  EXPECT_EQ(back.logprobs[0].top, out.logprobs[0].top);
  EXPECT_TRUE(back.logprobs[1].top.empty());
  EXPECT_EQ(back.logprobs[2].logprob, -2.25f);

  v1::StepResult short_logprobs = result;
  short_logprobs.mutable_logprobs()->RemoveLast();
  EXPECT_THAT(std::string(DecodeStepResult(short_logprobs, &back).message()),
              HasSubstr("2 logprobs for 3 tokens"));

  result.set_error_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
  result.set_error_message("request \"a\": block id 99 is past the cache");
  const absl::Status s = DecodeStepResult(result, &back);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "request \"a\": block id 99 is past the cache");

  result.set_error_code(0);
  result.set_sampled_token_ids(1, -4);
  EXPECT_THAT(std::string(DecodeStepResult(result, &back).message()),
              HasSubstr("sampled token id -4 is negative"));
}

}  // namespace
}  // namespace llm
