// A fake llm-worker rank for the scheduler's tests: a WorkerService served in-process on a
// port of its own, that runs each step through a FakeExecutor (sized by InitCache, dropped by
// Init) instead of a model. It can be told to answer every step with an error, or never.
// Thread-safe.
#ifndef LLM_TESTS_TESTING_FAKE_WORKER_H_
#define LLM_TESTS_TESTING_FAKE_WORKER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "llm/v1/worker_service.grpc.pb.h"
#include "protocol/step_codec.h"
#include "tests/testing/fake_executor.h"

namespace llm {

class FakeWorker final : public v1::WorkerService::Service {
 public:
  enum class Mode { kNormal, kError, kSilent };

  FakeWorker(int vocab_size, uint64_t seed, int num_gpu_blocks)
      : vocab_size_(vocab_size), seed_(seed), num_gpu_blocks_(num_gpu_blocks) {}

  void set_mode(Mode m) { mode_ = m; }
  // While paused, steps wait (before running) until resumed.
  void set_paused(bool p) { pause_from_step_ = p ? 0 : INT32_MAX; }
  // Pauses once `steps` more steps have run (until set_paused(false)).
  void pause_after(int steps) { pause_from_step_ = num_steps_ + steps + 1; }
  // The cluster secret the last Init presented ("" when none).
  std::string init_secret() {
    absl::MutexLock lock(&mu_);
    return init_secret_;
  }
  // Init then waits until its call is cancelled (a rank stuck in the rendezvous).
  void set_block_init(bool b) { block_init_ = b; }
  // Init answers this (when not OK) instead of initializing.
  void set_init_error(grpc::Status s) {
    absl::MutexLock lock(&mu_);
    init_error_ = std::move(s);
  }
  int num_cancelled_inits() const { return num_cancelled_inits_; }
  int num_init_calls() const { return num_init_calls_; }
  int num_steps() const { return num_steps_; }
  int num_inits() const { return num_inits_; }
  v1::InitRequest init() {
    absl::MutexLock lock(&mu_);
    return init_;
  }

  // Health then waits until its call is cancelled (a stopped process).
  void set_block_health(bool b) { block_health_ = b; }

