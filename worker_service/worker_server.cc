#include "worker_service/worker_server.h"

#include <malloc.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <future>
#include <limits>
#include <new>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/grpc_security.h"
#include "common/model_config.h"
#include "common/status_macros.h"
#include "common/tcp_store.h"
#include "glog/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "protocol/step_codec.h"
#include "scheduler_service/tokenizer/grammar_vocabulary.h"
#include "worker_service/cache_engine.h"
#include "worker_service/kv_cache_sizing.h"
#include "worker_service/model/llama.h"
#include "worker_service/model_runner.h"
#include "worker_service/model_warmup.h"
#include "worker_service/parallel/gloo_communicator.h"
#include "worker_service/parallel/rebound_communicator.h"
#include "worker_service/parallel/shm_communicator.h"
#ifdef LLM_WITH_CUDA
#include "worker_service/device_sampler.h"
#include "worker_service/parallel/nccl_communicator.h"
#endif

namespace llm {

namespace {

using Clock = std::chrono::steady_clock;

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace

absl::StatusOr<TensorDevice> ParseWorkerDevice(const std::string& device) {
  if (device == "cpu") return TensorDevice::Cpu();
  if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
#ifndef LLM_WITH_CUDA
    return absl::InvalidArgumentError(
        "device cuda is not built into this worker (no CUDA toolkit at build time)");
#endif
    int ordinal = 0;
    if (device.size() > 4 &&
        (!absl::SimpleAtoi(device.substr(5), &ordinal) || ordinal < 0 || ordinal > 1023)) {
      return absl::InvalidArgumentError(
          absl::StrCat("device \"", device, "\": expected cuda or cuda:N"));
    }
    return TensorDevice::Cuda(ordinal);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device \"", device, "\" is not known (cpu, cuda or cuda:N)"));
}

namespace {

// InitResponse.kv_window: how many positions back, the newest included, any layer can still
// read the KV cache. The sliding window when every layer has it; 0 (no limit) when some layer
// sees the whole context. The scheduler gives back the blocks before it.
int KvWindow(const ModelConfig& c) {
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.IsSlidingLayer(l)) return 0;
  }
  return c.sliding_window;
}

// The KV cache's dtype from InitRequest.kv_cache_dtype for a model of `model` dtype.
absl::StatusOr<DType> ParseKvCacheDType(const std::string& name, DType model,
                                        const TensorDevice& device) {
  // auto: the model's dtype, as vLLM's: on cpu a bf16 model keeps bf16 keys and values (the
  // attention widens them to f32 as it reads them), which halves the bytes a decode step
  // reads from the cache; an f32 model keeps f32.
  if (name.empty() || name == "auto") return model;
  // bf16 asked for on a cpu: any cpu, whatever its GEMMs. The cache only stores bf16 (f32
  // rounded to nearest even) and the attention widens it, in AVX-512, AVX2 or portable code.
  if (device.is_cpu() && (name == "bfloat16" || name == "bf16")) return DType::kBF16;
  absl::StatusOr<DType> d = ParseModelDType(name, device);
  if (!d.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("kv_cache_dtype: ", d.status().message()));
  }
  return d;
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

void WorkerServer::RunModelWork(const std::function<void()>& fn) {
  if (device_.is_cpu()) {
    compute_.Run(fn);
  } else {
    fn();
  }
}

absl::Status WorkerServer::Start() {
  absl::StatusOr<TensorDevice> device = ParseWorkerDevice(options_.device);
  if (!device.ok()) return device.status();
  device_ = *device;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(options_.host, ":", options_.port),
                           grpc::InsecureServerCredentials(), &port_);
  builder.RegisterService(this);
  // Step messages of a long prompt batch can be large.
  builder.SetMaxReceiveMessageSize(std::numeric_limits<int>::max());
  builder.SetMaxSendMessageSize(std::numeric_limits<int>::max());
  // The scheduler's channels send keepalive PINGs every few seconds, also between steps (no
  // data) and before the first call: accept them rather than answer GOAWAY "too_many_pings".
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 100);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);  // never GOAWAY for pings
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

