#include "scheduler_service/engine/worker_group.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace llm {

absl::Duration WorkerGroup::RetryDelay(int failed_attempts) {
  const absl::Duration max = absl::Seconds(10);
  absl::Duration delay = absl::Milliseconds(500);
  for (int i = 1; i < failed_attempts && delay < max; ++i) delay *= 2;
  return std::min(delay, max);
}

absl::StatusOr<BlockSpaceManagerConfig> WorkerGroup::CacheFromProfile(
    const BlockSpaceManagerConfig& base, const v1::ProfileMemoryResponse& profile,
    int num_gpu_blocks_override) {
  BlockSpaceManagerConfig cache = base;
  cache.num_gpu_blocks = num_gpu_blocks_override > 0 ? num_gpu_blocks_override
                                                     : static_cast<int>(profile.num_gpu_blocks());
  cache.num_cpu_blocks = static_cast<int>(profile.num_cpu_blocks());
  if (cache.num_gpu_blocks <= 0) {
    return absl::ResourceExhaustedError(
        "the workers have no room for a single KV cache block; raise "
        "--gpu-memory-utilization or --cpu-kv-cache-space");
  }
  RETURN_IF_ERROR(cache.Validate());
  return cache;
}

bool WorkerGroup::IsPermanent(const absl::Status& status) {
  return ShardedWorkerClient::IsPermanent(status.code());
}

WorkerGroup::WorkerGroup(WorkerGroupOptions options) : options_(std::move(options)) {
  CHECK(!options_.addresses.empty());
  CHECK(options_.serve != nullptr);
  CHECK(options_.not_ready != nullptr);
}

WorkerGroup::~WorkerGroup() { Stop(); }

void WorkerGroup::Start() {
  absl::MutexLock lock(&thread_mu_);
  CHECK(!thread_.joinable()) << "WorkerGroup::Start() twice";
  thread_ = std::thread([this] { Run(); });
}

void WorkerGroup::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (client_ != nullptr) client_->Cancel();
  }
  absl::MutexLock lock(&thread_mu_);
  if (thread_.joinable()) thread_.join();
}

bool WorkerGroup::stopping() {
  absl::MutexLock lock(&mu_);
  return stop_;
}

void WorkerGroup::Run() {
  int failed_attempts = 0;  // in a row
  for (int attempt = 1;; ++attempt) {
    if (stopping()) return;
    ShardedWorkerClientOptions client_options;
    client_options.addresses = options_.addresses;
    client_options.cluster_secret = options_.cluster_secret;
    client_options.worker_timeout = options_.worker_timeout;
    client_options.keepalive_time = options_.keepalive_time;
    client_options.keepalive_timeout = options_.keepalive_timeout;
    client_options.on_failure = [this](const absl::Status& s) {
      absl::MutexLock lock(&mu_);
      if (failure_.ok()) failure_ = s;
    };
    absl::StatusOr<std::unique_ptr<ShardedWorkerClient>> client =
        ShardedWorkerClient::Create(std::move(client_options));
    CHECK(client.ok()) << client.status();  // the addresses were checked
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      client_ = client->get();
      failure_ = absl::OkStatus();
    }
    if (absl::Status formed = Form(client->get(), attempt); !formed.ok()) {
      {
        absl::MutexLock lock(&mu_);
        client_ = nullptr;
      }
      client->reset();
      LOG(WARNING) << "worker group attempt " << attempt << " failed: " << formed;
      last_failure_ = std::string(formed.message());
      options_.not_ready(last_failure_);
      if (options_.on_permanent_failure != nullptr && IsPermanent(formed)) {
        LOG(ERROR) << "the workers refuse this configuration; retrying cannot help: " << formed;
        options_.on_permanent_failure(formed);
        return;
      }
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; };
      mu_.AwaitWithTimeout(absl::Condition(&stop), RetryDelay(++failed_attempts));
      continue;
    }
    failed_attempts = 0;
    // The engine over the group: it owns the client, which stays valid (client_) while held.
    std::shared_ptr<ServingEngine> engine = options_.serve(std::move(*client), cache_);
    LOG(INFO) << "worker group ready (attempt " << attempt << "): " << cache_.num_gpu_blocks
              << " device blocks, " << cache_.num_cpu_blocks << " host blocks"
              << (cache_.sliding_window > 0
                      ? absl::StrCat("; every layer attends through a window of ",
                                     cache_.sliding_window,
                                     " positions: the blocks before it are given back")
                      : "");
    const std::string reason = ServeUntilDown();
    if (!stopping()) LOG(ERROR) << "worker group failed; re-initializing: " << reason;
    last_failure_ = reason;
    options_.not_ready(reason);
    {
      absl::MutexLock lock(&mu_);
      client_->Cancel();  // an engine step in flight returns at once
      client_ = nullptr;
    }
    engine.reset();  // stops the engine, then closes the streams (unless the server holds it)
  }
}

