// Communicator: the collectives that tensor-parallel ranks run in lockstep (all-reduce of the
// row-parallel layers' partial sums, all-gather of sharded logits, broadcast, barrier).
// Implementations: ShmCommunicator (CPU ranks of one host, shared memory; shm_communicator.h)
// and GlooCommunicator (CPU, TCP; gloo_communicator.h), whose buffers are host memory, and
// NcclCommunicator (GPU; nccl_communicator.h, built with the CUDA backend), whose buffers are
// DEVICE pointers on its device: the float* below are in the memory of the implementation's
// device. ReboundCommunicator (rebound_communicator.h) forwards to one of them, rebound when a
// worker's group is formed again.
//
// Every rank calls the same collectives in the same order with the same counts. A failure (a
// peer that is gone or too slow past the timeout, a bad argument) returns an error status;
// after a transport error the communicator is broken and every rank should be rebuilt.
//
// Thread-safety: not thread-safe; each rank's communicator is used by one thread at a time.
// Buffers are the caller's and must stay valid for the duration of the call.
#ifndef LLM_WORKER_SERVICE_PARALLEL_COMMUNICATOR_H_
#define LLM_WORKER_SERVICE_PARALLEL_COMMUNICATOR_H_

#include <chrono>
#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace llm {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // data[i] = sum over ranks of data[i], in place, on every rank.
  virtual absl::Status AllReduceSum(float* data, size_t count) = 0;

  // The same for 16-bit floats (`bf16`: bfloat16, else IEEE half), summed in fp32 and rounded
  // once; `data` as the float overload's. Host communicators: UNIMPLEMENTED (CPU models are
  // fp32).
  virtual absl::Status AllReduceSum16(void* data, size_t count, bool bf16) {
    (void)data, (void)count, (void)bf16;
    return absl::UnimplementedError("this communicator reduces fp32 only");
  }
  // out[r * count + i] = rank r's in[i] (rank-major), on every rank. out holds
  // world_size() * count floats and does not overlap in.
  virtual absl::Status AllGather(const float* in, size_t count, float* out) = 0;

  // data = root's data, on every rank.
  virtual absl::Status Broadcast(float* data, size_t count, int root) = 0;

  // Returns once every rank has entered the barrier.
  virtual absl::Status Barrier() = 0;

  // Waits until every collective called so far has completed, within the communicator's
  // timeout (UNAVAILABLE naming the peer or the collective otherwise). A no-op for
  // communicators whose calls complete before they return (all but NCCL's deferred mode).
  virtual absl::Status WaitForCollectives() { return absl::OkStatus(); }
  // The device stream the collectives are enqueued on (a cudaStream_t), or null for host
  // communicators. A GPU worker has ONE stream for its step: it passes this one as
  // OpContext::stream to every op (kernels, cache copies) of the model, so that kernels, copies
  // and collectives are a single ordered sequence (a collective reads what the kernels before
  // it wrote, with no event or synchronization between them).
  virtual void* stream() const { return nullptr; }
};

// The argument checks every implementation makes: INVALID_ARGUMENT unless 0 <= rank <
// world_size and the timeout is positive (Create), or 0 <= root < world_size (Broadcast).
inline absl::Status CheckGroupArgs(int rank, int world_size, std::chrono::milliseconds timeout) {
  if (world_size <= 0 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not in a world of size ", world_size));
  }
  if (timeout.count() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout must be > 0, got ", timeout.count(), " ms"));
  }
  return absl::OkStatus();
}
inline absl::Status CheckRoot(int root, int world_size) {
  if (root < 0 || root >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is not in a world of size ", world_size));
  }
  return absl::OkStatus();
}

}  // namespace llm

#endif  // LLM_WORKER_SERVICE_PARALLEL_COMMUNICATOR_H_
