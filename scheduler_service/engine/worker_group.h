// WorkerGroup: llm-scheduler's tensor-parallel group of llm-worker ranks, brought up and kept
// up. Start() runs the group's lifecycle on a thread of its own, attempt after attempt, until
// Stop():
//
//   1. connect    a ShardedWorkerClient over `addresses`; Health on every rank until all answer
//                 (workers may start after the scheduler, or be restarting).
//   2. Init       every rank in parallel: the model, dtype, device and the scheduler's limits,
//                 and the rendezvous at `rendezvous_address` under the prefix "group-<attempt>"
//                 (fresh per attempt, so that ranks of a failed attempt never meet the new
//                 ones; on_rendezvous lets the store forget the earlier attempts' keys). A rank
//                 that loaded a vocabulary of another size than `vocab_size` fails the attempt.
//   3. KV sizing  ProfileMemory (the smallest figures over the ranks), then CacheFromProfile:
//                 `num_gpu_blocks_override` wins over the figures; no room for a block fails.
//   4. InitCache  on every rank with those block counts; one Step stream per rank.
//   5. serve      `serve` gets the group's client (an Executor) and the cache, starts an engine
//                 on it and returns it. While it serves, every rank's Health is probed each
//                 second, so that a dead worker is noticed without a request.
//   6. down       the first failed step or probe (the client's failure, UNAVAILABLE "worker rank
//                 1 at H:P: ...") or Stop(): `not_ready(reason)`, the group's calls are
//                 cancelled, the engine is dropped, and the next attempt starts at 1 at once.
//
// Every attempt begins with not_ready("connecting to the workers (attempt N)"; with the last
// attempt's failure after it). An attempt that fails in 1-4 calls not_ready with its error and,
// unless the failure is permanent (on_permanent_failure), waits RetryDelay before the next: 0.5 s,
// doubling to 10 s while attempts keep failing (a group that served starts again from 0.5 s). No
// call to a rank waits longer than `worker_timeout`, and Stop() cancels whatever is under way.
//
// Ownership: serve takes the client and returns the handle that owns it (the engine over it);
// the group keeps that handle, and uses the client through it (probes, Cancel), until the group
// goes down. The handle is then dropped, so the engine and the client are destroyed there, or
// by whoever still holds a reference to them (the server).
//
// Thread-safety: Start() once; Stop() from any thread, any number of times. serve and not_ready
// run on the group's thread, one at a time, and must not call Stop().
#ifndef LLM_SCHEDULER_SERVICE_ENGINE_WORKER_GROUP_H_
#define LLM_SCHEDULER_SERVICE_ENGINE_WORKER_GROUP_H_

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
#include "llm/v1/worker_service.pb.h"
#include "scheduler_service/core/block_space_manager.h"
#include "scheduler_service/engine/serving_engine.h"
#include "scheduler_service/engine/sharded_worker_client.h"

namespace llm {

struct WorkerGroupOptions {
  std::vector<std::string> addresses;  // each rank's llm-worker, host:port, in rank order
  std::string cluster_secret;          // presented to the workers; empty: none
  // Each setup call, each step and each Health probe at most.
  absl::Duration worker_timeout = absl::Seconds(60);
  // gRPC keepalive on each rank's channel (ShardedWorkerClientOptions): a stopped or cut-off
  // rank is noticed within about keepalive_time + keepalive_timeout. Zero time: none.
  absl::Duration keepalive_time = absl::Seconds(2);
  absl::Duration keepalive_timeout = absl::Seconds(3);

  // Sent in every rank's Init.
  std::string model_path;  // the same path on every host
  std::string dtype = "auto";
  std::string kv_cache_dtype = "auto";
  bool enforce_eager = false;  // cuda: no CUDA graphs
  std::string device = "cpu";
  std::string rendezvous_address;  // host:port of the TcpStoreServer the ranks meet at
  uint32_t collective_timeout_ms = 30000;
  int max_model_len = 0;
  int max_num_batched_tokens = 0;
  int max_num_seqs = 0;
  // The scheduler's model's vocabulary size: a rank that loaded another fails the attempt.
  int vocab_size = 0;

