#include "worker_service/worker_server.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <new>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/model_config.h"
#include "common/tcp_store.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "protocol/step_codec.h"
#include "worker_service/cache_engine.h"
#include "worker_service/kv_cache_sizing.h"
#include "worker_service/model/llama.h"
#include "worker_service/model_runner.h"
#include "worker_service/parallel/gloo_communicator.h"
#include "worker_service/parallel/rebound_communicator.h"
#include "worker_service/parallel/shm_communicator.h"

namespace llm {

namespace {

using Clock = std::chrono::steady_clock;

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status CheckDevice(const std::string& device) {
  if (device == "cpu") return absl::OkStatus();
  if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
    return absl::InvalidArgumentError("device cuda is not built into this worker");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device \"", device, "\" is not known; this worker serves \"cpu\""));
}

// "host:port" -> (host, port).
absl::Status ParseHostPort(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), port) || *port <= 0 || *port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous_address \"", address, "\" is not HOST:PORT"));
  }
  *host = address.substr(0, colon);
  return absl::OkStatus();
}

}  // namespace

WorkerServer::WorkerServer(WorkerServerOptions options) : options_(std::move(options)) {}

WorkerServer::~WorkerServer() {
  Stop();
  absl::MutexLock lock(&stopper_mu_);
  if (stopper_.joinable()) stopper_.join();
}

absl::Status WorkerServer::Start() {
  if (absl::Status s = CheckDevice(options_.device); !s.ok()) return s;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(options_.host, ":", options_.port),
                           grpc::InsecureServerCredentials(), &port_);
  builder.RegisterService(this);
  // Step messages of a long prompt batch can be large.
  builder.SetMaxReceiveMessageSize(std::numeric_limits<int>::max());
  builder.SetMaxSendMessageSize(std::numeric_limits<int>::max());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    server_.reset();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options_.host, ":", options_.port));
  }
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health != nullptr) {
    health->SetServingStatus(true);
    health->SetServingStatus(v1::WorkerService::service_full_name(), true);
  }
  return absl::OkStatus();
}

void WorkerServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

void WorkerServer::Stop(absl::Duration grace) {
  absl::MutexLock lock(&server_mu_);
  if (server_ == nullptr || stopped_) return;
  stopped_ = true;
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(grace));
}

void WorkerServer::SetHealth(std::string detail) {
  absl::MutexLock lock(&health_mu_);
  detail_ = std::move(detail);
}

void WorkerServer::CancelActiveStream() {
  absl::MutexLock lock(&stream_mu_);
  ++generation_;
  if (active_stream_ != nullptr && !active_stream_cancelled_) {
    active_stream_->TryCancel();
    active_stream_cancelled_ = true;
  }
}

grpc::Status WorkerServer::Init(grpc::ServerContext*, const v1::InitRequest* request,
                                v1::InitResponse* response) {
  CancelActiveStream();
  absl::MutexLock lock(&mu_);
  const absl::Status s = DoInit(*request, response);
  if (!s.ok()) SetHealth(absl::StrCat("not initialized: Init failed: ", s.message()));
  return ToGrpc(s);
}

