// GlooCommunicator: Communicator over Gloo's TCP transport, for CPU workers.
//
// Ranks meet through a rendezvous store (gloo::rendezvous::Store) where each publishes its
// listening address: a HashStore shared by ranks that are threads of one process (tests), a
// FileStore directory for processes on one host, or a store reachable over the network for
// ranks on several hosts. Create() blocks until all world_size ranks have joined and
// connected, or fails after options.timeout. Every collective fails after options.timeout
// too, rather than wait forever for a rank that is gone.
//
// Thread-safety: as Communicator (one thread per rank's communicator). Owns its Gloo context
// and transport; non-copyable.
#ifndef LLM_WORKER_SERVICE_PARALLEL_GLOO_COMMUNICATOR_H_
#define LLM_WORKER_SERVICE_PARALLEL_GLOO_COMMUNICATOR_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker_service/parallel/communicator.h"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}  // namespace rendezvous
}  // namespace gloo

namespace llm {

struct GlooOptions {
  // The address this rank listens on for its peers: 127.0.0.1 for ranks of one host.
  std::string hostname = "127.0.0.1";
  // Keys in the store are prefixed with this, so that several groups can share one store.
  std::string prefix = "llm";
  // Limit of the rendezvous and of each collective.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
};

class GlooCommunicator : public Communicator {
 public:
  // Joins the group of world_size ranks as `rank` through `store`, which must outlive this
  // call only. Errors: INVALID_ARGUMENT for a bad rank, size or timeout; UNAVAILABLE when the
  // peers do not all show up within the timeout or cannot be connected.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(gloo::rendezvous::Store& store,
                                                                  int rank, int world_size,
                                                                  const GlooOptions& options = {});

  // The same with a FileStore in `directory` (created by the caller, on a file system every
  // rank sees).
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> CreateWithFileStore(
      const std::string& directory, int rank, int world_size, const GlooOptions& options = {});

  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status AllGather(const float* in, size_t count, float* out) override;
  absl::Status Broadcast(float* data, size_t count, int root) override;
  absl::Status Barrier() override;

 private:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, int rank, int world_size,
                   std::chrono::milliseconds timeout);
  // A fresh tag per collective: every rank issues the same sequence. Tag 0 is Create's barrier.
  uint32_t NextTag() { return next_tag_++; }

  std::shared_ptr<gloo::Context> context_;
  const int rank_;
  const int world_size_;
  const std::chrono::milliseconds timeout_;
  uint32_t next_tag_ = 1;
};

}  // namespace llm

#endif  // LLM_WORKER_SERVICE_PARALLEL_GLOO_COMMUNICATOR_H_
