// WorkerServer over real gRPC: workers started in this process on port 0, driven by real
// clients. The lifecycle answers (Init, ProfileMemory, InitCache, Health), the Step stream's
// rules (before Init, a second stream, rejected steps that leave the stream usable), and the
// end-to-end check: a real scheduler (EngineCore) stepping one worker, or two tensor-parallel
// workers that meet through a TcpStoreServer, generates the same tokens as the in-process
// ModelRunner on the same model.
#include "worker_service/worker_server.h"

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/grpc_security.h"
#include "common/tcp_store.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kernels/cpu/packed_linear.h"
#include "protocol/step_codec.h"
#include "scheduler_service/engine/engine_core.h"
#include "tests/testing/grpc_probe.h"
#include "tests/testing/model_test_util.h"
#include "tests/unit/worker_service/step_test_util.h"
#include "worker_service/cache_engine.h"
#include "worker_service/model_runner.h"

namespace llm {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

using StepStream = grpc::ClientReaderWriter<v1::StepRequest, v1::StepResult>;

// Hang guard only: no test depends on how fast anything is.
constexpr auto kDeadline = std::chrono::seconds(120);

std::string ModelDir() { return std::string(LLM_TEST_DATA_DIR) + "/models/tiny-llama"; }

// One worker in this process with a client of its own.
struct Worker {
  // `secret`: the worker's cluster secret; `client_secret`: what this client presents.
  explicit Worker(bool shm_collectives = true, const std::string& secret = "",
                  const std::string& client_secret = "") {
    WorkerServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    options.shm_collectives = shm_collectives;
    options.cluster_secret = secret;
    server = std::make_unique<WorkerServer>(options);
    const absl::Status s = server->Start();
    EXPECT_TRUE(s.ok()) << s;
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    channel =
        CreateInternalChannel("127.0.0.1:" + std::to_string(server->port()), args, client_secret);
    stub = v1::WorkerService::NewStub(channel);
  }

  std::unique_ptr<grpc::ClientContext> Context() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + kDeadline);
    return ctx;
  }

  grpc::Status Init(const v1::InitRequest& request, v1::InitResponse* response = nullptr) {
    v1::InitResponse ignored;
    return stub->Init(Context().get(), request, response ? response : &ignored);
  }
  grpc::Status ProfileMemory(const v1::ProfileMemoryRequest& request,
                             v1::ProfileMemoryResponse* response) {
    return stub->ProfileMemory(Context().get(), request, response);
  }
  grpc::Status InitCache(int block_size, int num_gpu_blocks, int num_cpu_blocks) {
    v1::InitCacheRequest request;
    request.set_block_size(block_size);
    request.set_num_gpu_blocks(num_gpu_blocks);
    request.set_num_cpu_blocks(num_cpu_blocks);
    v1::InitCacheResponse response;
    return stub->InitCache(Context().get(), request, &response);
  }
  v1::HealthResponse Health() {
    v1::HealthResponse response;
    EXPECT_TRUE(stub->Health(Context().get(), v1::HealthRequest(), &response).ok());
    return response;
  }

  std::unique_ptr<WorkerServer> server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::WorkerService::Stub> stub;
};

// An open Step stream with its context.
struct Stream {
  explicit Stream(Worker& w) {
    ctx.set_deadline(std::chrono::system_clock::now() + kDeadline);
    rw = w.stub->Step(&ctx);
  }
  // Sends one step and reads its answer; false when the stream broke.
  bool RoundTrip(const v1::StepRequest& request, v1::StepResult* result) {
    return rw->Write(request) && rw->Read(result);
  }
  grpc::Status Close() {
    rw->WritesDone();
    return rw->Finish();
  }
  grpc::ClientContext ctx;
  std::unique_ptr<StepStream> rw;
};

v1::InitRequest MakeInit(int rank = 0, int world_size = 1, const std::string& rendezvous = "",
                         const std::string& prefix = "") {
  v1::InitRequest r;
  r.set_model_path(ModelDir());
  r.set_dtype("float32");
  r.set_rank(rank);
  r.set_world_size(world_size);
  r.set_device("cpu");
  r.set_rendezvous_address(rendezvous);
  r.set_rendezvous_prefix(prefix);
  r.set_collective_timeout_ms(60000);
  r.set_max_model_len(512);
  r.set_max_num_batched_tokens(512);
  r.set_max_num_seqs(256);
  return r;
}

// The scheduler's side of the Step streams, reduced to what a test needs: an Executor that
// encodes each step once, writes it to every rank's stream, reads one result per rank, and
// takes the tokens of rank 0.
class StreamExecutor : public Executor {
 public:
  explicit StreamExecutor(std::vector<Worker*> ranks) {
    for (Worker* w : ranks) streams_.push_back(std::make_unique<Stream>(*w));
  }
  ~StreamExecutor() override {
    for (auto& s : streams_) EXPECT_TRUE(s->Close().ok());
  }