void WorkerServer::SetStats(const WorkerStats& stats) {
  absl::MutexLock lock(&health_mu_);
  stats_ = stats;
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

grpc::Status WorkerServer::Init(grpc::ServerContext* context, const v1::InitRequest* request,
                                v1::InitResponse* response) {
  if (grpc::Status s = CheckClusterSecret(*context, options_.cluster_secret); !s.ok()) return s;
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
#ifdef LLM_WITH_CUDA
  device_sampler_.reset();
#endif
  if (comm_ != nullptr) comm_->Rebind(nullptr);
  SetHealth("not initialized: Init in progress");
  {
    absl::MutexLock lock(&health_mu_);
    stats_.reset();
  }

  // The worker's --device decides the device; the scheduler's must be of the same kind.
  const std::string asked = request.device().empty() ? options_.device : request.device();
  absl::StatusOr<TensorDevice> asked_device = ParseWorkerDevice(asked);
  if (!asked_device.ok()) return asked_device.status();
  if (asked_device->type != device_.type) {
    return absl::InvalidArgumentError(absl::StrCat("the scheduler asks for device ", asked,
                                                   "; this worker serves ", options_.device,
                                                   " (its --device)"));
  }
  const std::string dtype = request.dtype().empty() ? "auto" : request.dtype();
  absl::StatusOr<DType> model_dtype = ParseModelDType(dtype, device_);
  if (!model_dtype.ok()) return model_dtype.status();
  absl::StatusOr<DType> kv_dtype =
      ParseKvCacheDType(request.kv_cache_dtype(), *model_dtype, device_);
  if (!kv_dtype.ok()) return kv_dtype.status();
  if (device_.is_cuda() && context_ == nullptr) {
    absl::StatusOr<std::unique_ptr<DeviceContext>> context = DeviceContext::Create(device_);
    if (!context.ok()) return context.status();
    context_ = std::move(*context);
  }
  if (context_ != nullptr) {
    if (absl::Status s = context_->MakeCurrent(); !s.ok()) return s;
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
    absl::StatusOr<std::unique_ptr<TcpStore>> store =
        TcpStore::Connect(host, port, timeout, options_.cluster_secret);
    if (!store.ok()) return store.status();
    const std::string prefix =
        request.rendezvous_prefix().empty() ? "llm" : request.rendezvous_prefix();
    if (device_.is_cuda()) {
      absl::StatusOr<std::unique_ptr<Communicator>> nccl =
          JoinNcclGroup(**store, prefix, rank, world, timeout, response);
      if (!nccl.ok()) return nccl.status();
      group = std::move(*nccl);
    } else {
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
    if (group == nullptr && device_.is_cpu()) {
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
  const ModelKey key{request.model_path(), DTypeName(*model_dtype), rank, world};
  absl::StatusOr<ModelConfig> config = ModelConfig::FromModelDir(request.model_path());
  if (!config.ok()) return config.status();
  if (model_ == nullptr || !(model_key_ == key)) {
    model_.reset();
    comm_ = world > 1 ? std::make_unique<ReboundCommunicator>(rank, world) : nullptr;
    absl::StatusOr<std::unique_ptr<LlamaModel>> model = absl::InternalError("not loaded");
    RunModelWork([&] {
      model = LlamaModel::Load(request.model_path(), *config, comm_.get(),
                               {context_.get(), *model_dtype, options_.quantized_weights});
    });
    if (!model.ok()) return model.status();
    model_ = std::move(*model);
    model_key_ = key;
    // Structured outputs' vocabulary, read from the model's tokenizer beside the rest of the
    // start-up (seconds for a 262k-token vocabulary): a request with a structured output that
    // comes before it is ready waits for it in its first step.
    grammars_ = std::make_shared<structured::GrammarCache>(
        std::async(std::launch::async, [path = request.model_path(),
                                        vocab_size = config->vocab_size]() {
          const absl::Time start = absl::Now();
          absl::StatusOr<std::shared_ptr<const structured::TokenizerInfo>> vocabulary =
              LoadGrammarVocabulary(path, vocab_size);
          if (vocabulary.ok()) {
            LOG(INFO) << "structured outputs: the vocabulary's " << (*vocabulary)->num_tokens()
                      << " tokens read in " << absl::FormatDuration(absl::Now() - start);
          } else {
            LOG(WARNING) << "structured outputs are off on this worker: "
                         << vocabulary.status().message();
          }
          // Reading it freed a whole tokenizer into malloc's arenas.
          malloc_trim(0);
          return vocabulary;
        }).share());
    // Loading freed its temporaries (dequantized and unpacked tensors) into malloc's arenas,
    // which keep them resident; give those pages back before serving.
    malloc_trim(0);
  }
  if (comm_ != nullptr) comm_->Rebind(std::move(group));
  kv_cache_dtype_ = *kv_dtype;
  max_model_len_ = static_cast<int>(std::min<uint32_t>(
      request.max_model_len() > 0 ? request.max_model_len() : config->max_position_embeddings,
      1u << 24));
  max_num_batched_tokens_ = static_cast<int>(std::min<uint32_t>(
      request.max_num_batched_tokens() > 0 ? request.max_num_batched_tokens() : 2048, 1u << 24));
  max_num_seqs_ = static_cast<int>(request.max_num_seqs());
  if (device_.is_cuda()) {
    if (absl::Status s = PrepareCudaServing(request.enforce_eager()); !s.ok()) return s;
  } else {
    // The activations and GEMM scratch of the largest step, on the thread that runs the steps
    // (the scratch is its OpenMP team's): grown step by step instead, every step larger than
    // those before would reallocate them, leaving the old buffers resident in malloc's heap.
    absl::Status reserved;
    RunModelWork([&] {
      reserved = model_->Reserve(max_num_batched_tokens_, std::max(1, max_num_seqs_),
                                 std::max(1, max_model_len_));
    });
    if (!reserved.ok()) return reserved;
  }

  response->set_vocab_size(static_cast<uint32_t>(config->vocab_size));
  response->set_max_position_embeddings(static_cast<uint32_t>(config->max_position_embeddings));
  response->set_kv_window(static_cast<uint32_t>(KvWindow(*config)));
  initialized_ = true;
  SetHealth("not initialized: no KV cache yet (InitCache)");
  return absl::OkStatus();
}

absl::Status WorkerServer::PrepareCudaServing(bool enforce_eager) {
#ifdef LLM_WITH_CUDA
  const int max_seqs = std::max(1, max_num_seqs_);
  // The activation buffers of the largest step, before memory is profiled.
  RETURN_IF_ERROR(model_->Reserve(max_num_batched_tokens_, max_seqs, max_model_len_));
  // Decode steps replay CUDA graphs, one per padded batch size up to max_num_seqs (at most
  // kMaxGraphBatch, as vLLM's largest capture size), unless the scheduler asks for eager steps.
  model_->EnableCudaGraphs(enforce_eager ? 0 : std::min(max_seqs, kMaxGraphBatch));
  // Sampling on the device: one row per sequence of a step; logprobs as RunStep's limit.
  DeviceSampler::Options so;
  so.device = device_.ordinal;
  so.max_rows = max_seqs;
  so.vocab_size = model_->vocab_size();
  so.max_logprobs = MaxLogprobs();
  absl::StatusOr<std::unique_ptr<DeviceSampler>> sampler = DeviceSampler::Create(so);
  if (!sampler.ok()) {
    return absl::Status(sampler.status().code(),
                        absl::StrCat("the device sampler (", max_seqs, " rows of ", so.vocab_size,
                                     " logits): ", sampler.status().message()));
  }
  device_sampler_ = std::move(*sampler);
  LOG(INFO) << "cuda: sampling on the device (" << max_seqs << " rows); "
            << (model_->cuda_graphs_enabled()
                    ? absl::StrCat("CUDA graphs for decode batches up to ",
                                   model_->max_graph_batch())
                : enforce_eager ? std::string("CUDA graphs off (enforce_eager)")
                                : std::string("CUDA graphs off (the emulated NCCL's collectives "
                                              "cannot be captured)"));
  return absl::OkStatus();
#else
  (void)enforce_eager;
  return absl::InvalidArgumentError("device cuda is not built into this worker");
#endif
}

int WorkerServer::MaxLogprobs() const {
  return device_.is_cuda() ? std::min(model_->vocab_size(), 1024) : model_->vocab_size();
}

absl::StatusOr<std::unique_ptr<Communicator>> WorkerServer::JoinNcclGroup(
    gloo::rendezvous::Store& store, const std::string& prefix, int rank, int world,
    std::chrono::milliseconds timeout, v1::InitResponse* response) {
#ifdef LLM_WITH_CUDA
  // Rank 0 makes the group's id (its process hosts NCCL's bootstrap root) and publishes it
  // under this group's prefix; the others read it there.
  const std::string key = prefix + "/nccl_unique_id";
  std::string id;
  try {
    if (rank == 0) {
      absl::StatusOr<std::string> made = NcclCommunicator::NewUniqueId();
      if (!made.ok()) return made.status();
      id = *made;
      store.set(key, std::vector<char>(id.begin(), id.end()));
      response->set_nccl_unique_id(id);
    } else {
      const std::vector<char> got = store.get(key);
      id.assign(got.begin(), got.end());
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("rank ", rank, ": the NCCL id under \"", key,
                                               "\" did not arrive: ", e.what()));
  }
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> nccl =
      NcclCommunicator::Create(id, rank, world, device_.ordinal, context_->stream(), timeout);
  if (!nccl.ok()) return nccl.status();
  // One wait per step (the model's Synchronize), not one per collective.
  (*nccl)->SetDeferredWait(true);
  response->set_collectives("nccl");
  return std::unique_ptr<Communicator>(std::move(*nccl));
#else
  (void)store, (void)prefix, (void)rank, (void)world, (void)timeout, (void)response;
  return absl::InvalidArgumentError("device cuda is not built into this worker");
#endif
}

DeviceSampler* WorkerServer::device_sampler() const {
#ifdef LLM_WITH_CUDA
  return device_sampler_.get();
#else
  return nullptr;
#endif
}

absl::Status WorkerServer::WarmUpCuda() {
  std::string summary;
  RETURN_IF_ERROR(CaptureDecodeGraphs(*model_, *cache_, &summary));
  LOG(INFO) << "cuda: " << summary
            << "; sampler: " << (device_sampler() != nullptr ? "device" : "host");
  return absl::OkStatus();
}

absl::Status WorkerServer::ProfileCuda(const v1::ProfileMemoryRequest& request,
                                       v1::ProfileMemoryResponse* response) {
  const double utilization = request.gpu_memory_utilization();
  if (!std::isfinite(utilization) || utilization <= 0 || utilization > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu_memory_utilization must be in (0, 1], got ", utilization));
  }
  const int block_size = static_cast<int>(request.block_size());
  const CacheShape shape{model_->num_layers(), model_->num_local_kv_heads(), model_->head_dim(),
                         block_size, kv_cache_dtype_};
  const uint64_t bytes_per_block = CacheEngine::BytesPerBlock(shape);
  RETURN_IF_ERROR(ProfilePeakMemory(*model_, context_.get(), shape,
                                    {.max_num_batched_tokens = max_num_batched_tokens_,
                                     .max_num_seqs = max_num_seqs_,
                                     .max_model_len = max_model_len_}));
  size_t free_bytes = 0, total_bytes = 0;
  if (absl::Status s = context_->MemoryInfo(&free_bytes, &total_bytes); !s.ok()) return s;
  // The graphs were captured over the scratch cache, which is gone: dropped now; InitCache
  // captures them again over the real one (in the memory they held here).
  model_->EnableCudaGraphs(model_->max_graph_batch());
  KvCacheSizingInput sizing;
  sizing.total_device_memory = total_bytes;
  sizing.gpu_memory_utilization = utilization;
  sizing.peak_memory = total_bytes - free_bytes;
  sizing.bytes_per_block = bytes_per_block;
  sizing.block_size = block_size;
  sizing.max_model_len = max_model_len_;
  sizing.swap_space_gib = request.swap_space_gib();
  absl::StatusOr<KvCacheSizing> sized = SizeKvCache(sizing);
  if (!sized.ok()) return sized.status();
  response->set_bytes_per_block(bytes_per_block);
  response->set_num_gpu_blocks(sized->num_gpu_blocks);
  response->set_num_cpu_blocks(sized->num_cpu_blocks);
  return absl::OkStatus();
}

grpc::Status WorkerServer::ProfileMemory(grpc::ServerContext* context,
                                         const v1::ProfileMemoryRequest* request,
                                         v1::ProfileMemoryResponse* response) {
  if (grpc::Status s = CheckClusterSecret(*context, options_.cluster_secret); !s.ok()) return s;
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
  if (device_.is_cuda()) {
    if (absl::Status s = context_->MakeCurrent(); !s.ok()) return ToGrpc(s);
    return ToGrpc(ProfileCuda(*request, response));
  }
  const CacheShape shape{model_->num_layers(), model_->num_local_kv_heads(), model_->head_dim(),
                         static_cast<int>(request->block_size()), kv_cache_dtype_};
  const uint64_t bytes = CacheEngine::BytesPerBlock(shape);
  response->set_bytes_per_block(bytes);
  response->set_num_gpu_blocks(BlocksInGib(kv, bytes));
  response->set_num_cpu_blocks(BlocksInGib(swap, bytes));
  return grpc::Status::OK;
}

grpc::Status WorkerServer::InitCache(grpc::ServerContext* context,
                                     const v1::InitCacheRequest* request, v1::InitCacheResponse*) {
  if (grpc::Status s = CheckClusterSecret(*context, options_.cluster_secret); !s.ok()) return s;
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
                         static_cast<int>(request->block_size()), kv_cache_dtype_};
  if (context_ != nullptr) {
    if (absl::Status s = context_->MakeCurrent(); !s.ok()) return ToGrpc(s);
  }
  absl::StatusOr<std::unique_ptr<CacheEngine>> cache =
      CacheEngine::Create(shape, static_cast<int>(request->num_gpu_blocks()),
                          static_cast<int>(request->num_cpu_blocks()), context_.get());
  if (!cache.ok()) {
    SetHealth("not initialized: the KV cache did not fit in memory");
    return grpc::Status(
        static_cast<grpc::StatusCode>(cache.status().code()),
        absl::StrCat("InitCache: ", request->num_gpu_blocks(), " + ", request->num_cpu_blocks(),
                     " blocks of ", CacheEngine::BytesPerBlock(shape),
                     " bytes: ", cache.status().message()));
  }
  cache_ = std::move(*cache);
  if (device_.is_cuda()) {
    if (absl::Status s = WarmUpCuda(); !s.ok()) {
      cache_.reset();
      SetHealth(absl::StrCat("not initialized: the warm-up failed: ", s.message()));
      return ToGrpc(absl::Status(s.code(), absl::StrCat("InitCache: warm-up: ", s.message())));
    }
  }
  runner_ = std::make_unique<ModelRunner>(model_.get(), cache_.get(), device_sampler(), grammars_);
  SetStats(runner_->stats());
  const WorkerStats::Memory& m = runner_->stats().memory;
  auto mib = [](int64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); };
  LOG(INFO) << "memory: " << mib(m.resident) << " resident; weights " << mib(m.weights)
            << " (coded copies " << mib(m.coded_weights) << "), KV cache " << mib(m.kv_reserved)
            << " reserved (" << mib(m.kv_resident) << " resident), swap " << mib(m.swap_reserved)
            << " (" << mib(m.swap_resident) << " resident), activations " << mib(m.activations);
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
    } else if (absl::Status s = context_ != nullptr ? context_->MakeCurrent() : absl::OkStatus();
               !s.ok()) {
      status = s;
    } else {
      SamplingLimits limits;
      limits.max_n = std::max(1, max_num_seqs_);
      limits.max_logprobs = MaxLogprobs();
      limits.vocab_size = model_->vocab_size();
      DecodedStep decoded;
      status = DecodeStepRequest(request, limits, &decoded);
      ModelOutput output;
      if (status.ok()) {
        const Clock::time_point t0 = Clock::now();
        RunModelWork([&] { status = runner_->Execute(decoded.output, &output); });
        forward_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      }
      if (status.ok()) {
        // Every rank samples the same tokens and appends them to its sequences; only rank 0's
        // tokens (and logprobs, and stats) travel, every rank's digest of them with it. Each
        // rank's Health reports its own stats.
        if (output.worker_stats.has_value()) SetStats(*output.worker_stats);
        const uint64_t digest = SampledTokensDigest(output.sampled_token_ids);
        if (model_key_.rank != 0) {
          output.sampled_token_ids.clear();
          output.logprobs.clear();
          output.worker_stats.reset();
        }
        EncodeStepResult(output, result);
        result->set_sampled_digest(digest);
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
  if (grpc::Status s = CheckClusterSecret(*context, options_.cluster_secret); !s.ok()) return s;
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

grpc::Status WorkerServer::Health(grpc::ServerContext* context, const v1::HealthRequest*,
                                  v1::HealthResponse* response) {
  if (grpc::Status s = CheckClusterSecret(*context, options_.cluster_secret); !s.ok()) return s;
  absl::MutexLock lock(&health_mu_);
  response->set_serving(true);
  response->set_detail(detail_);
  if (stats_.has_value()) EncodeWorkerStats(*stats_, response->mutable_stats());
  return grpc::Status::OK;
}

void WorkerServer::StopSoon() {
  // grpc::Server::Shutdown must not run on a gRPC thread: stop from a thread of our own. No
  // grace: the Shutdown call is complete, and any other rpc (a Step stream) ends now rather than
  // at the deadline (with a grace, Shutdown() begun from OnDone() waits all of it).
  absl::MutexLock lock(&stopper_mu_);
  if (!stopper_.joinable()) stopper_ = std::thread([this] { Stop(absl::ZeroDuration()); });
}

grpc::ServerUnaryReactor* WorkerServer::Shutdown(grpc::CallbackServerContext* context,
                                                 const v1::ShutdownRequest*,
                                                 v1::ShutdownResponse*) {
  if (grpc::Status s = CheckClusterSecret(*context, options_.cluster_secret); !s.ok()) {
    grpc::ServerUnaryReactor* refused = context->DefaultReactor();
    refused->Finish(s);
    return refused;
  }
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
