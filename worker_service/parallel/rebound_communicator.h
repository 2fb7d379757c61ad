// ReboundCommunicator: the Communicator a worker's model holds across re-initializations of
// its group. The model keeps the Communicator* it was loaded with for its whole life, but every
// Init forms a new group (a fresh rendezvous prefix; after a failure, new peer processes), and
// reloading the weights for that would make every recovery as slow as a cold start. So the model
// is given this stable front instead, and each Init Rebind()s it to that group's communicator
// (ShmCommunicator or GlooCommunicator); the model never notices.
//
// rank and world_size are fixed at construction: the model is sharded for them, and a worker
// whose rank or world size changes reloads the model with a new ReboundCommunicator. While no
// communicator is bound (before the first Rebind, or after Rebind(nullptr) when a group is torn
// down) every collective returns FAILED_PRECONDITION "the worker group is not connected
// (Init)"; once bound, each call is the bound communicator's, with its errors.
//
// Ownership: owns the bound communicator; Rebind destroys the one it replaces. Thread-safety:
// none, as for every Communicator: Rebind and the collectives from one thread at a time
// (WorkerServer calls them under its mutex).
#ifndef LLM_WORKER_SERVICE_PARALLEL_REBOUND_COMMUNICATOR_H_
#define LLM_WORKER_SERVICE_PARALLEL_REBOUND_COMMUNICATOR_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "worker_service/parallel/communicator.h"

namespace llm {

class ReboundCommunicator : public Communicator {
 public:
  ReboundCommunicator(int rank, int world_size) : rank_(rank), world_size_(world_size) {}
  ReboundCommunicator(const ReboundCommunicator&) = delete;
  ReboundCommunicator& operator=(const ReboundCommunicator&) = delete;

  // Routes the collectives to `inner` (null: to nothing) from now on. `inner` must have this
  // communicator's rank and world size.
  void Rebind(std::unique_ptr<Communicator> inner);

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status AllReduceSum16(void* data, size_t count, bool bf16) override;
  absl::Status WaitForCollectives() override;
  absl::Status AllGather(const float* in, size_t count, float* out) override;
  absl::Status Broadcast(float* data, size_t count, int root) override;
  absl::Status Barrier() override;
  // The bound communicator's stream; null while none is bound.
  void* stream() const override { return inner_ != nullptr ? inner_->stream() : nullptr; }

 private:
  const int rank_;
  const int world_size_;
  std::unique_ptr<Communicator> inner_;
};

}  // namespace llm

#endif  // LLM_WORKER_SERVICE_PARALLEL_REBOUND_COMMUNICATOR_H_
