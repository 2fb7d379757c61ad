// ShardedWorkerClient: the scheduler's side of a tensor-parallel worker group, one llm-worker
// per rank (protos/llm/v1/worker_service.proto).
//
// Setup (WorkerGroup's thread, in this order): WaitUntilHealthy (retries with backoff
// until every rank answers Health), Init (every rank in parallel: Gloo's rendezvous blocks
// until all ranks join), ProfileMemory (the smallest figures over the ranks), InitCache, then
// OpenStreams (one Step stream per rank). The client is then an Executor: each Execute
// encodes the step once, writes it to every rank in parallel (a thread per rank), and reads
// one StepResult per rank within `worker_timeout`; the sampled tokens come from rank 0.
//
// Failures: any rank whose call fails, whose stream breaks, that answers an error or the wrong
// step id, or that does not answer in time fails the call with UNAVAILABLE naming the rank
// and its address ("worker rank 1 at 127.0.0.1:50062: ..."). A failed step names the cause:
// a rank whose stream broke before one that answered an error (a collective its dead peer
// never reached), and of several late ranks the one that does not answer Health either. A failed
// step cancels every stream and the client stays failed: every later Execute returns the same
// status, and on_failure (when set) is called once, on the thread that saw the failure. Nothing
// waits longer than `worker_timeout` (plus the time gRPC takes to deliver a cancellation).
//
// Thread-safety: setup calls and Execute from one thread at a time (WorkerGroup's thread, then the
// engine thread); CheckHealth(), Cancel() and failure() from any thread. Destruction cancels the
// streams and joins the rank threads.
#ifndef LLM_SCHEDULER_SERVICE_ENGINE_SHARDED_WORKER_CLIENT_H_
#define LLM_SCHEDULER_SERVICE_ENGINE_SHARDED_WORKER_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "llm/v1/worker_service.grpc.pb.h"
#include "protocol/executor.h"

namespace llm {

struct ShardedWorkerClientOptions {
  std::vector<std::string> addresses;                 // host:port, one per rank, in rank order
  absl::Duration worker_timeout = absl::Seconds(60);  // each step, and each setup call
  // gRPC keepalive on each rank's channel (its Step stream and Health probes): a PING after
  // `keepalive_time` without a read, and the transport is closed (every call on it fails
  // UNAVAILABLE) when no answer comes within `keepalive_timeout`. So a rank that is stopped
  // (SIGSTOP) or cut off (link down) is noticed within about their sum, however long
  // `worker_timeout` is. Zero keepalive_time: no keepalive.
  absl::Duration keepalive_time = absl::Seconds(2);
  absl::Duration keepalive_timeout = absl::Seconds(3);
  // Called once when the group fails (not for Cancel()). Must not block.
  std::function<void(const absl::Status&)> on_failure;
  // Presented on every call to the workers (common/grpc_security.h); empty: none.
  std::string cluster_secret;
};

class ShardedWorkerClient : public Executor {
 public:
  // Creates the channels (nothing is contacted yet). INVALID_ARGUMENT without addresses.
  static absl::StatusOr<std::unique_ptr<ShardedWorkerClient>> Create(
      ShardedWorkerClientOptions options);
  ~ShardedWorkerClient() override;
  ShardedWorkerClient(const ShardedWorkerClient&) = delete;
  ShardedWorkerClient& operator=(const ShardedWorkerClient&) = delete;

  int world_size() const { return static_cast<int>(ranks_.size()); }
  const std::string& address(int rank) const { return ranks_[rank]->address; }

  // Calls Health on every rank until all answer serving, sleeping between rounds (100 ms
  // doubling to 2 s). Returns CANCELLED after Cancel(); `last_reason` (may be null) is kept
  // up to date with why the last round failed.
  absl::Status WaitUntilHealthy(std::string* last_reason = nullptr);

  // While the group runs (between steps, from another thread): Health on every rank, each
  // within the worker timeout. A rank that fails it, or answers not serving, fails the group
  // as a failed step does (so a dead worker is noticed without waiting for a request).
  // Returns failure().
  absl::Status CheckHealth();

  // Whether a setup call's failure with this code is a refusal that retrying cannot fix.
  static bool IsPermanent(absl::StatusCode code);

  // Init on every rank in parallel; `base` is completed with each rank's rank and world_size.
  // INVALID_ARGUMENT / FAILED_PRECONDITION when every rank refused it so (ForEachRank);
  // otherwise UNAVAILABLE naming the first rank that failed. ProfileMemory and InitCache too.
  absl::StatusOr<std::vector<v1::InitResponse>> Init(const v1::InitRequest& base);
  // ProfileMemory on every rank in parallel; the smallest block counts of all ranks.
  absl::StatusOr<v1::ProfileMemoryResponse> ProfileMemory(const v1::ProfileMemoryRequest& req);
  absl::Status InitCache(const v1::InitCacheRequest& req);
  // Opens one Step stream per rank and starts the rank threads.
  absl::Status OpenStreams();

  absl::Status Execute(const SchedulerOutput& step, ModelOutput* out) override;

  // Cancels every call in flight and every later one (CANCELLED). Thread-safe; idempotent.
  void Cancel();
  // OK while the group works; else why it failed (or CANCELLED).
  absl::Status failure() const;

 private:
  struct Rank {
    int rank = 0;
    std::string address;
    std::unique_ptr<v1::WorkerService::Stub> stub;
    std::unique_ptr<grpc::ClientContext> stream_context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::StepRequest, v1::StepResult>> stream;
    std::thread thread;
    bool finished = false;  // stream->Finish() was called (rank thread, then destructor)
    // Guarded by the client's mu_.
    uint64_t done_job = 0;
    absl::Status job_status;
    v1::StepResult result;
  };

  explicit ShardedWorkerClient(ShardedWorkerClientOptions options);
  // Runs `call(rank, context)` for every rank on a thread each, with the worker timeout as
  // the deadline. The first failure in time (UNAVAILABLE naming the rank) cancels the other
  // calls, unless it is a refusal (IsPermanent): then, when every rank refuses, the result has
  // rank 0's code and message ("every rank refused Init (2 ranks); the first: worker rank 0 ...").
  absl::Status ForEachRank(const char* what,
                           const std::function<grpc::Status(Rank&, grpc::ClientContext*)>& call);
  absl::Status RankError(const Rank& r, const std::string& reason) const;
  // The error of a step that ranks did not answer in time: the late rank, or of several late
  // ones the first that does not answer Health either (the one that stalls the others).
  absl::Status TimedOutRank(const std::vector<bool>& timed_out, int64_t step_id);
  // Health on every rank in turn; the first failure (UNAVAILABLE naming the rank).
  absl::Status HealthRound(absl::Duration deadline);
  // Registers a context so that Cancel() reaches it; false when already cancelled.
  bool Register(grpc::ClientContext* context);
  void Unregister(grpc::ClientContext* context);
  void RankLoop(Rank* r);
  // Records the first failure, cancels the streams, and calls on_failure once.
  void Fail(const absl::Status& status);
  bool JobsDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ShardedWorkerClientOptions options_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  v1::StepRequest request_;  // written by Execute, read by the rank threads during a job

  mutable absl::Mutex mu_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t job_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<grpc::ClientContext*> contexts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_ENGINE_SHARDED_WORKER_CLIENT_H_
