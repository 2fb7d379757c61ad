// WorkerServer: one tensor-parallel rank of the model behind llm.v1.WorkerService (the gRPC
// side of llm-worker). The scheduler drives it through the group lifecycle:
//
//   Init            (re)joins the group: builds a fresh communicator over a TcpStore at
//                   rendezvous_address under rendezvous_prefix (world_size 1 needs none):
//                   shared memory or Gloo on cpu, NCCL on cuda (rank 0's unique id through
//                   the store; collectives deferred to one wait per step),
//                   loads the model shard (only when model_path, dtype, rank or world_size
//                   changed), and drops every request's state and the KV cache. Blocks until
//                   every rank has joined or collective_timeout_ms passes. Device cuda: reserves
//                   the activations of the largest step, makes the device sampler (every step
//                   samples on the GPU; max_num_seqs rows) and enables CUDA graphs for decode
//                   steps (padded batch sizes 1, 2, 4, ... up to max_num_seqs, at most
//                   kMaxGraphBatch) unless the request says enforce_eager.
//   ProfileMemory   the KV blocks the budget holds (device cpu: the CPU KV space and the swap
//                   space over CacheEngine::BytesPerBlock; device cuda: profiling passes
//                   (model_warmup.h: a prefill of max_num_batched_tokens, an eager decode step
//                   of max_num_seqs sequences at max_model_len, and every decode graph
//                   captured and launched; the worker's main loads every kernel module at
//                   start, CUDA_MODULE_LOADING=EAGER), then kv_cache_sizing with the request's
//                   gpu_memory_utilization; RESOURCE_EXHAUSTED with the sizing message when the
//                   model does not fit).
//   InitCache       allocates the KV cache (CacheEngine) and a fresh ModelRunner; device cuda:
//                   captures the decode graphs over the new cache before it answers
//                   (model_warmup.h).
//   Step            one long-lived bidi stream: each StepRequest is decoded (step_codec.h),
//                   run through the ModelRunner, and answered by one StepResult, in order
//                   (tokens and logprobs from rank 0 only; forward_seconds is the runner's
//                   Execute, sampling included). A rejected step answers error_code /
//                   error_message naming the step (and the request), leaves the state as it
//                   was and keeps the stream open. Steps before Init + InitCache answer
//                   FAILED_PRECONDITION the same way. Sampling limits: n up to max_num_seqs,
//                   logprobs up to the vocabulary (the scheduler enforces the user's limits).
//   Health          serving = true; detail "ready" once steps can run, else "not initialized"
//                   (with the reason after a colon when there is one); stats: what the worker
//                   runs with (sampler, graphs) and its counts as of the last step (rank 0 also
//                   sends them with every StepResult).
//   Logs            what it runs with at Init and InitCache (sampler, graphs captured and
//                   their batch sizes); with --v=1 every step (tokens, graph or eager, sampler,
//                   time).
//   Shutdown        answers, then, once the answer is delivered, stops the server on a thread
//                   of its own, cancelling any other rpc (a Step stream) at once.
//
// Concurrency. Init, ProfileMemory, InitCache and each step run under one mutex, so a step is
// never interleaved with a change of the model or cache: an Init that arrives while a step runs
// waits for that step (a step is bounded by the forward pass, and with world_size > 1 each of
// its collectives by the collective timeout, after which it fails). Health never waits on it.
// One Step stream is active at a time: a second one ends at once with FAILED_PRECONDITION.
// Init cancels the active stream (it belongs to a group that is being rebuilt) and no step of
// it runs after that Init; a stream that opens while a cancelled one is still winding down
// waits for it to end.
//
// A step that fails inside the model or its collectives (anything but INVALID_ARGUMENT) may
// have left the cache or the communicator broken: the worker then needs Init again.
//
// Ownership: owns the gRPC server, the model, the communicator and the cache. Thread-safe.
#ifndef LLM_WORKER_SERVICE_WORKER_SERVER_H_
#define LLM_WORKER_SERVICE_WORKER_SERVER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "grpcpp/grpcpp.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/tensor.h"
#include "llm/v1/worker_service.grpc.pb.h"
#include "protocol/scheduler_output.h"
#include "structured/grammar_cache.h"