  grpc::Status Health(grpc::ServerContext* ctx, const v1::HealthRequest*,
                      v1::HealthResponse* resp) override {
    if (block_health_) {
      while (!ctx->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
      return {grpc::StatusCode::CANCELLED, "cancelled"};
    }
    resp->set_serving(true);
    return grpc::Status::OK;
  }
  grpc::Status Init(grpc::ServerContext* ctx, const v1::InitRequest* req,
                    v1::InitResponse* resp) override {
    ++num_init_calls_;
    if (block_init_) {
      while (!ctx->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
      ++num_cancelled_inits_;
      return {grpc::StatusCode::CANCELLED, "cancelled"};
    }
    absl::MutexLock lock(&mu_);
    if (!init_error_.ok()) return init_error_;
    init_ = *req;
    auto secret = ctx->client_metadata().find("x-llm-cluster-secret");
    init_secret_ = secret == ctx->client_metadata().end()
                       ? std::string()
                       : std::string(secret->second.data(), secret->second.size());
    executor_.reset();
    ++num_inits_;
    resp->set_vocab_size(vocab_size_);
    resp->set_max_position_embeddings(512);
    return grpc::Status::OK;
  }
  grpc::Status ProfileMemory(grpc::ServerContext*, const v1::ProfileMemoryRequest*,
                             v1::ProfileMemoryResponse* resp) override {
    resp->set_num_gpu_blocks(num_gpu_blocks_);
    resp->set_num_cpu_blocks(8);
    resp->set_bytes_per_block(1024);
    return grpc::Status::OK;
  }
  grpc::Status InitCache(grpc::ServerContext*, const v1::InitCacheRequest* req,
                         v1::InitCacheResponse*) override {
    absl::MutexLock lock(&mu_);
    executor_ = std::make_unique<FakeExecutor>(
        FakeExecutorConfig{.num_gpu_blocks = static_cast<int>(req->num_gpu_blocks()),
                           .num_cpu_blocks = static_cast<int>(req->num_cpu_blocks()),
                           .block_size = static_cast<int>(req->block_size()),
                           .vocab_size = vocab_size_,
                           .seed = seed_});
    return grpc::Status::OK;
  }
  grpc::Status Step(grpc::ServerContext*,
                    grpc::ServerReaderWriter<v1::StepResult, v1::StepRequest>* stream) override {
    v1::StepRequest req;
    while (stream->Read(&req)) {
      const int step_number = ++num_steps_;
      while (step_number >= pause_from_step_) absl::SleepFor(absl::Milliseconds(1));
      if (mode_ == Mode::kSilent) continue;  // never answers; ends when the client cancels
      v1::StepResult res;
      absl::Status s;
      if (mode_ == Mode::kError) {
        s = absl::InternalError("injected failure");
      } else {
        DecodedStep step;
        s = DecodeStepRequest(req, SamplingLimits{}, &step);
        ModelOutput out;
        bool rank0 = true;
        if (s.ok()) {
          absl::MutexLock lock(&mu_);
          if (executor_ == nullptr) return {grpc::StatusCode::FAILED_PRECONDITION, "no cache"};
          s = executor_->Execute(step.output, &out);
          rank0 = init_.rank() == 0;
        }
        if (s.ok()) {
          // As llm-worker: every rank reports the digest of what it sampled, rank 0 the tokens.
          const uint64_t digest = SampledTokensDigest(out.sampled_token_ids);
          if (!rank0) out.sampled_token_ids.clear();
          EncodeStepResult(out, &res);
          res.set_sampled_digest(digest);
        }
      }
      if (!s.ok()) {
        res.set_step_id(req.step_id());
        res.set_error_code(static_cast<int>(s.code()));
        res.set_error_message(std::string(s.message()));
      }
      if (!stream->Write(res)) break;
    }
    return grpc::Status::OK;
  }

 private:
  const int vocab_size_;
  const uint64_t seed_;
  const int num_gpu_blocks_;
  std::atomic<Mode> mode_{Mode::kNormal};
  std::atomic<int> pause_from_step_{INT32_MAX};
  std::atomic<int> num_steps_{0};
  std::atomic<int> num_inits_{0};
  std::atomic<bool> block_init_{false};
  std::atomic<bool> block_health_{false};
  std::atomic<int> num_cancelled_inits_{0};
  std::atomic<int> num_init_calls_{0};
  absl::Mutex mu_;
  v1::InitRequest init_ ABSL_GUARDED_BY(mu_);
  std::string init_secret_ ABSL_GUARDED_BY(mu_);
  grpc::Status init_error_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<FakeExecutor> executor_ ABSL_GUARDED_BY(mu_);
};

// A FakeWorker and its server on 127.0.0.1 (port 0: any free port).
struct FakeWorkerServer {
  std::unique_ptr<FakeWorker> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::string address;

  static FakeWorkerServer Start(int vocab_size, uint64_t seed, int num_gpu_blocks, int port = 0) {
    FakeWorkerServer r;
    r.service = std::make_unique<FakeWorker>(vocab_size, seed, num_gpu_blocks);
    grpc::ServerBuilder b;
    b.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                       &r.port);
    b.RegisterService(r.service.get());
    r.server = b.BuildAndStart();
    r.address = absl::StrCat("127.0.0.1:", r.port);
    return r;
  }

  // Stops serving at once (calls in flight are cancelled).
  void Kill() {
    server->Shutdown(std::chrono::system_clock::now());
    server.reset();
  }
};

}  // namespace llm

#endif  // LLM_TESTS_TESTING_FAKE_WORKER_H_