absl::Status WorkerServer::DoInit(const v1::InitRequest& request, v1::InitResponse* response) {
  // Whatever happens next, the old group, requests and cache are gone.
  initialized_ = false;
  runner_.reset();
  cache_.reset();
  if (comm_ != nullptr) comm_->Rebind(nullptr);
  SetHealth("not initialized: Init in progress");

  if (absl::Status s = CheckDevice(request.device().empty() ? "cpu" : request.device()); !s.ok()) {
    return s;
  }
  const std::string dtype = request.dtype().empty() ? "float32" : request.dtype();
  if (dtype != "float32") {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype ", dtype, " is not supported on device cpu (the CPU model computes in float32)"));
  }
  // Both become ints below: a world_size past INT_MAX would turn negative (and pass as 1).
  if (request.world_size() < 1 ||
      request.world_size() > static_cast<uint32_t>(std::numeric_limits<int>::max()) ||
      request.rank() >= request.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", request.rank(), " of world_size ",
                                                   request.world_size(), " is out of range"));
  }
  if (request.model_path().empty()) return absl::InvalidArgumentError("model_path is empty");
  const int rank = static_cast<int>(request.rank());
  const int world = static_cast<int>(request.world_size());
  const std::chrono::milliseconds timeout(
      request.collective_timeout_ms() > 0 ? request.collective_timeout_ms() : 30000);

  // The group: a fresh communicator for every Init (world_size 1 needs none). Shared memory
  // when every rank can map one segment (one host) and none declines (--shm-collectives=
  // false), Gloo otherwise; every rank learns the same outcome from ShmCommunicator::Create,
  // so all take the same path.
  std::unique_ptr<Communicator> group;
  if (world > 1) {
    std::string host;
    int port = 0;
    if (absl::Status s = ParseHostPort(request.rendezvous_address(), &host, &port); !s.ok()) {
      return s;
    }
    absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Connect(host, port, timeout);
    if (!store.ok()) return store.status();
    const std::string prefix =
        request.rendezvous_prefix().empty() ? "llm" : request.rendezvous_prefix();
    {
      ShmOptions shm_options;
      shm_options.directory = options_.shm_directory;
      shm_options.prefix = prefix + "/shm";
      shm_options.timeout = timeout;
      shm_options.enabled = options_.shm_collectives;  // off: decline, for the group's sake
      absl::StatusOr<std::unique_ptr<ShmCommunicator>> shm =
          ShmCommunicator::Create(**store, rank, world, shm_options);
      if (shm.ok()) {
        group = std::move(*shm);
        response->set_collectives("shm");
      } else if (!absl::IsFailedPrecondition(shm.status())) {
        return shm.status();
      }
    }
    if (group == nullptr) {
      GlooOptions gloo_options;
      gloo_options.hostname = options_.peer_host;
      gloo_options.prefix = prefix;
      gloo_options.timeout = timeout;
      absl::StatusOr<std::unique_ptr<GlooCommunicator>> created =
          GlooCommunicator::Create(**store, rank, world, gloo_options);
      if (!created.ok()) return created.status();
      group = std::move(*created);
      response->set_collectives("gloo");
    }
  }

  // The model: reloaded only when what it was loaded for changed.
  const ModelKey key{request.model_path(), dtype, rank, world};
  absl::StatusOr<ModelConfig> config = ModelConfig::FromModelDir(request.model_path());
  if (!config.ok()) return config.status();
  if (model_ == nullptr || !(model_key_ == key)) {
    model_.reset();
    comm_ = world > 1 ? std::make_unique<ReboundCommunicator>(rank, world) : nullptr;
    absl::StatusOr<std::unique_ptr<LlamaModel>> model =
        LlamaModel::Load(request.model_path(), *config, comm_.get());
    if (!model.ok()) return model.status();
    model_ = std::move(*model);
    model_key_ = key;
  }
  if (comm_ != nullptr) comm_->Rebind(std::move(group));

  max_num_seqs_ = static_cast<int>(request.max_num_seqs());
  response->set_vocab_size(static_cast<uint32_t>(config->vocab_size));
  response->set_max_position_embeddings(static_cast<uint32_t>(config->max_position_embeddings));
  initialized_ = true;
  SetHealth("not initialized: no KV cache yet (InitCache)");
  return absl::OkStatus();
}

grpc::Status WorkerServer::ProfileMemory(grpc::ServerContext*,
                                         const v1::ProfileMemoryRequest* request,
                                         v1::ProfileMemoryResponse* response) {
  absl::MutexLock lock(&mu_);
  if (!initialized_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "ProfileMemory before Init: the worker has no model");
  }
  if (request->block_size() < 1) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "block_size must be at least 1");
  }
  const double kv = request->cpu_kv_cache_space_gib();
  const double swap = request->swap_space_gib();
  if (!std::isfinite(kv) || kv < 0 || !std::isfinite(swap) || swap < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("cpu_kv_cache_space_gib (", kv, ") and swap_space_gib (", swap,
                                     ") must be finite and >= 0"));
  }
  const CacheShape shape{model_->num_layers(), model_->num_local_kv_heads(), model_->head_dim(),
                         static_cast<int>(request->block_size())};
  const uint64_t bytes = CacheEngine::BytesPerBlock(shape);
  response->set_bytes_per_block(bytes);
  response->set_num_gpu_blocks(BlocksInGib(kv, bytes));
  response->set_num_cpu_blocks(BlocksInGib(swap, bytes));
  return grpc::Status::OK;
}

grpc::Status WorkerServer::InitCache(grpc::ServerContext*, const v1::InitCacheRequest* request,
                                     v1::InitCacheResponse*) {
  absl::MutexLock lock(&mu_);
  if (!initialized_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "InitCache before Init: the worker has no model");
  }
  const uint32_t max_blocks = std::numeric_limits<int32_t>::max();
  if (request->block_size() < 1 || request->num_gpu_blocks() < 1 ||
      request->num_gpu_blocks() > max_blocks || request->num_cpu_blocks() > max_blocks) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("InitCache: block_size ", request->block_size(), ", num_gpu_blocks ",
                     request->num_gpu_blocks(), ", num_cpu_blocks ", request->num_cpu_blocks(),
                     ": block_size and num_gpu_blocks must be at least 1"));
  }
  runner_.reset();
  cache_.reset();
  const CacheShape shape{model_->num_layers(), model_->num_local_kv_heads(), model_->head_dim(),
                         static_cast<int>(request->block_size())};
  try {
    // CacheEngine needs at least one host block; an unused one costs one block of memory.
    cache_ = std::make_unique<CacheEngine>(shape, static_cast<int>(request->num_gpu_blocks()),
                                           std::max<int>(1, request->num_cpu_blocks()));
  } catch (const std::bad_alloc&) {
    SetHealth("not initialized: the KV cache did not fit in memory");
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("InitCache: ", request->num_gpu_blocks(), " + ", request->num_cpu_blocks(),
                     " blocks of ", CacheEngine::BytesPerBlock(shape),
                     " bytes do not fit in memory"));
  }
  runner_ = std::make_unique<ModelRunner>(model_.get(), cache_.get());
  SetHealth("ready");
  return grpc::Status::OK;
}