namespace llm {

class CacheEngine;
class Communicator;
class DeviceContext;
class DeviceSampler;
class LlamaModel;
struct LayerKvCache;
class ModelRunner;
class ReboundCommunicator;

struct WorkerServerOptions {
  std::string host = "0.0.0.0";  // gRPC listen address
  int port = 0;                  // 0: any free port (see WorkerServer::port())
  // The address the other ranks reach this rank at for Gloo collectives.
  std::string peer_host = "127.0.0.1";
  // "cpu", or "cuda" / "cuda:N" (a build with the CUDA backend): where the model, its
  // activations and the KV cache live. The scheduler's Init must ask for the same kind.
  std::string device = "cpu";
  // Ranks that can share a segment in shm_directory (one host) run their collectives through
  // it (ShmCommunicator), the others through Gloo's TCP; false: always Gloo.
  bool shm_collectives = true;
  std::string shm_directory = "/dev/shm";
  // cpu, GGUF files: the linear weights and the embedding table stored in the types the
  // quantized kernels take stay the file's blocks (ModelOptions::quantized_weights); false
  // dequantizes them at load.
  bool quantized_weights = true;
  // Not empty: every WorkerService call must present it (common/grpc_security.h; else
  // UNAUTHENTICATED), and Init presents it to the rendezvous store. grpc.health.v1 stays open.
  std::string cluster_secret;
};

// --device's value as a device: "cpu", "cuda" (cuda:0) or "cuda:N"; INVALID_ARGUMENT for any
// other, or for cuda in a build without the CUDA backend.
absl::StatusOr<TensorDevice> ParseWorkerDevice(const std::string& device);

// Shutdown is a callback-API method: the server is stopped once that call is complete (a sync
// handler cannot know that, and a Shutdown() begun while it runs waits out the whole grace).
class WorkerServer final
    : public v1::WorkerService::WithCallbackMethod_Shutdown<v1::WorkerService::Service> {
 public:
  // The largest decode batch replayed from a CUDA graph (larger ones run eagerly).
  static constexpr int kMaxGraphBatch = 512;

  explicit WorkerServer(WorkerServerOptions options);
  WorkerServer(const WorkerServer&) = delete;
  WorkerServer& operator=(const WorkerServer&) = delete;
  ~WorkerServer() override;  // Stop()s

  // Builds and starts the gRPC server: this service, grpc.health.v1 (SERVING) and server
  // reflection. UNAVAILABLE when the address cannot be bound; call once.
  absl::Status Start();
  // The bound port, once Start() succeeded.
  int port() const { return port_; }
  // Blocks until the server has stopped (Stop() or the Shutdown rpc). After Start() only.
  void Wait();
  // Stops serving: rpcs in flight get `grace` to finish and are then cancelled. Idempotent;
  // any thread but an rpc handler's.
  void Stop(absl::Duration grace = absl::Seconds(1));

  grpc::Status Init(grpc::ServerContext* context, const v1::InitRequest* request,
                    v1::InitResponse* response) override;
  grpc::Status ProfileMemory(grpc::ServerContext* context, const v1::ProfileMemoryRequest* request,
                             v1::ProfileMemoryResponse* response) override;
  grpc::Status InitCache(grpc::ServerContext* context, const v1::InitCacheRequest* request,
                         v1::InitCacheResponse* response) override;
  grpc::Status Step(grpc::ServerContext* context,
                    grpc::ServerReaderWriter<v1::StepResult, v1::StepRequest>* stream) override;
  grpc::Status Health(grpc::ServerContext* context, const v1::HealthRequest* request,
                      v1::HealthResponse* response) override;
  grpc::ServerUnaryReactor* Shutdown(grpc::CallbackServerContext* context,
                                     const v1::ShutdownRequest* request,
                                     v1::ShutdownResponse* response) override;

 private:
  // What the loaded model was loaded for; Init reloads when it differs.
  struct ModelKey {
    std::string model_path;
    std::string dtype;
    int rank = 0;
    int world_size = 1;
    bool operator==(const ModelKey&) const = default;
  };

  absl::Status DoInit(const v1::InitRequest& request, v1::InitResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The NCCL group of a cuda worker: rank 0's unique id through `store` under `prefix`.
  absl::StatusOr<std::unique_ptr<Communicator>> JoinNcclGroup(gloo::rendezvous::Store& store,
                                                              const std::string& prefix, int rank,
                                                              int world,
                                                              std::chrono::milliseconds timeout,
                                                              v1::InitResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Init on cuda, once the model is loaded: reserves the activations of the largest step,
  // enables CUDA graphs for decode steps (unless enforce_eager) and makes the device sampler.
  absl::Status PrepareCudaServing(bool enforce_eager) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The most top logprobs a step may ask for: the vocabulary, at most 1024 on cuda (the device
  // sampler's limit).
  int MaxLogprobs() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // InitCache on cuda: captures the decode graphs over the new cache (model_warmup.h; they are
  // then ready for the first steps) and logs what the worker runs with.
  absl::Status WarmUpCuda() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The device sampler made at Init (cuda); null in a worker built without CUDA.
  DeviceSampler* device_sampler() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ProfileMemory on cuda: the profiling passes (model_warmup.h), then kv_cache_sizing.
  absl::Status ProfileCuda(const v1::ProfileMemoryRequest& request,
                           v1::ProfileMemoryResponse* response) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs one step of a stream opened in `generation` into `result` (which always echoes the
  // step id). A stream of an earlier generation is refused: its group is gone.
  void RunStep(const v1::StepRequest& request, uint64_t generation, v1::StepResult* result);
  void SetHealth(std::string detail);
  void SetStats(const WorkerStats& stats);
  // Starts a new generation: cancels the active stream, whose steps no longer run.
  void CancelActiveStream();
  // Starts the thread that Stop()s the server (once).
  void StopSoon();

  // Model work (loading, which packs the GEMM weights on the OpenMP pool, and steps): on the CPU
  // on compute_, so that one OpenMP team serves it all (kernels/cpu/thread_pool.h); on cuda on
  // the calling thread, whose device context is current.
  void RunModelWork(const std::function<void()>& fn);

  const WorkerServerOptions options_;
  TensorDevice device_;  // options_.device, parsed by Start()
  cpu::ComputeThread compute_;

  // The model, the group and the cache: Init, ProfileMemory, InitCache and steps.
  absl::Mutex mu_;
  // cuda: the stream and handles, created at the first Init and kept (the model's weights
  // stay on the device across Inits that keep the model).
  std::unique_ptr<DeviceContext> context_ ABSL_GUARDED_BY(mu_);
  ModelKey model_key_ ABSL_GUARDED_BY(mu_);
  // Stable address the model keeps; Init swaps the Gloo communicator behind it.
  std::unique_ptr<ReboundCommunicator> comm_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<LlamaModel> model_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<CacheEngine> cache_ ABSL_GUARDED_BY(mu_);
#ifdef LLM_WITH_CUDA
  // cuda: sampling on the device, sized at Init (max_num_seqs rows) before memory is profiled.
  // Only in a worker built with CUDA, where its destructor (device_sampler.cc) exists.
  std::unique_ptr<DeviceSampler> device_sampler_ ABSL_GUARDED_BY(mu_);
#endif
  std::unique_ptr<ModelRunner> runner_ ABSL_GUARDED_BY(mu_);
  // Structured outputs: the grammars compiled against the model's vocabulary (read from its
  // tokenizer in the background when the model is loaded; if that fails, requests with a
  // structured output fail their step with its error).
  std::shared_ptr<structured::GrammarCache> grammars_ ABSL_GUARDED_BY(mu_);
  bool initialized_ ABSL_GUARDED_BY(mu_) = false;  // Init succeeded (and nothing broke since)
  int max_num_seqs_ ABSL_GUARDED_BY(mu_) = 0;
  int max_num_batched_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int max_model_len_ ABSL_GUARDED_BY(mu_) = 0;
  DType kv_cache_dtype_ ABSL_GUARDED_BY(mu_) = DType::kF32;

  // The state Health reports, apart from mu_ so that Health never waits for a step.
  absl::Mutex health_mu_;
  std::string detail_ ABSL_GUARDED_BY(health_mu_) = "not initialized";
  std::optional<WorkerStats> stats_ ABSL_GUARDED_BY(health_mu_);  // as of the last step

  // The one active Step stream.
  absl::Mutex stream_mu_;
  grpc::ServerContext* active_stream_ ABSL_GUARDED_BY(stream_mu_) = nullptr;
  bool active_stream_cancelled_ ABSL_GUARDED_BY(stream_mu_) = false;
  // Counts Inits. A stream belongs to the generation it opened in; Init moves on to the next
  // before it waits for mu_, so that no step of an older stream runs on the new group.
  uint64_t generation_ ABSL_GUARDED_BY(stream_mu_) = 0;

  // The gRPC server and its stopping.
  absl::Mutex server_mu_;
  std::unique_ptr<grpc::Server> server_;  // set by Start(), then constant
  int port_ = 0;
  bool stopped_ ABSL_GUARDED_BY(server_mu_) = false;
  absl::Mutex stopper_mu_;
  std::thread stopper_ ABSL_GUARDED_BY(stopper_mu_);  // started by the Shutdown rpc
};

}  // namespace llm

#endif  // LLM_WORKER_SERVICE_WORKER_SERVER_H_
