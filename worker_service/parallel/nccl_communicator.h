// NcclCommunicator: Communicator over NCCL, for GPU workers (one rank per device).
//
// Rank 0 makes the group's id with NewUniqueId() (128 bytes, which also starts NCCL's
// bootstrap root in rank 0's process: it must stay alive until every rank has joined); the
// scheduler's rendezvous passes the bytes on, and every rank calls Create() with them.
//
// Buffers are DEVICE pointers on this communicator's device (Communicator's float* are host
// pointers for Gloo): each collective checks that, and fails with INVALID_ARGUMENT otherwise.
// Collectives are enqueued on the stream given to Create(), which stream() returns: the
// worker's one stream, which its ops run on too (OpContext::stream = stream()), so that the
// collectives are ordered after the kernels that produced their inputs and then waited for: a call
// returns once the stream has drained, i.e. the collective and everything enqueued before it on
// that stream are done. That wait is what gives each call a deadline: the communicator runs in
// NCCL's non-blocking mode (ncclConfig_t.blocking = 0), and Create() and every collective poll
// ncclCommGetAsyncError and cudaStreamQuery until done, an error, or the timeout. On an error
// or the timeout the communicator is aborted (ncclCommAbort, which also stops the collective's
// kernel) and the call returns UNAVAILABLE naming the collective, so that a dead or stuck peer
// never hangs a worker; every later call returns UNAVAILABLE too, and every rank must be
// rebuilt (the peers' collectives fail within their own timeouts).
//
// Cost: by default the host waits for the stream at every collective, so the CPU cannot run
// ahead of the GPU across a collective, and collectives cannot be captured into a CUDA graph.
// A GPU worker turns on the deferred mode (SetDeferredWait) and waits once per step instead.
//
// Thread-safety: as Communicator (one thread per rank's communicator). Create() and every call
// make `device` the calling thread's current CUDA device. Owns the NCCL communicator (and a
// 4-byte device buffer for Barrier); the stream is the caller's and must outlive this.
// Non-copyable.
#ifndef LLM_WORKER_SERVICE_PARALLEL_NCCL_COMMUNICATOR_H_
#define LLM_WORKER_SERVICE_PARALLEL_NCCL_COMMUNICATOR_H_

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker_service/parallel/communicator.h"

namespace llm {

class NcclCommunicator : public Communicator {
 public:
  // The size of an NCCL unique id (NCCL_UNIQUE_ID_BYTES).
  static constexpr size_t kUniqueIdBytes = 128;

  // A fresh group id (ncclGetUniqueId): kUniqueIdBytes bytes. Needs no device. INTERNAL when
  // NCCL fails (e.g. no network interface for its bootstrap).
  static absl::StatusOr<std::string> NewUniqueId();

  // Joins the group of world_size ranks named by `unique_id` as `rank`, on CUDA device
  // `device`, with collectives on `stream` (a cudaStream_t of that device; null = its default
  // stream). Returns once every rank has joined. Errors: INVALID_ARGUMENT for an id that is
  // not kUniqueIdBytes long, a bad rank, size, device or timeout; UNAVAILABLE when the group
  // is not complete within `timeout` (a peer that never joins) or NCCL fails, after aborting
  // the half-made communicator.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      std::string_view unique_id, int rank, int world_size, int device, void* stream,
      std::chrono::milliseconds timeout);

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  // Finalizes and destroys the communicator, or aborts it if that does not finish within the
  // timeout (or it was broken already).
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  int device() const { return device_; }
  // The stream given to Create(): the worker's one stream (see Communicator::stream).
  void* stream() const override;

  // As Communicator, with device pointers; each waits for the stream (see the top).
  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status AllReduceSum16(void* data, size_t count, bool bf16) override;
  absl::Status AllGather(const float* in, size_t count, float* out) override;
  absl::Status Broadcast(float* data, size_t count, int root) override;
  // An all-reduce of one float.
  absl::Status Barrier() override;

  // Deferred mode (off by default): each collective returns once NCCL has enqueued it on the
  // stream, without waiting for the stream, so the host runs ahead of the GPU through a whole
  // forward pass and collectives can be captured into a CUDA graph; errors of NCCL's enqueue
  // still fail the call at once. WaitForCollectives() then awaits the stream (everything on
  // it) with the same deadline, polling ncclCommGetAsyncError: a dead or stuck peer aborts the
  // communicator within the timeout and gives UNAVAILABLE naming it.
  void SetDeferredWait(bool deferred);
  absl::Status WaitForCollectives() override;

 private:
  struct Impl;
  explicit NcclCommunicator(std::unique_ptr<Impl> impl, int rank, int world_size, int device);

  std::unique_ptr<Impl> impl_;  // NCCL types stay out of this header
  const int rank_;
  const int world_size_;
  const int device_;
};

}  // namespace llm

#endif  // LLM_WORKER_SERVICE_PARALLEL_NCCL_COMMUNICATOR_H_