  absl::Status Execute(const SchedulerOutput& step, ModelOutput* out) override {
    v1::StepRequest request;
    EncodeStepRequest(step, &request);
    for (auto& s : streams_) {
      if (!s->rw->Write(request)) return absl::UnavailableError("stream write failed");
    }
    std::vector<v1::StepResult> results(streams_.size());
    for (size_t r = 0; r < streams_.size(); ++r) {
      if (!streams_[r]->rw->Read(&results[r])) return absl::UnavailableError("stream broke");
      EXPECT_EQ(results[r].step_id(), request.step_id()) << "rank " << r;
      EXPECT_GE(results[r].step_seconds(), results[r].forward_seconds());
      if (r > 0) {
        EXPECT_EQ(results[r].sampled_token_ids_size(), 0) << "rank " << r;
        EXPECT_EQ(results[r].logprobs_size(), 0) << "rank " << r;
      }
      if (results[r].error_code() != 0) {
        return absl::Status(static_cast<absl::StatusCode>(results[r].error_code()),
                            absl::StrCat("rank ", r, ": ", results[r].error_message()));
      }
    }
    ++steps_;
    return DecodeStepResult(results[0], out);
  }

  int steps() const { return steps_; }

 private:
  std::vector<std::unique_ptr<Stream>> streams_;
  int steps_ = 0;
};

using Outputs = std::map<std::string, std::vector<std::vector<TokenId>>>;

struct EngineSetup {
  int block_size = 4;
  int num_gpu_blocks = 12;  // small: requests are preempted (swapped out and in)
  int num_cpu_blocks = 64;
};

// The golden prompts greedy, plus one sampled request with n = 2 and a seed: runs them to
// completion through `executor` and returns id -> tokens per sequence.
Outputs RunEngine(Executor* executor, const EngineSetup& e, SchedulerStats* stats = nullptr) {
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 512;
  sc.max_model_len = 512;
  sc.preemption_mode = PreemptionMode::kSwap;
  BlockSpaceManagerConfig bc{.block_size = e.block_size,
                             .num_gpu_blocks = e.num_gpu_blocks,
                             .num_cpu_blocks = e.num_cpu_blocks,
                             .watermark = 0.0,
                             .enable_prefix_caching = false};
  EngineCore engine(sc, bc, executor);
  const std::vector<std::vector<TokenId>> prompts = {
      {0, 12, 33, 7, 91, 4}, {0, 5, 5, 17, 200, 31, 8, 9, 10, 11, 12}, {0, 77, 3}};
  Outputs out;
  for (size_t p = 0; p <= prompts.size(); ++p) {
    EngineRequest r;
    r.request_id = "r" + std::to_string(p);
    r.prompt_token_ids = prompts[p % prompts.size()];
    r.sampling_params.ignore_eos = true;
    r.sampling_params.max_tokens = 10;
    if (p == prompts.size()) {  // sampled, forked after the prefill
      r.sampling_params.n = 2;
      r.sampling_params.temperature = 0.9;
      r.sampling_params.seed = 3;
    } else {
      r.sampling_params.temperature = 0;
    }
    const absl::Status s = engine.AddRequest(r, [&out, id = r.request_id](const StreamUpdate& u) {
      ASSERT_TRUE(u.status.ok()) << u.status;
      for (const SequenceOutput& seq : u.outputs->Seqs(*u.output)) {
        auto& tokens = out[id];
        if (static_cast<int>(tokens.size()) <= seq.index) tokens.resize(seq.index + 1);
        const auto t = u.outputs->NewTokenIds(seq);
        tokens[seq.index].insert(tokens[seq.index].end(), t.begin(), t.end());
      }
    });
    EXPECT_TRUE(s.ok()) << s;
  }
  const absl::Status s = engine.RunUntilIdle();
  EXPECT_TRUE(s.ok()) << s;
  if (stats != nullptr) *stats = engine.scheduler().stats();
  return out;
}

// The same requests on an in-process ModelRunner over the model loaded at one rank.
Outputs RunInProcess(const EngineSetup& e) {
  std::unique_ptr<LlamaModel> model;
  LoadTestModel(ModelDir(), &model);
  if (model == nullptr) return {};
  CacheEngine cache(
      {model->num_layers(), model->num_local_kv_heads(), model->head_dim(), e.block_size},
      e.num_gpu_blocks, e.num_cpu_blocks);
  ModelRunner runner(model.get(), &cache);
  return RunEngine(&runner, e);
}