void WorkerServer::RunStep(const v1::StepRequest& request, uint64_t generation,
                           v1::StepResult* result) {
  const Clock::time_point arrival = Clock::now();
  result->Clear();
  absl::Status status;
  double forward_seconds = 0;
  {
    absl::MutexLock lock(&mu_);
    bool stale = false;
    {
      absl::MutexLock stream_lock(&stream_mu_);
      stale = generation != generation_;
    }
    if (stale) {
      status = absl::FailedPreconditionError(absl::StrCat(
          "step ", request.step_id(), ": the worker was re-initialized after this stream opened"));
    } else if (!initialized_ || runner_ == nullptr) {
      status = absl::FailedPreconditionError(absl::StrCat(
          "step ", request.step_id(), ": the worker is not initialized (Init, then InitCache)"));
    } else {
      SamplingLimits limits;
      limits.max_n = std::max(1, max_num_seqs_);
      limits.max_logprobs = model_->vocab_size();
      DecodedStep decoded;
      status = DecodeStepRequest(request, limits, &decoded);
      ModelOutput output;
      if (status.ok()) {
        const Clock::time_point t0 = Clock::now();
        status = runner_->Execute(decoded.output, &output);
        forward_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      }
      if (status.ok()) {
        // Every rank samples the same way; only rank 0's tokens (and logprobs) travel.
        if (model_key_.rank != 0) {
          output.sampled_token_ids.clear();
          output.logprobs.clear();
        }
        EncodeStepResult(output, result);
      } else if (status.code() != absl::StatusCode::kInvalidArgument) {
        // Failed inside the model or a collective: the cache or the group may be broken.
        initialized_ = false;
        runner_.reset();
        cache_.reset();
        SetHealth(absl::StrCat("not initialized: step ", request.step_id(),
                               " failed: ", status.message()));
      }
    }
  }
  result->set_step_id(request.step_id());
  if (!status.ok()) {
    result->set_error_code(static_cast<int32_t>(status.code()));
    // Every message names the step (the runner's already do).
    const std::string message(status.message());
    result->set_error_message(message.rfind("step ", 0) == 0
                                  ? message
                                  : absl::StrCat("step ", request.step_id(), ": ", message));
  }
  result->set_forward_seconds(forward_seconds);
  result->set_step_seconds(std::chrono::duration<double>(Clock::now() - arrival).count());
}

grpc::Status WorkerServer::Step(grpc::ServerContext* context,
                                grpc::ServerReaderWriter<v1::StepResult, v1::StepRequest>* stream) {
  uint64_t generation = 0;
  {
    absl::MutexLock lock(&stream_mu_);
    // A stream Init cancelled is on its way out: wait for it (it ends at its next read, or
    // after the step it is running).
    auto cancelled_gone = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(stream_mu_) {
      return active_stream_ == nullptr || !active_stream_cancelled_;
    };
    stream_mu_.Await(absl::Condition(&cancelled_gone));
    if (active_stream_ != nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "another Step stream is active on this worker; one at a time");
    }
    active_stream_ = context;
    active_stream_cancelled_ = false;
    generation = generation_;
  }
  v1::StepRequest request;
  v1::StepResult result;
  while (stream->Read(&request)) {
    RunStep(request, generation, &result);
    if (!stream->Write(result)) break;
  }
  absl::MutexLock lock(&stream_mu_);
  active_stream_ = nullptr;
  active_stream_cancelled_ = false;
  return grpc::Status::OK;
}

grpc::Status WorkerServer::Health(grpc::ServerContext*, const v1::HealthRequest*,
                                  v1::HealthResponse* response) {
  absl::MutexLock lock(&health_mu_);
  response->set_serving(true);
  response->set_detail(detail_);
  return grpc::Status::OK;
}

void WorkerServer::StopSoon() {
  // grpc::Server::Shutdown must not run on a gRPC thread: stop from a thread of our own. No
  // grace: the Shutdown call is complete, and any other rpc (a Step stream) ends now rather than
  // at the deadline (measured: with a grace, Shutdown() begun from OnDone() waits all of it).
  absl::MutexLock lock(&stopper_mu_);
  if (!stopper_.joinable()) stopper_ = std::thread([this] { Stop(absl::ZeroDuration()); });
}

grpc::ServerUnaryReactor* WorkerServer::Shutdown(grpc::CallbackServerContext*,
                                                 const v1::ShutdownRequest*,
                                                 v1::ShutdownResponse*) {
  // Answers at once; OnDone() runs when the answer has been delivered (or the call failed).
  class Reactor : public grpc::ServerUnaryReactor {
   public:
    explicit Reactor(WorkerServer* server) : server_(server) { Finish(grpc::Status::OK); }
    void OnDone() override {
      server_->StopSoon();
      delete this;
    }

   private:
    WorkerServer* server_;
  };
  return new Reactor(this);
}

}  // namespace llm
