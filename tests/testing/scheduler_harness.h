// Drives a Scheduler against a FakeExecutor step by step for tests: records every stream (its
// text and stop strings made by a RequestText per request, as the engine's output thread does,
// and the sequences stop strings end stopped in the scheduler before the next step), checks
// the scheduler's invariants after each step, and computes the stream a request must produce
// straight from the FakeExecutor's token function (no scheduler, no KV).
#ifndef LLM_TESTS_TESTING_SCHEDULER_HARNESS_H_
#define LLM_TESTS_TESTING_SCHEDULER_HARNESS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler_service/core/request_text.h"
#include "scheduler_service/core/scheduler.h"
#include "tests/testing/fake_executor.h"

namespace llm {

struct Stream {
  std::vector<std::vector<TokenId>> tokens;  // per sequence index
  std::vector<SequenceStatus> status;        // per sequence index
  std::vector<std::string> text;             // per sequence index (with a DetokenizerFactory)
  std::vector<std::string> stop_string;      // per sequence index: the one that ended it
  bool finished = false;
  int num_cached_prompt_tokens = -1;
  int num_updates = 0;
};

class SchedulerHarness {
 public:
  SchedulerHarness(const SchedulerConfig& config, const BlockSpaceManagerConfig& cache,
                   const FakeExecutorConfig& exec, const DetokenizerFactory* detok = nullptr)
      : scheduler(config, cache), executor(exec), detok_(detok) {}

  static FakeExecutorConfig ExecConfig(const BlockSpaceManagerConfig& cache, TokenId eos = -1,
                                       double eos_probability = 0) {
    return {.num_gpu_blocks = cache.num_gpu_blocks,
            .num_cpu_blocks = cache.num_cpu_blocks,
            .block_size = cache.block_size,
            .eos_token_id = eos,
            .eos_probability = eos_probability};
  }

  absl::Status Add(const std::string& id, std::vector<TokenId> prompt, SamplingParams params,
                   int priority = 0, std::string salt = {}) {
    if (!params.stop.empty() && detok_ == nullptr) {
      return absl::InvalidArgumentError("stop strings need a detokenizer");
    }
    RequestText text(detok_, prompt, params);
    absl::Status s =
        scheduler.AddRequest(id, std::move(prompt), params, priority, 0, std::move(salt));
    if (s.ok()) texts_.insert_or_assign(id, std::move(text));
    return s;
  }

  // One step; returns the plan (valid until the next Step()). With `async`, as EngineCore
  // runs it with async scheduling: the next step is planned (and handed to the executor)
  // before the one in flight is applied; the plan returned is then the one just made (empty
  // when none was).
  const SchedulerOutput& Step() {
    if (async) return AsyncStep();
    const SchedulerOutput& out = scheduler.Schedule();
    last_step_tokens.push_back(out.total_num_scheduled_tokens);
    ModelOutput mo;
    const absl::Status s = executor.Execute(out, &mo);
    EXPECT_TRUE(s.ok()) << s;
    Apply(mo);
    return out;
  }

  // Applies the oldest step's result, records the streams, checks the invariants.
  void Apply(const ModelOutput& mo) {
    absl::StatusOr<const StepOutputs*> outputs = scheduler.UpdateFromOutput(mo);
    EXPECT_TRUE(outputs.ok()) << outputs.status();
    if (outputs.ok()) Record(**outputs);
    const absl::Status inv = scheduler.CheckInvariants();
    EXPECT_TRUE(inv.ok()) << inv;
  }

  const SchedulerOutput& AsyncStep() {
    static const SchedulerOutput kNone;
    const SchedulerOutput* planned = &kNone;
    if (scheduler.HasUnfinishedRequests() || scheduler.has_finished_to_report()) {
      const SchedulerOutput& out = scheduler.Schedule();
      if (!scheduler.RetractEmptyStep()) {
        planned = &out;
        last_step_tokens.push_back(out.total_num_scheduled_tokens);
        const absl::Status s = executor.Submit(out);
        EXPECT_TRUE(s.ok()) << s;
      }
    }
    const int in_flight = scheduler.num_steps_in_flight();
    if (in_flight == Scheduler::kMaxStepsInFlight || (planned == &kNone && in_flight > 0)) {
      ModelOutput mo;
      const absl::Status s = executor.Collect(&mo);
      EXPECT_TRUE(s.ok()) << s;
      Apply(mo);
    }
    return *planned;
  }

