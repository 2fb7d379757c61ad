// ShardedWorkerClient: the scheduler's side of a tensor-parallel worker group, one llm-worker
// per rank (protos/llm/v1/worker_service.proto).
//
// Setup (WorkerGroup's thread, in this order): WaitUntilHealthy (retries with backoff
// until every rank answers Health), Init (every rank in parallel: Gloo's rendezvous blocks
// until all ranks join), ProfileMemory (the smallest figures over the ranks), InitCache, then
// OpenStreams (one Step stream per rank). The client is then an Executor with a pipelined form:
// Submit encodes the step once and has every rank's stream write it, and returns; Collect waits
// for the oldest step's StepResult from every rank; the sampled tokens come from rank 0. Each
// rank has a writer thread and a reader thread on its stream, so that step N + 1 is written
// while the reader waits for step N's result (a worker reads its stream serially: it runs
// step N + 1 as soon as it has answered step N). Execute is Submit then Collect.
//
// Failures: any rank whose call fails, whose stream breaks, that answers an error or the wrong
// step id, or that does not answer in time fails the call with UNAVAILABLE naming the rank
// and its address ("worker rank 1 at 127.0.0.1:50062: ..."). A failed step names the cause:
// a rank whose stream broke before one that answered an error (a collective its dead peer
// never reached), and of several late ranks the one that does not answer Health either. A failed
// step cancels every stream and the client stays failed: every later Submit, Collect and
// Execute returns the same status (the results of the steps still in flight are lost), and
// on_failure (when set) is called once, on the thread that saw the failure. Collect waits at
// most `worker_timeout` from its call (which is never before the previous step's results came,
// Collect going in order, so each step has at least that long from when the ranks could start
// it), plus the time gRPC takes to deliver a cancellation.
//
// Thread-safety: setup calls from one thread at a time (WorkerGroup's thread), then Submit,
// Collect and Execute from one thread (the engine thread); CheckHealth(), Cancel() and failure()
// from any thread. Destruction, with steps in flight or not, cancels the streams and joins the
// rank threads.
#ifndef LLM_SCHEDULER_SERVICE_ENGINE_SHARDED_WORKER_CLIENT_H_
#define LLM_SCHEDULER_SERVICE_ENGINE_SHARDED_WORKER_CLIENT_H_

#include <cstdint>
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

  // Calls Health on every rank until all answer serving: after a round a rank refused, again
  // after 100 ms doubling to 500 ms; after a round that waited out its deadline (min(2 s,
  // worker_timeout)), again at once, so that a stalled rank is heard as soon as it answers.
  // Returns CANCELLED after Cancel(); `last_reason` (may be null) is kept up to date with why
  // the last round failed.
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

  // Not while steps submitted are not collected (FAILED_PRECONDITION).
  absl::Status Execute(const SchedulerOutput& step, ModelOutput* out) override;
  // FAILED_PRECONDITION when kMaxStepsInFlight steps are submitted and not collected.
  absl::Status Submit(const SchedulerOutput& step) override;
  absl::Status Collect(ModelOutput* out) override;

  // Cancels every call in flight and every later one (CANCELLED). Thread-safe; idempotent.
  void Cancel();
  // OK while the group works; else why it failed (or CANCELLED).
  absl::Status failure() const;

 private:
  // A step's answer from one rank. Jobs are numbered from 1 in the order submitted; job j
  // uses slot j % kMaxStepsInFlight of the buffers below.
  struct Answer {
    uint64_t job = 0;
    absl::Status status;  // the stream broke (the rank's error, without its name)
    v1::StepResult result;
  };
  struct Rank {
    int rank = 0;
    std::string address;
    std::unique_ptr<v1::WorkerService::Stub> stub;
    std::unique_ptr<grpc::ClientContext> stream_context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::StepRequest, v1::StepResult>> stream;
    std::thread writer;
    std::thread reader;
    // The reader's: stream->Finish() was called (then the destructor's).
    bool finished = false;
    absl::Status broken;  // the reader's: why the stream broke, for every later job
    // Guarded by the client's mu_.
    uint64_t written = 0;           // the last job the writer is done with (written or not)
    uint64_t write_failed_job = 0;  // the first job whose Write failed; 0: none
    bool writing = false;           // the writer is in stream->Write
    bool closing = false;           // the reader finishes the stream: write no more
    uint64_t read = 0;              // the last job whose answer is in `answers`
    Answer answers[kMaxStepsInFlight];
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
  // Writes every job submitted to the rank's stream, in order.
  void WriterLoop(Rank* r);
  // Reads every written job's answer from the rank's stream, in order.
  void ReaderLoop(Rank* r);
  // Records the first failure, cancels the streams, and calls on_failure once.
  void Fail(const absl::Status& status);
  // Every rank's answer to `job` is in.
  bool AllRead(uint64_t job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ShardedWorkerClientOptions options_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  // Job j's request is requests_[j % kMaxStepsInFlight]: encoded by Submit, then read by the
  // writers until each has written it (before Submit reuses it for job j + 2), and by Collect
  // for its step id.
  v1::StepRequest requests_[kMaxStepsInFlight];

  mutable absl::Mutex mu_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t job_ ABSL_GUARDED_BY(mu_) = 0;        // the last job submitted
  uint64_t collected_ ABSL_GUARDED_BY(mu_) = 0;  // the last job collected
  std::vector<grpc::ClientContext*> contexts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_ENGINE_SHARDED_WORKER_CLIENT_H_
