// The engine core: owns the Scheduler and drives the Executor on one thread.
//
//   other threads:  AddRequest / Abort  ->  inbox (mutex)
//   engine thread:  Step() = drain inbox -> Schedule -> executor.Execute -> UpdateFromOutput
//                            -> each request's stream callback
//
// With asynchronous scheduling (set_async_scheduling) a Step() plans and submits step N + 1
// before it collects and applies step N (Executor::Submit / Collect), so that the workers run
// step N while the engine plans the next one, and start it as soon as they are done with N:
//
//   Step():  drain inbox -> Schedule (N + 1) -> Submit -> Collect (N) -> UpdateFromOutput
//                        -> stream callbacks
//
// Clients see the same tokens either way (scheduler.h says what planning ahead assumes and
// how a sequence that ends in step N drops what step N + 1 sampled for it).
//
// A step's output work runs off the engine thread once Start() has run: the engine thread
// applies a step's result (tokens, and the ends they make: EOS, stop token ids, max_tokens),
// copies what the streams need and queues it; an output thread makes the text (each request's
// RequestText: detokenization and stop strings, several times the rest of a decode step's
// work) and calls the callbacks, each stream's in order. A stop string the output thread finds
// ends its sequence there (nothing past it reaches the client) and comes back to the engine
// thread as an event, like an abort, that stops the sequence in the scheduler (the steps
// planned meanwhile computed tokens for it that are dropped). The engine thread runs ahead of
// the output thread by at most kMaxQueuedOutputs steps. Without Start() (tests, the simulator,
// llm-generate: the caller steps), the same work runs at once, on the caller's thread.
//
// AddRequest and Abort are thread-safe and never block on a step. Step() and RunUntilIdle()
// run on the engine thread: either the caller's or the one Start() launches. Callbacks must
// not block for long (they hold every stream's output back); they may call AddRequest / Abort.
#ifndef LLM_SCHEDULER_SERVICE_ENGINE_ENGINE_CORE_H_
#define LLM_SCHEDULER_SERVICE_ENGINE_ENGINE_CORE_H_

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/sampling_params.h"
#include "protocol/executor.h"
#include "scheduler_service/core/request_output.h"
#include "scheduler_service/core/request_text.h"
#include "scheduler_service/core/scheduler.h"

namespace llm {

struct EngineRequest {
  std::string request_id;
  std::vector<TokenId> prompt_token_ids;
  SamplingParams sampling_params;
  int priority = 0;
  std::string cache_salt;
};

// What GetStats reports: the scheduler's stats and the free block counts, as of the end of the
// last step (or of construction).
struct EngineStats {
  SchedulerStats scheduler;
  int num_free_gpu_blocks = 0;
  int num_free_cpu_blocks = 0;
  // What the workers run with, as the last step that reported it said (rank 0's).
  std::optional<WorkerStats> worker;
};

// One update of a request's stream. `output` (with `outputs` for its tokens) is set on
// success; the last update has output->finished or a non-OK status (the request failed or was
// aborted: then output is null). Valid during the callback only, which runs on the output
// thread (or the caller's thread: see above), never two of one stream at once.
struct StreamUpdate {
  absl::Status status;
  const RequestOutput* output = nullptr;
  const StepOutputs* outputs = nullptr;
};
using StreamCallback = std::function<void(const StreamUpdate&)>;

class EngineCore {
 public:
  // `executor` (not owned) and `detokenizers` (may be null) outlive the engine.
  EngineCore(const SchedulerConfig& config, const BlockSpaceManagerConfig& cache_config,
             Executor* executor, const DetokenizerFactory* detokenizers = nullptr);
  ~EngineCore();  // Stop()s
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  // Thread-safe. Validates the request now, the only check it gets (Scheduler::ValidateRequest:
  // INVALID_ARGUMENT naming the field; stop strings need a DetokenizerFactory; ALREADY_EXISTS
  // for an id in flight), makes its sequences' detokenizers and queues it; `on_update` is then
  // called for each step's output.
  absl::Status AddRequest(EngineRequest request, StreamCallback on_update);
  // Thread-safe. NOT_FOUND for an id not in flight. The id is free for a new request at once;
  // the stream ends with CANCELLED, and the blocks are freed, at the start of the next step
  // (before a new request with the id is queued), and the workers are told in that step.
  absl::Status Abort(const std::string& request_id);

