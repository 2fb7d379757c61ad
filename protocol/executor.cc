#include "protocol/executor.h"

#include <utility>

namespace llm {

absl::Status Executor::Submit(const SchedulerOutput& step) {
  Done& done = done_.emplace_back();
  done.status = Execute(step, &done.output);
  return done.status;
}

absl::Status Executor::Collect(ModelOutput* out) {
  if (done_.empty()) return absl::FailedPreconditionError("Collect() without a step submitted");
  Done done = std::move(done_.front());
  done_.pop_front();
  if (done.status.ok()) *out = std::move(done.output);
  return done.status;
}

}  // namespace llm
