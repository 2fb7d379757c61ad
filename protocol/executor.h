// Runs one planned step on the workers: the boundary between the scheduler and the model.
// Implemented by the scheduler's client of the worker ranks (ShardedWorkerClient), by a worker's
// ModelRunner (also run in process) and by the tests' FakeExecutor.
//
// Called from the engine thread only; an implementation need not be thread-safe.
#ifndef LLM_PROTOCOL_EXECUTOR_H_
#define LLM_PROTOCOL_EXECUTOR_H_

#include "absl/status/status.h"
#include "protocol/scheduler_output.h"

namespace llm {

class Executor {
 public:
  virtual ~Executor() = default;
  // Applies the step (scheduler_output.h gives the protocol) and fills `out` with its step id
  // and sampled tokens. An error means the step's result is unusable; the state of the
  // workers is then unknown.
  virtual absl::Status Execute(const SchedulerOutput& step, ModelOutput* out) = 0;
};

}  // namespace llm

#endif  // LLM_PROTOCOL_EXECUTOR_H_