  // Engine thread: one step. Returns whether anything was in flight; an executor error is
  // returned as is. Without a recovery timeout every stream then ends with that error; with
  // one, the engine pauses (see set_recovery_timeout).
  absl::StatusOr<bool> Step();

  // Recovery from a failed executor (a worker died, stalled or was cut off). With a positive
  // `timeout` (before Start()), a failed Execute does not end the streams: the scheduler puts
  // every request back as preempted by recompute (Scheduler::ResetForNewWorkers), and the
  // engine pauses (it takes new requests and aborts, and schedules nothing) until
  // ReplaceExecutor hands it a working one; the requests then continue where their streams
  // are, so a stream sees a pause and no token twice or lost. A request still in flight
  // `timeout` after the failure (counted from the first failure until a step succeeds again,
  // or from its arrival during the pause) ends with UNAVAILABLE naming the failure. Zero (the
  // default): fail-stop, every stream ends with the executor's error.
  void set_recovery_timeout(absl::Duration timeout) { recovery_timeout_ = timeout; }
  // Before Start(): plan step N + 1 while step N runs (see above). Off (the default): each
  // step is executed and applied before the next is planned.
  void set_async_scheduling(bool on) { async_scheduling_ = on; }
  // Thread-safe. The executor the engine uses from its next step on (not owned; it must
  // outlive its use), over workers that know nothing of the requests: the scheduler is reset
  // for it with `cache` (its block counts; the block size must not change) before that step.
  // Once the engine thread runs (Start()), returns after the engine adopted it, so that the
  // previous executor may be destroyed then; otherwise the next Step() adopts it.
  void ReplaceExecutor(Executor* executor, const BlockSpaceManagerConfig& cache);
  // Thread-safe: the executor failure the engine is paused on (OK when it is not).
  absl::Status paused_on() const;
  // Engine thread: steps until nothing is in flight.
  absl::Status RunUntilIdle();

  // Runs Step() on a thread of its own until Stop(); it sleeps while nothing is in flight.
  // Starts the output thread too.
  void Start();
  // Stops the engine thread, then delivers every update still queued and stops the output
  // thread.
  void Stop();

  // Steps of outputs the engine thread may queue before it waits for the output thread.
  static constexpr size_t kMaxQueuedOutputs = 4;

  // Engine thread only (or when stopped).
  const Scheduler& scheduler() const { return scheduler_; }
  // Thread-safe: the stats published at the end of the last Step().
  EngineStats stats_snapshot() const;