  // The KV cache: block_size, watermark and prefix caching here; the block counts come from the
  // ranks' ProfileMemory with these budgets (see CacheFromProfile).
  BlockSpaceManagerConfig cache;
  double gpu_memory_utilization = 0.9;
  double swap_space_gib = 4;
  double cpu_kv_cache_space_gib = 1;
  int num_gpu_blocks_override = 0;  // > 0: exactly this many device blocks

  // The group is up (initialized, KV cache allocated, Step streams open): start serving on
  // `client` with `cache` (its block counts filled in) and return the engine, owning `client`.
  // The group only holds it, and drops it when the group goes down.
  std::function<std::shared_ptr<ServingEngine>(std::unique_ptr<ShardedWorkerClient> client,
                                               const BlockSpaceManagerConfig& cache)>
      serve;
  // The group is not serving, and why: an attempt under way, an attempt's error, the failure
  // that ended serving, or "server shutting down".
  std::function<void(const std::string& reason)> not_ready;
  // When set: an attempt that fails for good — every rank refused Init or ProfileMemory with
  // INVALID_ARGUMENT / FAILED_PRECONDITION (a bad model directory, heads not divisible by the
  // ranks), a rank loaded a model of another vocabulary, or no KV cache block fits (all three
  // FAILED_PRECONDITION) — ends the group's attempts: after
  // not_ready(its message), this is called with it (on the group's thread, which then ends) and
  // no attempt follows. Unset: such attempts are retried like any other.
  std::function<void(const absl::Status& status)> on_permanent_failure;
  // When set: called on the group's thread as each attempt's Init is about to go out, with the
  // attempt's rendezvous prefix ("group-<attempt>/", as the ranks' keys begin). The ranks of the
  // earlier attempts are done with their keys (they met, or their attempt failed), so
  // llm-scheduler's rendezvous store drops all others here (TcpStoreServer::RetainOnly).
  std::function<void(const std::string& rendezvous_prefix)> on_rendezvous;
};

class WorkerGroup {
 public:
  // The wait after the `failed_attempts`-th failed attempt in a row (>= 1): 0.5 s, doubling
  // with each further failure, at most 10 s.
  static absl::Duration RetryDelay(int failed_attempts);

  // The cache the ranks allocate: `base` with num_gpu_blocks from `profile` (the smallest over
  // the ranks) unless `num_gpu_blocks_override` > 0, and num_cpu_blocks from `profile`.
  // RESOURCE_EXHAUSTED when not one device block fits; INVALID_ARGUMENT when the result fails
  // BlockSpaceManagerConfig::Validate.
  static absl::StatusOr<BlockSpaceManagerConfig> CacheFromProfile(
      const BlockSpaceManagerConfig& base, const v1::ProfileMemoryResponse& profile,
      int num_gpu_blocks_override);

  // `options` must have addresses, serve and not_ready. Starts nothing.
  explicit WorkerGroup(WorkerGroupOptions options);
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;
  ~WorkerGroup();  // Stop()s

  // Starts the lifecycle on the group's thread.
  void Start();
  // Cancels whatever the group waits on, takes the group down (not_ready("server shutting
  // down") if it served) and joins the group's thread.
  void Stop();

 private:
  // The group's thread: attempts until stopped.
  void Run();
  // Whether a failed attempt's status is one that retrying cannot fix.
  static bool IsPermanent(const absl::Status& status);
  // One attempt's steps 1-4 on `client`; then the cache it allocated is in cache_.
  absl::Status Form(ShardedWorkerClient* client, int attempt);
  // Probes the ranks each second until the group fails or Stop(); why it stopped serving.
  std::string ServeUntilDown();
  bool stopping();

  const WorkerGroupOptions options_;
  BlockSpaceManagerConfig cache_;  // the group's thread
  std::string last_failure_;       // the group's thread: why the last group failed or did not form

  absl::Mutex thread_mu_;  // Start and Stop
  std::thread thread_ ABSL_GUARDED_BY(thread_mu_);

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  ShardedWorkerClient* client_ ABSL_GUARDED_BY(mu_) = nullptr;  // the current attempt's
  absl::Status failure_ ABSL_GUARDED_BY(mu_);                   // its failure, once it failed
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_ENGINE_WORKER_GROUP_H_