std::string WorkerGroup::ServeUntilDown() {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !failure_.ok(); };
  // Probe the ranks while idle too, so that a dead worker is noticed before a request finds it.
  while (!mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(1))) {
    ShardedWorkerClient* client = client_;
    mu_.Unlock();
    (void)client->CheckHealth();  // on failure, on_failure sets failure_
    mu_.Lock();
  }
  return stop_ ? "server shutting down" : std::string(failure_.message());
}

absl::Status WorkerGroup::Form(ShardedWorkerClient* client, int attempt) {
  options_.not_ready(
      absl::StrCat("connecting to the workers (attempt ", attempt, ")",
                   last_failure_.empty() ? "" : "; the last attempt failed: ", last_failure_));
  std::string reason;
  RETURN_IF_ERROR(client->WaitUntilHealthy(&reason));
  LOG(INFO) << "all " << client->world_size() << " workers answer; initializing (attempt "
            << attempt << ")";
  v1::InitRequest init;
  init.set_model_path(options_.model_path);
  init.set_dtype(options_.dtype);
  init.set_kv_cache_dtype(options_.kv_cache_dtype);
  init.set_enforce_eager(options_.enforce_eager);
  init.set_device(options_.device);
  init.set_rendezvous_address(options_.rendezvous_address);
  init.set_rendezvous_prefix(absl::StrCat("group-", attempt));
  if (options_.on_rendezvous != nullptr) {
    options_.on_rendezvous(absl::StrCat(init.rendezvous_prefix(), "/"));
  }
  init.set_collective_timeout_ms(options_.collective_timeout_ms);
  init.set_max_model_len(options_.max_model_len);
  init.set_max_num_batched_tokens(options_.max_num_batched_tokens);
  init.set_max_num_seqs(options_.max_num_seqs);
  ASSIGN_OR_RETURN(const std::vector<v1::InitResponse> inits, client->Init(init));
  if (!inits.empty() && !inits[0].collectives().empty()) {
    LOG(INFO) << "worker group collectives: " << inits[0].collectives();
  }
  for (size_t r = 0; r < inits.size(); ++r) {
    if (static_cast<int>(inits[r].vocab_size()) != options_.vocab_size) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker rank ", r, " at ", client->address(static_cast<int>(r)),
                       " loaded a model of vocab size ", inits[r].vocab_size(),
                       "; the scheduler's model has ", options_.vocab_size));
    }
    if (inits[r].kv_window() != inits[0].kv_window()) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker rank ", r, " at ", client->address(static_cast<int>(r)),
                       " attends through a window of ", inits[r].kv_window(),
                       " positions; rank 0 through ", inits[0].kv_window(), " (0: none)"));
    }
  }
  const int kv_window = inits.empty() ? 0 : static_cast<int>(inits[0].kv_window());
  v1::ProfileMemoryRequest profile;
  profile.set_block_size(options_.cache.block_size);
  profile.set_gpu_memory_utilization(options_.gpu_memory_utilization);
  profile.set_swap_space_gib(options_.swap_space_gib);
  profile.set_cpu_kv_cache_space_gib(options_.cpu_kv_cache_space_gib);
  ASSIGN_OR_RETURN(const v1::ProfileMemoryResponse memory, client->ProfileMemory(profile));
  absl::StatusOr<BlockSpaceManagerConfig> cache =
      CacheFromProfile(options_.cache, memory, options_.num_gpu_blocks_override);
  if (absl::IsResourceExhausted(cache.status())) {
    // The ranks' memory with these flags: the same at every attempt.
    return absl::FailedPreconditionError(cache.status().message());
  }
  if (!cache.ok()) return cache.status();
  cache_ = *cache;
  cache_.sliding_window = kv_window;
  v1::InitCacheRequest init_cache;
  init_cache.set_block_size(cache_.block_size);
  init_cache.set_num_gpu_blocks(cache_.num_gpu_blocks);
  init_cache.set_num_cpu_blocks(cache_.num_cpu_blocks);
  RETURN_IF_ERROR(client->InitCache(init_cache));
  return client->OpenStreams();
}

}  // namespace llm