 private:
  // A request's stream: the engine thread holds it while the request is in the scheduler, and
  // each delivery for it holds it too; the output thread alone uses `text` and `ended`.
  struct StreamState {
    StreamState(StreamCallback cb, RequestText t) : on_update(std::move(cb)), text(std::move(t)) {}
    StreamCallback on_update;
    RequestText text;
    std::string request_id;
    uint64_t generation = 0;
    bool ended = false;  // its last update was delivered: nothing more is
  };
  // What other threads queue for the engine thread, in order: an add (with its stream), an
  // abort, or a stop of sequences that stop strings ended (from the output thread), each about
  // the request of that id and generation.
  struct Event {
    enum class Kind : uint8_t { kAdd, kAbort, kStop };
    Kind kind = Kind::kAdd;
    uint64_t generation = 0;
    EngineRequest request;                // an add's; the others' request_id only
    std::shared_ptr<StreamState> stream;  // an add's
    std::vector<int> seqs;                // a stop's sequence indices
    bool ended = false;                   // a stop's: the stream has ended
  };
  struct Stream {
    std::shared_ptr<StreamState> state;
    uint64_t generation = 0;
  };
  // What the output thread delivers for one step (or one event): its outputs, owned (the views
  // into the scheduler's requests point into `strings`), and the streams to update in order.
  struct Delivery {
    struct Update {
      std::shared_ptr<StreamState> stream;
      absl::Status status;
      int output = -1;  // into outputs.requests; -1: the status alone
    };
    StepOutputs outputs;
    std::deque<std::string> strings;
    std::vector<Update> updates;
  };
  // Copies the step's outputs into `d`, owning what they view.
  static void CopyOutputs(const StepOutputs& from, Delivery* d);
  // Queues the delivery for the output thread (waiting while kMaxQueuedOutputs are queued), or
  // delivers it now when there is none.
  void Deliver(Delivery d);
  // Makes each update's text and calls the callbacks (the output thread, or the caller's).
  void Run(Delivery& d);
  // The output thread found stop strings that ended sequences `seqs` of the stream (all of it
  // when `ended`): frees the id when it ended, and queues the stop for the engine thread.
  void TextStopped(const StreamState& stream, std::vector<int> seqs, bool ended);
  void OutputLoop();
  void DrainInbox();
  void FailAll(const absl::Status& status);
  // Frees `id` for reuse unless a newer request (another generation) took it meanwhile.
  void Release(absl::string_view id, uint64_t generation);
  void Loop();
  absl::StatusOr<bool> StepOnce();
  // StepOnce()'s two forms, for a scheduler that has `work` (requests, or ends to report).
  absl::StatusOr<bool> SyncStep();
  absl::StatusOr<bool> AsyncStep(bool work);
  // Applies model_output_ (the result of the oldest step in flight) and delivers the outputs.
  // `start` is when the step's planning began, `planned` and `ran` when it ended and when the
  // result came, for the --v=1 line.
  absl::Status ApplyResult(std::chrono::steady_clock::time_point start,
                           std::chrono::steady_clock::time_point planned,
                           std::chrono::steady_clock::time_point ran);
  void PublishStats();
  bool HasWorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adopts the executor ReplaceExecutor handed over, if any.
  void AdoptExecutor();
  // After a failed Execute, Submit or Collect: recovery (pauses) or fail-stop (ends every
  // stream). Every step in flight is lost.
  void OnExecutorFailure(const absl::Status& status);
  // While paused: ends every stream once the recovery timeout has passed.
  void ExpireRecovery();

  Scheduler scheduler_;
  const DetokenizerFactory* detokenizers_;
  Executor* executor_;  // engine thread
  absl::Duration recovery_timeout_ = absl::ZeroDuration();
  bool async_scheduling_ = false;
  // Engine thread: since when the engine has been recovering (a failure with no successful
  // step after it); InfiniteFuture when it is not.
  absl::Time recovering_since_ = absl::InfiniteFuture();
  absl::flat_hash_map<std::string, Stream> streams_;  // engine thread
  ModelOutput model_output_;                          // engine thread
  // Engine thread, async scheduling: when each step in flight began and ended its planning.
  std::deque<
      std::pair<std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point>>
      planned_at_;
  bool stats_published_ = false;  // engine thread: this Step() published already

  mutable absl::Mutex mu_;
  std::vector<Event> inbox_ ABSL_GUARDED_BY(mu_);
  // Each id in flight, with its request's generation (every AddRequest takes a new one).
  absl::flat_hash_map<std::string, uint64_t> in_flight_ ABSL_GUARDED_BY(mu_);
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool running_thread_ ABSL_GUARDED_BY(mu_) = false;
  Executor* pending_executor_ ABSL_GUARDED_BY(mu_) = nullptr;
  BlockSpaceManagerConfig pending_cache_ ABSL_GUARDED_BY(mu_);
  absl::Status paused_on_ ABSL_GUARDED_BY(mu_);  // OK: not paused
  std::thread thread_;

  absl::Mutex out_mu_;
  std::deque<Delivery> out_queue_ ABSL_GUARDED_BY(out_mu_);
  bool out_running_ ABSL_GUARDED_BY(out_mu_) = false;  // the output thread takes deliveries
  bool out_busy_ ABSL_GUARDED_BY(out_mu_) = false;     // it is running one
  std::thread out_thread_;

  mutable absl::Mutex stats_mu_;
  EngineStats stats_ ABSL_GUARDED_BY(stats_mu_);
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_ENGINE_ENGINE_CORE_H_
