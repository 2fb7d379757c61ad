// ShmCommunicator: Communicator over one shared-memory segment, for ranks on one host (as
// vLLM's and SGLang's CPU backends do). Over loopback TCP, a Gloo all-reduce of a few KiB is
// almost all thread hand-offs; this one costs a copy in, a flag, and a sum over the ranks'
// copies (docs/performance/results.md, "Collectives").
//
// The segment (a file in `directory`, /dev/shm by default) holds, per rank, a counter of the
// collectives it has posted and two sets of buffers of slot_bytes each. Collective k (every
// rank counts them alike) uses buffer set k % 2: each rank copies its input into its buffer,
// posts k, waits until every rank has posted k, then reads every rank's buffer (the sum in
// rank order, the same on every rank). A rank that posts k + 1 has finished reading the
// buffers of k - 1, so writing set k % 2 again at k + 2 needs no extra wait. Larger inputs go
// in slot_bytes chunks, one collective each. A waiter spins briefly, then sleeps on a futex
// that the poster wakes when somebody sleeps.
//
// Create() meets the peers through a rendezvous store: rank 0 makes the segment under a
// random name, the others open it and check a random token in it, and rank 0 publishes the
// outcome for all. When any rank cannot open it (ranks on different hosts, or containers that
// do not share `directory`) or declines (ShmOptions::enabled), every rank gets
// FAILED_PRECONDITION and should use Gloo instead.
// Rank 0 unlinks the file once every rank has mapped it, or the rendezvous failed; only a
// rank 0 killed during the rendezvous leaves it (a few MiB under a random name), and the next
// rank 0 to make a segment in that directory removes it (RemoveAbandonedSegments).
//
// A rank that does not post within the timeout fails that collective with UNAVAILABLE naming
// it, and so, within 100 ms, does one that died: each rank holds a lock on its byte of the
// segment's file, which the kernel drops when its process exits. The communicator is then
// broken, as Communicator says.
//
// Thread-safety: as Communicator (one thread per rank's communicator). Non-copyable.
#ifndef LLM_WORKER_SERVICE_PARALLEL_SHM_COMMUNICATOR_H_
#define LLM_WORKER_SERVICE_PARALLEL_SHM_COMMUNICATOR_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker_service/parallel/communicator.h"

namespace gloo {
namespace rendezvous {
class Store;
}  // namespace rendezvous
}  // namespace gloo

namespace llm {

struct ShmOptions {
  // Where the segment's file is made: a tmpfs every rank of the host sees.
  std::string directory = "/dev/shm";
  // Keys in the store are prefixed with this, so that several groups can share one store.
  std::string prefix = "llm";
  // Limit of the rendezvous and of each collective.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  // Bytes of one rank's buffer in one of the two sets: the chunk of a large collective.
  size_t slot_bytes = size_t{1} << 20;
  // false: take part in the rendezvous only to decline, so that every rank of a group whose
  // ranks disagree gets FAILED_PRECONDITION (and all use Gloo) instead of a timeout.
  bool enabled = true;
};

class ShmCommunicator : public Communicator {
 public:
  // Joins the group of world_size ranks as `rank` through `store`, which must outlive this
  // call only. Errors: INVALID_ARGUMENT for a bad rank, size, timeout or slot size;
  // FAILED_PRECONDITION (on every rank) when some rank cannot share the segment; UNAVAILABLE
  // when the peers do not all show up within the timeout.
  static absl::StatusOr<std::unique_ptr<ShmCommunicator>> Create(gloo::rendezvous::Store& store,
                                                                 int rank, int world_size,
                                                                 const ShmOptions& options = {});

  // Removes the segments in `directory` that no process holds (no rank's byte is locked: their
  // groups are gone) and that are at least `min_age` old (older than any rendezvous, so that a
  // segment its rank 0 has made and not locked yet is never taken). Returns how many. Rank 0
  // of every group calls it before it makes its segment.
  static int RemoveAbandonedSegments(const std::string& directory, std::chrono::seconds min_age);
  static constexpr char kSegmentPrefix[] = "llm-shm-";

  ShmCommunicator(const ShmCommunicator&) = delete;
  ShmCommunicator& operator=(const ShmCommunicator&) = delete;
  ~ShmCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status AllGather(const float* in, size_t count, float* out) override;
  absl::Status Broadcast(float* data, size_t count, int root) override;
  absl::Status Barrier() override;

 private:
  ShmCommunicator(int rank, int world_size, const ShmOptions& options, void* base, int fd,
                  size_t mapped_bytes);

  // Posts the next collective (the caller filled its buffer of next_set() first) and waits
  // until every rank has posted it. After a failure every later call fails the same way.
  absl::Status PostAndWait(const char* what);
  // Whether `rank` still holds its lock on the segment (its communicator lives).
  bool PeerHolds(int rank) const;
  int next_set() const { return static_cast<int>((posted_ + 1) & 1); }
  float* Buffer(int set, int rank) const;
  size_t slot_floats() const { return options_.slot_bytes / sizeof(float); }

  const int rank_;
  const int world_size_;
  const ShmOptions options_;
  void* const base_;
  const int fd_;  // open for the lock on byte rank_ (see PeerHolds)
  const size_t mapped_bytes_;
  uint32_t posted_ = 0;  // collectives this rank has posted
  absl::Status broken_;  // the failure that broke the group, if one did
};

}  // namespace llm

#endif  // LLM_WORKER_SERVICE_PARALLEL_SHM_COMMUNICATOR_H_