  // Whether anything is left to plan or apply.
  bool Busy() const {
    return scheduler.HasUnfinishedRequests() || scheduler.has_finished_to_report() ||
           scheduler.num_steps_in_flight() > 0;
  }

  void Record(const StepOutputs& from) {
    StepOutputs outputs = from;
    for (RequestOutput& r : outputs.requests) {
      const std::string id(r.request_id);
      auto text = texts_.find(id);
      // Its stream ended at a stop string: the scheduler ended it since, unreported.
      if (text == texts_.end()) continue;
      const bool finished_by_scheduler = r.finished;
      RequestText::Applied applied = text->second.Apply(&outputs, &r);
      if (!applied.stopped.empty() && !finished_by_scheduler) {
        const absl::Status s = scheduler.StopSequences(id, applied.stopped);
        EXPECT_TRUE(s.ok()) << s;
      }
      Stream& st = streams[id];
      EXPECT_FALSE(st.finished) << r.request_id << " updated after finishing";
      ++st.num_updates;
      st.num_cached_prompt_tokens = r.num_cached_prompt_tokens;
      for (const SequenceOutput& s : outputs.Seqs(r)) {
        if (st.tokens.size() <= static_cast<size_t>(s.index)) {
          st.tokens.resize(s.index + 1);
          st.status.resize(s.index + 1, SequenceStatus::kRunning);
          st.text.resize(s.index + 1);
          st.stop_string.resize(s.index + 1);
        }
        for (TokenId t : outputs.NewTokenIds(s)) st.tokens[s.index].push_back(t);
        st.text[s.index] += outputs.Text(s);
        st.stop_string[s.index] = s.stop_string;
        st.status[s.index] = s.status;
      }
      st.finished = r.finished;
      // Only now: the outputs' stop strings view the request's text.
      if (applied.ended) texts_.erase(text);
    }
  }

  // Steps until no request is left (and the workers were told); at most max_steps.
  int RunToCompletion(int max_steps = 100000) {
    int steps = 0;
    while (Busy() && steps < max_steps) {
      Step();
      ++steps;
      if (::testing::Test::HasFailure()) break;
    }
    return steps;
  }

  void ExpectAllBlocksFree() const {
    const BlockSpaceManagerStats s = scheduler.block_manager().stats();
    const BlockSpaceManager& m = scheduler.block_manager();
    EXPECT_EQ(s.num_free_gpu_blocks, m.gpu_pool().num_blocks());
    EXPECT_EQ(s.num_free_cpu_blocks, m.cpu_pool().num_blocks());
    EXPECT_EQ(m.num_sequences(), 0);
    const absl::Status inv = scheduler.CheckInvariants();
    EXPECT_TRUE(inv.ok()) << inv;
    EXPECT_EQ(executor.num_requests(), 0) << "the workers still hold requests";
  }

  Scheduler scheduler;
  FakeExecutor executor;
  bool async = false;
  std::map<std::string, Stream> streams;
  std::vector<int> last_step_tokens;

 private:
  const DetokenizerFactory* detok_;
  std::map<std::string, RequestText> texts_;  // of the requests whose streams go on
};

// The output tokens sequence `index` of a request must produce (what any correct schedule
// yields), by applying the FakeExecutor's token function to the growing sequence.
inline std::vector<TokenId> ExpectedStream(const FakeExecutor& exec, const FakeExecutorConfig& ec,
                                           std::vector<TokenId> tokens,
                                           const SamplingParams& params, int index, TokenId eos,
                                           int max_model_len) {
  const int prompt_len = static_cast<int>(tokens.size());
  std::vector<TokenId> out;
  while (true) {
    const int window = std::min<int>(static_cast<int>(tokens.size()), ec.context_window);
    const TokenId t = exec.NextToken(std::span<const TokenId>(tokens).last(window), index,
                                     params.seed.value_or(0));
    tokens.push_back(t);
    out.push_back(t);
    const int n_out = static_cast<int>(tokens.size()) - prompt_len;
    if (n_out >= params.min_tokens) {
      if (eos >= 0 && t == eos && !params.ignore_eos) break;
      if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), t) !=
          params.stop_token_ids.end()) {
        break;
      }
    }
    if (n_out >= params.max_tokens || static_cast<int>(tokens.size()) >= max_model_len) break;
  }
  return out;
}

}  // namespace llm

#endif  // LLM_TESTS_TESTING_SCHEDULER_HARNESS_H_
