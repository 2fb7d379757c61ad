// Runs planned steps on the workers: the boundary between the scheduler and the model.
// Implemented by the scheduler's client of the worker ranks (ShardedWorkerClient), by a worker's
// ModelRunner (also run in process) and by the tests' FakeExecutor.
//
// Two forms. Execute runs one step and returns its result. Submit / Collect pipeline steps
// (asynchronous scheduling, EngineCore): Submit hands a step over and returns without its
// result; Collect returns the result of the oldest step submitted and not collected yet. The
// caller keeps at most kMaxStepsInFlight steps submitted and not collected, so that it plans
// step N + 1 while step N runs; the steps run in the order submitted, each on the state the one
// before left (the workers append the tokens they sample, scheduler_output.h).
//
// Called from the engine thread only; an implementation need not be thread-safe.
#ifndef LLM_PROTOCOL_EXECUTOR_H_
#define LLM_PROTOCOL_EXECUTOR_H_

#include <deque>

#include "absl/status/status.h"
#include "protocol/scheduler_output.h"

namespace llm {

class Executor {
 public:
  static constexpr int kMaxStepsInFlight = 2;

  virtual ~Executor() = default;
  // Applies the step (scheduler_output.h gives the protocol) and fills `out` with its step id
  // and sampled tokens. An error means the step's result is unusable; the state of the
  // workers is then unknown. Not while steps submitted are not collected.
  virtual absl::Status Execute(const SchedulerOutput& step, ModelOutput* out) = 0;

  // Hands the step over (it need not outlive the call). An error means the results of every
  // step not collected are unusable, as for Execute. The default runs Execute now and keeps
  // its result for Collect: the same order, without overlap (an executor in process).
  virtual absl::Status Submit(const SchedulerOutput& step);
  // The result of the oldest step submitted and not collected (FAILED_PRECONDITION when there
  // is none); an error as for Execute.
  virtual absl::Status Collect(ModelOutput* out);
  // Forgets the steps submitted and not collected, after a failure (their results are
  // unusable); the default drops the results it kept.
  virtual void DropSubmitted() { done_.clear(); }

 private:
  struct Done {
    absl::Status status;
    ModelOutput output;
  };
  std::deque<Done> done_;  // the default Submit's results, oldest first
};

}  // namespace llm

#endif  // LLM_PROTOCOL_EXECUTOR_H_
