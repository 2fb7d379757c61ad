#include "worker_service/parallel/rebound_communicator.h"

#include <utility>

namespace llm {
namespace {

absl::Status Unbound() {
  return absl::FailedPreconditionError("the worker group is not connected (Init)");
}

}  // namespace

void ReboundCommunicator::Rebind(std::unique_ptr<Communicator> inner) { inner_ = std::move(inner); }

absl::Status ReboundCommunicator::AllReduceSum(float* data, size_t count) {
  if (inner_ == nullptr) return Unbound();
  return inner_->AllReduceSum(data, count);
}

absl::Status ReboundCommunicator::AllReduceSum16(void* data, size_t count, bool bf16) {
  if (inner_ == nullptr) return Unbound();
  return inner_->AllReduceSum16(data, count, bf16);
}

absl::Status ReboundCommunicator::WaitForCollectives() {
  if (inner_ == nullptr) return Unbound();
  return inner_->WaitForCollectives();
}

absl::Status ReboundCommunicator::AllGather(const float* in, size_t count, float* out) {
  if (inner_ == nullptr) return Unbound();
  return inner_->AllGather(in, count, out);
}

absl::Status ReboundCommunicator::Broadcast(float* data, size_t count, int root) {
  if (inner_ == nullptr) return Unbound();
  return inner_->Broadcast(data, count, root);
}

absl::Status ReboundCommunicator::Barrier() {
  if (inner_ == nullptr) return Unbound();
  return inner_->Barrier();
}

}  // namespace llm