// Greedy requests must match; the sampled one ("r3") too unless `greedy_only` (tensor
// parallel sums in another order, and a seeded draw may fall on the other side of a boundary).
void ExpectSameOutputs(const Outputs& got, const Outputs& want, bool greedy_only = false) {
  ASSERT_EQ(got.size(), 4u);
  ASSERT_EQ(want.size(), 4u);
  for (const auto& [id, seqs] : got) {
    ASSERT_TRUE(want.contains(id)) << id;
    ASSERT_EQ(seqs.size(), want.at(id).size()) << id;
    if (!greedy_only || id != "r3") EXPECT_EQ(seqs, want.at(id)) << "request " << id;
    for (const auto& seq : seqs) EXPECT_EQ(seq.size(), 10u) << id;
  }
  EXPECT_EQ(got.at("r3").size(), 2u);
}

TEST(WorkerServer, LifecycleAnswersFollowTheModelAndTheMemoryFigures) {
  Worker w;
  EXPECT_TRUE(w.Health().serving());
  EXPECT_EQ(w.Health().detail(), "not initialized");
  // grpc.health.v1 says SERVING as soon as the process serves.
  EXPECT_EQ(GrpcHealthCheck(w.channel, ""), 1);
  EXPECT_EQ(GrpcHealthCheck(w.channel, "llm.v1.WorkerService"), 1);

  v1::ProfileMemoryRequest profile;
  profile.set_block_size(16);
  profile.set_cpu_kv_cache_space_gib(0.01);
  profile.set_swap_space_gib(0.003);
  v1::ProfileMemoryResponse memory;
  EXPECT_EQ(w.ProfileMemory(profile, &memory).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(w.InitCache(16, 8, 0).error_code(), grpc::StatusCode::FAILED_PRECONDITION);

  // What the worker cannot serve is refused before anything loads.
  v1::InitRequest bad = MakeInit();
  bad.set_dtype("float16");  // bfloat16 is served on cpu where the CPU has AVX512_BF16
  grpc::Status s = w.Init(bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("float16"));
  bad = MakeInit();
  bad.set_device("cuda:0");
  s = w.Init(bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
#ifdef LLM_WITH_CUDA
  EXPECT_EQ(s.error_message(),
            "the scheduler asks for device cuda:0; this worker serves cpu (its --device)");
#else
  EXPECT_EQ(s.error_message(),
            "device cuda is not built into this worker (no CUDA toolkit at build time)");
#endif
  s = w.Init(MakeInit(/*rank=*/2, /*world_size=*/2, "127.0.0.1:1", "g"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bad = MakeInit();
  bad.set_model_path(ModelDir() + "/missing");
  EXPECT_FALSE(w.Init(bad).ok());
  EXPECT_THAT(w.Health().detail(), StartsWith("not initialized"));

  v1::InitResponse init;
  s = w.Init(MakeInit(), &init);
  ASSERT_TRUE(s.ok()) << s.error_message();
  absl::StatusOr<ModelConfig> config = ModelConfig::FromModelDir(ModelDir());
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(init.vocab_size(), static_cast<uint32_t>(config->vocab_size));
  EXPECT_EQ(init.max_position_embeddings(), static_cast<uint32_t>(config->max_position_embeddings));
  EXPECT_THAT(w.Health().detail(), StartsWith("not initialized"));  // no cache yet

  s = w.ProfileMemory(profile, &memory);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const CacheShape shape{config->num_hidden_layers, config->num_key_value_heads, config->head_dim,
                         16};
  const uint64_t bytes = CacheEngine::BytesPerBlock(shape);
  EXPECT_EQ(memory.bytes_per_block(), bytes);
  EXPECT_EQ(memory.num_gpu_blocks(), static_cast<uint32_t>(std::floor(0.01 * (1 << 30) / bytes)));
  EXPECT_EQ(memory.num_cpu_blocks(), static_cast<uint32_t>(std::floor(0.003 * (1 << 30) / bytes)));
  EXPECT_GT(memory.num_gpu_blocks(), 0u);
  profile.set_block_size(32);  // twice the block, half the blocks
  v1::ProfileMemoryResponse memory32;
  ASSERT_TRUE(w.ProfileMemory(profile, &memory32).ok());
  EXPECT_EQ(memory32.bytes_per_block(), 2 * bytes);
  profile.set_block_size(0);
  EXPECT_EQ(w.ProfileMemory(profile, &memory).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  EXPECT_EQ(w.InitCache(16, 0, 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  s = w.InitCache(16, memory.num_gpu_blocks(), memory.num_cpu_blocks());
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(w.Health().detail(), "ready");

  // A fresh Init (same model: no reload) drops the cache: not ready until InitCache again.
  ASSERT_TRUE(w.Init(MakeInit()).ok());
  EXPECT_THAT(w.Health().detail(), StartsWith("not initialized"));
  ASSERT_TRUE(w.InitCache(16, 8, 0).ok());
  EXPECT_EQ(w.Health().detail(), "ready");

  // kv_cache_dtype auto is the model's dtype: a bf16 model's blocks take half the bytes, so
  // the same space holds twice the blocks; float32 asked for keeps f32.
  if (cpu::CpuHasNativeBf16()) {
    v1::InitRequest bf16 = MakeInit();
    bf16.set_dtype("auto");
    ASSERT_TRUE(w.Init(bf16).ok());
    profile.set_block_size(16);
    v1::ProfileMemoryResponse half;
    ASSERT_TRUE(w.ProfileMemory(profile, &half).ok());
    EXPECT_EQ(half.bytes_per_block(), bytes / 2);
    ASSERT_TRUE(w.InitCache(16, half.num_gpu_blocks(), 0).ok());
    EXPECT_EQ(w.Health().detail(), "ready");
    bf16.set_kv_cache_dtype("float32");
    ASSERT_TRUE(w.Init(bf16).ok());
    ASSERT_TRUE(w.ProfileMemory(profile, &half).ok());
    EXPECT_EQ(half.bytes_per_block(), bytes);
  }
  // A bf16 cache for an f32 model, on any CPU (the cache needs no bf16 GEMMs): half the bytes.
  v1::InitRequest f32_bf16_cache = MakeInit();
  f32_bf16_cache.set_kv_cache_dtype("bfloat16");
  s = w.Init(f32_bf16_cache);
  ASSERT_TRUE(s.ok()) << s.error_message();
  profile.set_block_size(16);
  v1::ProfileMemoryResponse halved;
  ASSERT_TRUE(w.ProfileMemory(profile, &halved).ok());
  EXPECT_EQ(halved.bytes_per_block(), bytes / 2);
  ASSERT_TRUE(w.InitCache(16, halved.num_gpu_blocks(), 0).ok());
  EXPECT_EQ(w.Health().detail(), "ready");
  // What the cpu cannot store is still refused, naming the field.
  f32_bf16_cache.set_kv_cache_dtype("float16");
  s = w.Init(f32_bf16_cache);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("kv_cache_dtype"));
}

// world_size and rank are uint32 on the wire: one past INT_MAX must not wrap to a negative
// int and load the whole model as a single rank.
// The scheduler's channels send keepalive PINGs every few seconds, with no data between steps.
// gRPC servers by default count such PINGs as strikes and, after two, close the connection
// with GOAWAY "too_many_pings", which would break every Step stream. The worker accepts them:
// a call held open on a channel that PINGs every 100 ms (gRPC makes it 1 s) without data is still
// open after 6 s (it ends CANCELLED by the client, not UNAVAILABLE by the server).
TEST(WorkerServer, KeepalivePingsWithoutDataDoNotCloseTheConnection) {
  Worker w;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 100);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  auto health = grpc::health::v1::Health::NewStub(grpc::CreateCustomChannel(
      "127.0.0.1:" + std::to_string(w.server->port()), grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kDeadline);
  grpc::health::v1::HealthCheckRequest req;
  auto watch = health->Watch(&ctx, req);  // answers the status, then stays open
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(watch->Read(&resp));
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  absl::Notification cancelled;
  std::thread canceller([&] {
    absl::SleepFor(absl::Seconds(6));  // gRPC sends at most 1 PING/s without data: 5 or 6
    cancelled.Notify();
    ctx.TryCancel();
  });
  while (watch->Read(&resp)) {
  }
  const grpc::Status s = watch->Finish();
  const bool was_cancelled = cancelled.HasBeenNotified();
  canceller.join();
  EXPECT_TRUE(was_cancelled) << "the call ended before the client cancelled it";
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
}

TEST(WorkerServer, InitRefusesAWorldSizeBeyondInt) {
  Worker w;
  v1::InitRequest init = MakeInit();
  init.set_world_size(static_cast<uint32_t>(std::numeric_limits<int>::max()) + 2);
  const grpc::Status s = w.Init(init);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(w.Health().detail(), StartsWith("not initialized: Init failed"));
}

TEST(WorkerServer, StepsBeforeInitAnswerFailedPreconditionAndInitEndsTheStream) {
  Worker w;
  Stream stream(w);
  v1::StepRequest request;
  request.set_step_id(1);
  v1::StepResult result;
  ASSERT_TRUE(stream.RoundTrip(request, &result));
  EXPECT_EQ(result.step_id(), 1u);
  EXPECT_EQ(result.error_code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_THAT(result.error_message(), HasSubstr("not initialized"));
  // The stream stays open; still refused after Init alone (no cache).
  request.set_step_id(2);
  ASSERT_TRUE(stream.RoundTrip(request, &result));
  EXPECT_EQ(result.error_code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));

  // Init rebuilds the group: the stream of the old one is ended.
  ASSERT_TRUE(w.Init(MakeInit()).ok());
  EXPECT_FALSE(stream.rw->Read(&result));
  EXPECT_EQ(stream.rw->Finish().error_code(), grpc::StatusCode::CANCELLED);

  ASSERT_TRUE(w.InitCache(16, 8, 1).ok());
  Stream fresh(w);
  request.set_step_id(3);
  ASSERT_TRUE(fresh.RoundTrip(request, &result));
  EXPECT_EQ(result.error_code(), 0) << result.error_message();
  EXPECT_TRUE(fresh.Close().ok());
}

TEST(WorkerServer, ASecondStepStreamIsRefusedWhileOneIsActive) {
  Worker w;
  ASSERT_TRUE(w.Init(MakeInit()).ok());
  ASSERT_TRUE(w.InitCache(16, 8, 1).ok());
  Stream first(w);
  v1::StepRequest request;
  request.set_step_id(1);
  v1::StepResult result;
  ASSERT_TRUE(first.RoundTrip(request, &result));  // the first stream is being served
  EXPECT_EQ(result.error_code(), 0);

  Stream second(w);
  EXPECT_FALSE(second.rw->Read(&result));
  const grpc::Status s = second.rw->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("another Step stream"));

  request.set_step_id(2);
  ASSERT_TRUE(first.RoundTrip(request, &result));  // unaffected
  EXPECT_EQ(result.error_code(), 0);
  EXPECT_TRUE(first.Close().ok());
  Stream third(w);  // the first has ended: a new one is served
  request.set_step_id(3);
  ASSERT_TRUE(third.RoundTrip(request, &result));
  EXPECT_EQ(result.error_code(), 0);
  EXPECT_TRUE(third.Close().ok());
}

TEST(WorkerServer, BadStepsAnswerInvalidArgumentAndTheStreamGoesOn) {
  Worker w;
  ASSERT_TRUE(w.Init(MakeInit()).ok());
  ASSERT_TRUE(w.InitCache(16, 8, 1).ok());
  Stream stream(w);
  SamplingParams params;
  params.temperature = 0;
  params.logprobs = 2;
  const std::vector<TokenId> prompt{5, 6, 7};
  SchedulerOutput step = OnePrefillStep("req-a", prompt, params, {9});
  v1::StepRequest request;
  v1::StepResult result;

  // A block id past the 8-block cache.
  step.step_id = 1;
  step.block_ids = {9};
  EncodeStepRequest(step, &request);
  ASSERT_TRUE(stream.RoundTrip(request, &result));
  EXPECT_EQ(result.step_id(), 1u);
  EXPECT_EQ(result.error_code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(result.error_message(), HasSubstr("req-a"));
  EXPECT_THAT(result.error_message(), HasSubstr("block id 9"));
  EXPECT_EQ(result.sampled_token_ids_size(), 0);

  // A slot the worker does not hold.
  SchedulerOutput unknown;
  unknown.step_id = 2;
  unknown.seqs.push_back({.index = 0});
  unknown.cached_requests.push_back(
      {.slot = 7, .request_id = "ghost", .num_computed_tokens = 3, .seqs = {0, 1}});
  EncodeStepRequest(unknown, &request);
  ASSERT_TRUE(stream.RoundTrip(request, &result));
  EXPECT_EQ(result.error_code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(result.error_message(), HasSubstr("ghost"));

  // Malformed sequences: none listed, then listed out of order.
  step.step_id = 3;
  step.block_ids = {2};
  EncodeStepRequest(step, &request);
  request.mutable_new_requests(0)->clear_seqs();
  ASSERT_TRUE(stream.RoundTrip(request, &result));
  EXPECT_EQ(result.error_code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(result.error_message(), HasSubstr("req-a"));
  EncodeStepRequest(step, &request);
  request.set_step_id(4);
  *request.mutable_new_requests(0)->add_seqs() = request.new_requests(0).seqs(0);
  ASSERT_TRUE(stream.RoundTrip(request, &result));
  EXPECT_EQ(result.error_code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(result.error_message(), HasSubstr("req-a"));

  // None of that changed anything: the good step runs, as new, on the same stream.
  step.step_id = 5;
  EncodeStepRequest(step, &request);
  ASSERT_TRUE(stream.RoundTrip(request, &result));
  EXPECT_EQ(result.step_id(), 5u);
  EXPECT_EQ(result.error_code(), 0) << result.error_message();
  ASSERT_EQ(result.sampled_token_ids_size(), 1);
  ASSERT_EQ(result.logprobs_size(), 1);  // asked for: the sampled token's and the top 2
  EXPECT_EQ(result.logprobs(0).sampled().token_id(), result.sampled_token_ids(0));
  EXPECT_EQ(result.logprobs(0).top_size(), 2);
  EXPECT_GT(result.forward_seconds(), 0.0);
  EXPECT_GE(result.step_seconds(), result.forward_seconds());
  EXPECT_TRUE(stream.Close().ok());
}

TEST(WorkerServer, SchedulerDrivenWorkerGeneratesTheInProcessTokens) {
  const EngineSetup e;
  const Outputs want = RunInProcess(e);
  Worker w;
  ASSERT_TRUE(w.Init(MakeInit()).ok());
  ASSERT_TRUE(w.InitCache(e.block_size, e.num_gpu_blocks, e.num_cpu_blocks).ok());
  SchedulerStats stats;
  Outputs got;
  {
    StreamExecutor executor({&w});
    got = RunEngine(&executor, e, &stats);
    EXPECT_GT(executor.steps(), 10);
  }
  EXPECT_GT(stats.num_swap_outs, 0) << "the pool is meant to be small enough to swap";
  ExpectSameOutputs(got, want);
}

// Both ways of running the collectives: one shared-memory segment (the default, as the ranks
// share a host) and Gloo over TCP.
TEST(WorkerServer, WithASecretCallsWithoutItAreUnauthenticated) {
  for (const std::string presented : {"", "wrong-secret"}) {
    Worker w(/*shm_collectives=*/true, "the-secret", presented);
    const grpc::Status init = w.Init(MakeInit());
    EXPECT_EQ(init.error_code(), grpc::StatusCode::UNAUTHENTICATED) << presented;
    EXPECT_THAT(init.error_message(), HasSubstr("cluster secret"));
    EXPECT_THAT(init.error_message(), ::testing::Not(HasSubstr("the-secret")));
    EXPECT_EQ(w.InitCache(16, 8, 1).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    v1::ProfileMemoryResponse profile;
    EXPECT_EQ(w.ProfileMemory(v1::ProfileMemoryRequest(), &profile).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::HealthResponse health;
    EXPECT_EQ(w.stub->Health(w.Context().get(), v1::HealthRequest(), &health).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    Stream stream(w);
    v1::StepRequest request;
    request.set_step_id(1);
    v1::StepResult result;
    EXPECT_FALSE(stream.RoundTrip(request, &result));
    EXPECT_EQ(stream.rw->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
    v1::ShutdownResponse shut;
    EXPECT_EQ(w.stub->Shutdown(w.Context().get(), v1::ShutdownRequest(), &shut).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // Presenting it: the whole lifecycle works.
  Worker w(/*shm_collectives=*/true, "the-secret", "the-secret");
  ASSERT_TRUE(w.Init(MakeInit()).ok());
  ASSERT_TRUE(w.InitCache(16, 8, 1).ok());
  EXPECT_TRUE(w.Health().serving());
  Stream stream(w);
  v1::StepRequest request;
  request.set_step_id(1);
  v1::StepResult result;
  ASSERT_TRUE(stream.RoundTrip(request, &result));
  EXPECT_EQ(result.error_code(), 0) << result.error_message();
  EXPECT_TRUE(stream.Close().ok());
}

TEST(WorkerServer, RanksPresentTheSecretToTheRendezvousStore) {
  for (const std::string store_secret : {"the-secret", "another-groups-secret"}) {
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> store =
        TcpStoreServer::Start("127.0.0.1", 0, store_secret);
    ASSERT_TRUE(store.ok()) << store.status();
    const std::string address = "127.0.0.1:" + std::to_string((*store)->port());
    Worker w0(false, "the-secret", "the-secret"), w1(false, "the-secret", "the-secret");
    grpc::Status s1;
    std::thread rank1([&] { s1 = w1.Init(MakeInit(1, 2, address, "g")); });
    const grpc::Status s0 = w0.Init(MakeInit(0, 2, address, "g"));
    rank1.join();
    if (store_secret == "the-secret") {
      EXPECT_TRUE(s0.ok()) << s0.error_message();
      EXPECT_TRUE(s1.ok()) << s1.error_message();
    } else {
      EXPECT_EQ(s0.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s0.error_message();
      EXPECT_THAT(s0.error_message(), HasSubstr("refused this process's cluster secret"));
      EXPECT_EQ(s1.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s1.error_message();
    }
  }
}

class TensorParallelWorkers : public ::testing::TestWithParam<bool> {};

TEST_P(TensorParallelWorkers, GenerateTheTp1Tokens) {
  const bool shm = GetParam();
  const EngineSetup e;
  const Outputs want = RunInProcess(e);
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> store = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string address = "127.0.0.1:" + std::to_string((*store)->port());
  Worker w0(shm), w1(shm);
  // Two rounds: the second Init rebuilds the group under a fresh prefix, without reloading.
  for (const std::string prefix : {"group-1", "group-2"}) {
    grpc::Status s1;
    v1::InitResponse r0, r1;
    std::thread rank1([&] { s1 = w1.Init(MakeInit(1, 2, address, prefix), &r1); });
    const grpc::Status s0 = w0.Init(MakeInit(0, 2, address, prefix), &r0);
    rank1.join();
    ASSERT_TRUE(s0.ok()) << s0.error_message();
    ASSERT_TRUE(s1.ok()) << s1.error_message();
    EXPECT_EQ(r0.collectives(), shm ? "shm" : "gloo");
    EXPECT_EQ(r1.collectives(), r0.collectives());
    ASSERT_TRUE(w0.InitCache(e.block_size, e.num_gpu_blocks, e.num_cpu_blocks).ok());
    ASSERT_TRUE(w1.InitCache(e.block_size, e.num_gpu_blocks, e.num_cpu_blocks).ok());
    Outputs got;
    {
      StreamExecutor executor({&w0, &w1});
      got = RunEngine(&executor, e);
    }
    ExpectSameOutputs(got, want, /*greedy_only=*/true);
  }
}

INSTANTIATE_TEST_SUITE_P(Collectives, TensorParallelWorkers, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Shm" : "Gloo"; });

TEST(WorkerServer, RanksThatDisagreeOnSharedMemoryAllUseGloo) {
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> store = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string address = "127.0.0.1:" + std::to_string((*store)->port());
  Worker w0(/*shm_collectives=*/true), w1(/*shm_collectives=*/false);
  grpc::Status s1;
  v1::InitResponse r0, r1;
  std::thread rank1([&] { s1 = w1.Init(MakeInit(1, 2, address, "mixed"), &r1); });
  const grpc::Status s0 = w0.Init(MakeInit(0, 2, address, "mixed"), &r0);
  rank1.join();
  ASSERT_TRUE(s0.ok()) << s0.error_message();
  ASSERT_TRUE(s1.ok()) << s1.error_message();
  EXPECT_EQ(r0.collectives(), "gloo");
  EXPECT_EQ(r1.collectives(), "gloo");
}

TEST(WorkerServer, InitFailsWhenAPeerNeverJoinsAndTheWorkerStaysUsable) {
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> store = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(store.ok()) << store.status();
  Worker w;
  v1::InitRequest init = MakeInit(0, 2, "127.0.0.1:" + std::to_string((*store)->port()), "lonely");
  init.set_collective_timeout_ms(300);  // rank 1 never comes: fail soon
  const grpc::Status s = w.Init(init);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(w.Health().detail(), StartsWith("not initialized: Init failed"));
  v1::ProfileMemoryRequest profile;
  profile.set_block_size(16);
  v1::ProfileMemoryResponse memory;
  EXPECT_EQ(w.ProfileMemory(profile, &memory).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(w.Init(MakeInit()).ok());  // alone, it serves
  ASSERT_TRUE(w.InitCache(16, 8, 1).ok());
  EXPECT_EQ(w.Health().detail(), "ready");
}

TEST(WorkerServer, AStepStuckOnAMissingPeerEndsAndReInitRecoversTheGroup) {
  const EngineSetup e;
  const Outputs want = RunInProcess(e);
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> store = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string address = "127.0.0.1:" + std::to_string((*store)->port());
  Worker w0, w1;
  auto init_both = [&](const std::string& prefix, uint32_t timeout_ms) {
    grpc::Status s1;
    v1::InitRequest i1 = MakeInit(1, 2, address, prefix), i0 = MakeInit(0, 2, address, prefix);
    i0.set_collective_timeout_ms(timeout_ms);
    i1.set_collective_timeout_ms(timeout_ms);
    std::thread rank1([&] { s1 = w1.Init(i1); });
    const grpc::Status s0 = w0.Init(i0);
    rank1.join();
    EXPECT_TRUE(s0.ok()) << s0.error_message();
    EXPECT_TRUE(s1.ok()) << s1.error_message();
    EXPECT_TRUE(w0.InitCache(e.block_size, e.num_gpu_blocks, e.num_cpu_blocks).ok());
    EXPECT_TRUE(w1.InitCache(e.block_size, e.num_gpu_blocks, e.num_cpu_blocks).ok());
  };
  init_both("group-1", 500);  // collectives of this group give up after 0.5 s

  // A prefill sent to rank 0 alone: its collectives wait for rank 1, which never joins them.
  Stream stream(w0);
  SamplingParams params;
  const std::vector<TokenId> prompt{5, 6, 7};
  SchedulerOutput step = OnePrefillStep("r", prompt, params, {0});
  v1::StepRequest request;
  EncodeStepRequest(step, &request);
  v1::StepResult result;
  ASSERT_TRUE(stream.RoundTrip(request, &result));
  EXPECT_NE(result.error_code(), 0);  // the collective gave up
  EXPECT_THAT(w0.Health().detail(), StartsWith("not initialized: step 1 failed"));
  request.set_step_id(2);
  ASSERT_TRUE(stream.RoundTrip(request, &result));  // the stream still answers
  EXPECT_EQ(result.error_code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));

  // The scheduler rebuilds the group.
  init_both("group-2", 500);
  EXPECT_FALSE(stream.rw->Read(&result));  // Init ended the old group's stream
  stream.rw->Finish();

  // Again a step stuck on rank 0, and this time the Inits arrive while it waits: rank 0's Init
  // waits for the step to give up, then the group forms; the stuck stream is ended (or gets
  // its failed answer first) and none of its steps runs on the new group.
  Stream stuck(w0);
  request.set_step_id(1);
  ASSERT_TRUE(stuck.rw->Write(request));
  init_both("group-3", 60000);
  while (stuck.rw->Read(&result)) EXPECT_NE(result.error_code(), 0);
  stuck.rw->Finish();
  EXPECT_EQ(w0.Health().detail(), "ready");

  // The same tokens as TP = 1.
  Outputs got;
  {
    StreamExecutor executor({&w0, &w1});
    got = RunEngine(&executor, e);
  }
  ExpectSameOutputs(got, want, /*greedy_only=*/true);
}

TEST(WorkerServer, InitWhileStepsRunWaitsAndLeavesAWorkingWorker) {
  Worker w;
  ASSERT_TRUE(w.Init(MakeInit()).ok());
  ASSERT_TRUE(w.InitCache(16, 64, 1).ok());
  // A thread steps one request's prefill, then empty steps, until Init ends its stream. Init
  // is sent once the stream is being served.
  absl::Notification serving;
  std::thread stepper([&w, &serving] {
    Stream stream(w);
    SamplingParams params;
    const std::vector<TokenId> prompt(40, 9);
    SchedulerOutput step = OnePrefillStep("long", prompt, params, {0, 1, 2});
    v1::StepRequest request;
    EncodeStepRequest(step, &request);
    v1::StepResult result;
    for (uint64_t id = 1; id < 100000; ++id) {
      request.set_step_id(id);
      if (!stream.RoundTrip(request, &result)) break;
      if (!serving.HasBeenNotified()) serving.Notify();
      // Ok (the first), a repeat of a known request, or not initialized between Init and
      // InitCache: never anything else.
      if (result.error_code() != 0) {
        EXPECT_THAT(result.error_code(),
                    ::testing::AnyOf(static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT),
                                     static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION)))
            << result.error_message();
      }
      request.clear_new_requests();  // then empty steps
    }
    stream.rw->Finish();
  });
  serving.WaitForNotification();
  const grpc::Status s = w.Init(MakeInit());
  stepper.join();  // Init ended the stream
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_TRUE(w.InitCache(16, 8, 1).ok());
  Stream stream(w);
  v1::StepRequest request;
  request.set_step_id(1);
  v1::StepResult result;
  ASSERT_TRUE(stream.RoundTrip(request, &result));
  EXPECT_EQ(result.error_code(), 0) << result.error_message();
  EXPECT_TRUE(stream.Close().ok());
}

TEST(WorkerServer, ShutdownStopsTheServerAfterAnswering) {
  Worker w;
  Stream stream(w);  // an open Step stream does not hold the stop up
  v1::StepRequest request;
  request.set_step_id(1);
  v1::StepResult result;
  ASSERT_TRUE(stream.RoundTrip(request, &result));
  grpc::ClientContext ctx;
  v1::ShutdownResponse response;
  ASSERT_TRUE(w.stub->Shutdown(&ctx, v1::ShutdownRequest(), &response).ok());
  w.server->Wait();  // returns: the server stopped
  EXPECT_FALSE(stream.rw->Read(&result));
  EXPECT_FALSE(stream.rw->Finish().ok());
  grpc::ClientContext after;
  after.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::HealthResponse health;
  EXPECT_FALSE(w.stub->Health(&after, v1::HealthRequest(), &health).ok());
}

}  // namespace
}  // namespace llm
