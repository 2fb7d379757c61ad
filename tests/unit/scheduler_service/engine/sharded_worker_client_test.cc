// ShardedWorkerClient against fake WorkerService ranks served in-process on port 0. The fakes
// run each step through a FakeExecutor (the worker's real ModelRunner is the worker helper's
// to test); what is tested here is the client: tokens from rank 0, with steps run one by one or
// two in flight (Submit / Collect), any failing rank fails the step with UNAVAILABLE naming it,
// and nothing hangs (timeouts here are hang guards only).
#include "scheduler_service/engine/sharded_worker_client.h"

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "llm/v1/worker_service.grpc.pb.h"
#include "protocol/step_codec.h"
#include "scheduler_service/engine/engine_core.h"
#include "tests/testing/fake_executor.h"
#include "tests/testing/fake_worker.h"

namespace llm {
namespace {

using ::testing::HasSubstr;

constexpr int kBlocks = 64;
constexpr int kVocab = 1000;

FakeExecutorConfig ExecConfig(uint64_t seed) {
  return {.num_gpu_blocks = kBlocks, .num_cpu_blocks = 0, .vocab_size = kVocab, .seed = seed};
}

using Mode = FakeWorker::Mode;
using Rank = FakeWorkerServer;

Rank StartRank(uint64_t seed, int num_gpu_blocks = kBlocks) {
  return FakeWorkerServer::Start(kVocab, seed, num_gpu_blocks);
}

template <typename F>
bool Eventually(F done) {  // hang guard: 30 s
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

SchedulerConfig Config() {
  SchedulerConfig c;
  c.max_model_len = 256;
  c.max_num_batched_tokens = 256;
  return c;
}

BlockSpaceManagerConfig Cache() {
  return {.block_size = 16, .num_gpu_blocks = kBlocks, .num_cpu_blocks = 0, .watermark = 0};
}

EngineRequest Request(const std::string& id, int max_tokens, int n = 1) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids.resize(20);
  std::iota(r.prompt_token_ids.begin(), r.prompt_token_ids.end(), 3);
  r.sampling_params.max_tokens = max_tokens;
  r.sampling_params.n = n;
  r.sampling_params.seed = 7;
  return r;
}

// Runs requests through an engine over `executor`; the tokens of each sequence.
std::map<std::string, std::vector<TokenId>> RunAll(Executor* executor, absl::Status* status) {
  EngineCore engine(Config(), Cache(), executor);
  std::map<std::string, std::vector<TokenId>> tokens;
  for (auto [id, n] : {std::pair<const char*, int>{"a", 1}, {"b", 2}}) {
    absl::Status s = engine.AddRequest(Request(id, 12, n), [&tokens, id](const StreamUpdate& u) {
      if (u.output == nullptr) return;
      for (const SequenceOutput& seq : u.outputs->Seqs(*u.output)) {
        for (TokenId t : u.outputs->NewTokenIds(seq)) {
          tokens[absl::StrCat(id, "/", seq.index)].push_back(t);
        }
      }
    });
    EXPECT_TRUE(s.ok()) << s;
  }
  *status = engine.RunUntilIdle();
  return tokens;
}

struct Group {
  std::vector<Rank> ranks;
  std::unique_ptr<ShardedWorkerClient> client;
  std::atomic<int> failures{0};
};

// Starts the ranks (rank i's FakeExecutor seeded 100 * i, so that only rank 0's tokens
// match the reference) and brings the client up to open streams.
// Every rank samples with seed 0 (as the ranks of a group sample alike), unless
// `distinct_seeds`: rank i with seed 100 * i.
std::unique_ptr<Group> StartGroup(int world_size, absl::Duration timeout = absl::Seconds(30),
                                  bool distinct_seeds = false) {
  auto g = std::make_unique<Group>();
  ShardedWorkerClientOptions opts;
  for (int i = 0; i < world_size; ++i) {
    g->ranks.push_back(StartRank(distinct_seeds ? 100 * i : 0, kBlocks + 10 * i));
    opts.addresses.push_back(g->ranks.back().address);
  }
  opts.worker_timeout = timeout;
  Group* raw = g.get();
  opts.on_failure = [raw](const absl::Status&) { ++raw->failures; };
  auto client = ShardedWorkerClient::Create(opts);
  EXPECT_TRUE(client.ok()) << client.status();
  g->client = std::move(*client);
  EXPECT_TRUE(g->client->WaitUntilHealthy().ok());
  v1::InitRequest init;
  init.set_model_path("/models/x");
  init.set_rendezvous_prefix("group-1");
  auto inits = g->client->Init(init);
  EXPECT_TRUE(inits.ok()) << inits.status();
  v1::ProfileMemoryRequest prof;
  prof.set_block_size(16);
  auto mem = g->client->ProfileMemory(prof);
  EXPECT_TRUE(mem.ok()) << mem.status();
  EXPECT_EQ(mem->num_gpu_blocks(), kBlocks);  // the smallest over the ranks
  v1::InitCacheRequest ic;
  ic.set_block_size(16);
  ic.set_num_gpu_blocks(kBlocks);
  EXPECT_TRUE(g->client->InitCache(ic).ok());
  EXPECT_TRUE(g->client->OpenStreams().ok());
  return g;
}

TEST(ShardedWorkerClientTest, SetupSendsEachRankItsRank) {
  auto g = StartGroup(3);
  for (int i = 0; i < 3; ++i) {
    const v1::InitRequest init = g->ranks[i].service->init();
    EXPECT_EQ(init.rank(), static_cast<uint32_t>(i));
    EXPECT_EQ(init.world_size(), 3u);
    EXPECT_EQ(init.model_path(), "/models/x");
    EXPECT_EQ(init.rendezvous_prefix(), "group-1");
  }
}

TEST(ShardedWorkerClientTest, TokensComeFromRankZero) {
  FakeExecutor reference_executor(ExecConfig(0));
  absl::Status ref_status;
  const auto reference = RunAll(&reference_executor, &ref_status);
  ASSERT_TRUE(ref_status.ok()) << ref_status;
  ASSERT_EQ(reference.size(), 3u);  // a/0, b/0, b/1

  auto g = StartGroup(2);
  absl::Status status;
  const auto got = RunAll(g->client.get(), &status);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(got, reference);
  EXPECT_GT(g->ranks[0].service->num_steps(), 0);
  EXPECT_EQ(g->ranks[1].service->num_steps(), g->ranks[0].service->num_steps());
  EXPECT_EQ(g->failures, 0);
  EXPECT_TRUE(g->client->failure().ok());
}

// Each rank appends the tokens it sampled: a rank that sampled others than rank 0 (here: another
// seed) would go on with sequences and KV that are not the scheduler's, so the step fails,
// naming it.
TEST(ShardedWorkerClientTest, ARankThatSampledOtherTokensFailsTheStep) {
  auto g = StartGroup(2, absl::Seconds(30), /*distinct_seeds=*/true);
  absl::Status status;
  RunAll(g->client.get(), &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("worker rank 1 at ", g->ranks[1].address,
                                     " sampled other tokens than rank 0 in step 1")));
  EXPECT_EQ(g->failures, 1);
}

TEST(ShardedWorkerClientTest, RankAnsweringAnErrorFailsTheStep) {
  auto g = StartGroup(2);
  g->ranks[1].service->set_mode(Mode::kError);
  absl::Status status;
  RunAll(g->client.get(), &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("worker rank 1 at ", g->ranks[1].address, ":")));
  EXPECT_THAT(status.message(), HasSubstr("injected failure"));
  EXPECT_EQ(g->failures, 1);
  // The group stays failed.
  ModelOutput out;
  SchedulerOutput step;
  EXPECT_EQ(g->client->Execute(step, &out).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(g->failures, 1);
}

TEST(ShardedWorkerClientTest, RankThatNeverAnswersFailsWithinTheTimeout) {
  auto g = StartGroup(2, absl::Seconds(1));
  g->ranks[1].service->set_mode(Mode::kSilent);
  absl::Status status;
  RunAll(g->client.get(), &status);  // a hang here is the failure
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("worker rank 1 at " + g->ranks[1].address));
  EXPECT_THAT(status.message(), HasSubstr("no answer"));
  EXPECT_EQ(g->failures, 1);
}

TEST(ShardedWorkerClientTest, RankWhoseServerIsKilledFailsTheStep) {
  auto g = StartGroup(2);
  EngineCore engine(Config(), Cache(), g->client.get());
  ASSERT_TRUE(engine.AddRequest(Request("a", 50), [](const StreamUpdate&) {}).ok());
  ASSERT_TRUE(engine.Step().ok());
  g->ranks[1].Kill();
  absl::Status status;
  for (int i = 0; i < 60 && status.ok(); ++i) status = engine.Step().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("worker rank 1 at " + g->ranks[1].address));
}

TEST(ShardedWorkerClientTest, HealthProbeFailsTheGroupWhenARankDies) {
  auto g = StartGroup(2);
  EXPECT_TRUE(g->client->CheckHealth().ok());
  const std::string dead = g->ranks[1].address;
  g->ranks[1].Kill();
  const absl::Status s = g->client->CheckHealth();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("worker rank 1 at " + dead + ": Health"));
  EXPECT_EQ(g->failures, 1);
  ModelOutput out;
  EXPECT_EQ(g->client->Execute(SchedulerOutput(), &out), s);  // failed for good
}

TEST(ShardedWorkerClientTest, InitFailsNamingTheUnreachableRank) {
  Rank r0 = StartRank(0);
  Rank r1 = StartRank(1);
  const std::string dead = r1.address;
  r1.Kill();
  auto client = ShardedWorkerClient::Create(
      {.addresses = {r0.address, dead}, .worker_timeout = absl::Seconds(2)});
  ASSERT_TRUE(client.ok());
  auto inits = (*client)->Init(v1::InitRequest());
  EXPECT_EQ(inits.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(inits.status().message(), HasSubstr("worker rank 1 at " + dead + ": Init"));
}

TEST(ShardedWorkerClientTest, AFailingInitCancelsTheOthersAndIsTheOneReported) {
  Rank r0 = StartRank(0);
  r0.service->set_block_init(true);  // stuck as in a rendezvous whose peer never comes
  Rank r1 = StartRank(1);
  const std::string dead = r1.address;
  r1.Kill();
  auto client = ShardedWorkerClient::Create(
      {.addresses = {r0.address, dead}, .worker_timeout = absl::Hours(1)});
  ASSERT_TRUE(client.ok());
  auto inits = (*client)->Init(v1::InitRequest());  // a hang here is the bug
  EXPECT_EQ(inits.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(inits.status().message(), HasSubstr("worker rank 1 at " + dead + ": Init"));
  // Rank 0's call was cancelled: before it reached the worker, or there.
  EXPECT_TRUE(Eventually(
      [&] { return r0.service->num_cancelled_inits() == r0.service->num_init_calls(); }));
}

TEST(ShardedWorkerClientTest, CreateRefusesABadKeepalive) {
  auto negative = ShardedWorkerClient::Create(
      {.addresses = {"127.0.0.1:1"}, .keepalive_time = absl::Seconds(-1)});
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.status().message(), HasSubstr("keepalive time must be >= 0"));
  EXPECT_THAT(negative.status().message(), HasSubstr("got -1s"));
  auto no_timeout = ShardedWorkerClient::Create({.addresses = {"127.0.0.1:1"},
                                                 .keepalive_time = absl::Seconds(1),
                                                 .keepalive_timeout = absl::ZeroDuration()});
  EXPECT_EQ(no_timeout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_timeout.status().message(), HasSubstr("keepalive timeout must be positive"));
  // Off: no timeout needed.
  EXPECT_TRUE(ShardedWorkerClient::Create({.addresses = {"127.0.0.1:1"},
                                           .keepalive_time = absl::ZeroDuration(),
                                           .keepalive_timeout = absl::ZeroDuration()})
                  .ok());
}

TEST(ShardedWorkerClientTest, CancelEndsTheWaitForWorkers) {
  auto client = ShardedWorkerClient::Create(
      {.addresses = {"127.0.0.1:1"}, .worker_timeout = absl::Seconds(1)});
  ASSERT_TRUE(client.ok());
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(200));
    (*client)->Cancel();
  });
  const absl::Status s = (*client)->WaitUntilHealthy();  // a hang here is the failure
  canceller.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace llm

namespace llm {
namespace {

// Rank 1 dies while rank 0 answers the step with an error (as a collective that rank 1 never
// reached does): the error names rank 1, the cause, not rank 0, its bystander.
TEST(ShardedWorkerClientTest, ARankWhoseStreamBrokeIsNamedBeforeARankThatAnsweredAnError) {
  auto g = StartGroup(2);
  EngineCore engine(Config(), Cache(), g->client.get());
  ASSERT_TRUE(engine.AddRequest(Request("a", 50), [](const StreamUpdate&) {}).ok());
  ASSERT_TRUE(engine.Step().ok());
  g->ranks[0].service->set_mode(Mode::kError);
  g->ranks[1].Kill();
  absl::Status status;
  for (int i = 0; i < 60 && status.ok(); ++i) status = engine.Step().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("worker rank 1 at " + g->ranks[1].address));
  EXPECT_THAT(status.message(), ::testing::Not(HasSubstr("worker rank 0")));
}

// Both ranks are late for a step (rank 1 stopped, rank 0 waiting for it in a collective): the
// one that does not answer Health either is named.
TEST(ShardedWorkerClientTest, OfSeveralLateRanksTheOneThatDoesNotAnswerHealthIsNamed) {
  auto g = StartGroup(2, absl::Seconds(1));
  g->ranks[0].service->set_mode(Mode::kSilent);
  g->ranks[1].service->set_mode(Mode::kSilent);
  g->ranks[1].service->set_block_health(true);
  absl::Status status;
  RunAll(g->client.get(), &status);  // a hang here is the failure
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("worker rank 1 at " + g->ranks[1].address));
  EXPECT_THAT(status.message(), HasSubstr("no answer to step"));
  EXPECT_THAT(status.message(), HasSubstr("nor to Health"));
}

// Records the steps an engine plans (encoded: a SchedulerOutput is valid only until the next
// one) and their results, running them on a FakeExecutor.
class RecordingExecutor : public Executor {
 public:
  absl::Status Execute(const SchedulerOutput& step, ModelOutput* out) override {
    EncodeStepRequest(step, &steps.emplace_back());
    const absl::Status s = inner_.Execute(step, out);
    outputs.push_back(*out);
    return s;
  }
  std::vector<v1::StepRequest> steps;
  std::vector<ModelOutput> outputs;

 private:
  FakeExecutor inner_{ExecConfig(0)};
};

// The steps of RunAll's requests, each with its result on one FakeExecutor.
std::unique_ptr<RecordingExecutor> RecordSteps() {
  auto recorder = std::make_unique<RecordingExecutor>();
  absl::Status status;
  RunAll(recorder.get(), &status);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_GT(recorder->steps.size(), 3u);
  return recorder;
}

absl::Status SubmitRecorded(ShardedWorkerClient* client, const v1::StepRequest& req) {
  DecodedStep step;
  const absl::Status s = DecodeStepRequest(req, SamplingLimits{}, &step);
  if (!s.ok()) return s;
  return client->Submit(step.output);
}

absl::Status ExecuteRecorded(ShardedWorkerClient* client, const v1::StepRequest& req,
                             ModelOutput* out) {
  DecodedStep step;
  const absl::Status s = DecodeStepRequest(req, SamplingLimits{}, &step);
  if (!s.ok()) return s;
  return client->Execute(step.output, out);
}

// Runs the recorded steps with Executor::kMaxStepsInFlight (2) submitted ahead: each result is
// the one Execute gives, step by step, and the one the FakeExecutor gave.
TEST(ShardedWorkerClientTest, TwoStepsInFlightGiveTheResultsOfExecute) {
  const auto recorded = RecordSteps();
  const std::vector<v1::StepRequest>& steps = recorded->steps;

  auto one_by_one = StartGroup(2);
  std::vector<ModelOutput> executed(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    ASSERT_TRUE(ExecuteRecorded(one_by_one->client.get(), steps[i], &executed[i]).ok());
  }

  auto g = StartGroup(2);
  ShardedWorkerClient* client = g->client.get();
  ASSERT_TRUE(SubmitRecorded(client, steps[0]).ok());
  ASSERT_TRUE(SubmitRecorded(client, steps[1]).ok());
  EXPECT_EQ(SubmitRecorded(client, steps[2]).code(), absl::StatusCode::kFailedPrecondition);
  ModelOutput out;
  EXPECT_EQ(client->Execute(SchedulerOutput(), &out).code(), absl::StatusCode::kFailedPrecondition);
  for (size_t i = 0; i < steps.size(); ++i) {
    ASSERT_TRUE(client->Collect(&out).ok()) << "step " << i;
    EXPECT_EQ(out.step_id, recorded->outputs[i].step_id);
    EXPECT_EQ(out.step_id, executed[i].step_id);
    EXPECT_EQ(out.sampled_token_ids, recorded->outputs[i].sampled_token_ids) << "step " << i;
    EXPECT_EQ(out.sampled_token_ids, executed[i].sampled_token_ids) << "step " << i;
    if (i + 2 < steps.size()) ASSERT_TRUE(SubmitRecorded(client, steps[i + 2]).ok());
  }
  EXPECT_EQ(client->Collect(&out).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(g->ranks[0].service->num_steps(), static_cast<int>(steps.size()));
  EXPECT_EQ(g->ranks[1].service->num_steps(), static_cast<int>(steps.size()));
  EXPECT_EQ(g->failures, 0);
  EXPECT_TRUE(client->failure().ok());
}

// Step 2 reaches every worker while step 1 still runs there, before step 1 is collected: the
// engine plans and sends the next step while the workers compute.
TEST(ShardedWorkerClientTest, TheNextStepIsSentBeforeTheResultOfTheOneBefore) {
  const auto recorded = RecordSteps();
  auto g = StartGroup(2);
  for (Rank& r : g->ranks) r.service->set_paused(true);  // every step waits before running
  // Submit returns while the workers hold step 1 (the worker timeout, 30 s, would fail it).
  ASSERT_TRUE(SubmitRecorded(g->client.get(), recorded->steps[0]).ok());
  ASSERT_TRUE(SubmitRecorded(g->client.get(), recorded->steps[1]).ok());
  for (Rank& r : g->ranks) {
    ASSERT_TRUE(Eventually([&] { return r.service->num_steps() == 1; }));
    r.service->pause_after(0);  // step 1 runs; step 2, once read, waits
  }
  // A worker reads its stream in order: it has read step 2, so it answered step 1, and step 2
  // was written without waiting for Collect.
  for (Rank& r : g->ranks) {
    ASSERT_TRUE(Eventually([&] { return r.service->num_steps() == 2; }));
  }
  for (Rank& r : g->ranks) r.service->set_paused(false);
  for (int i = 0; i < 2; ++i) {
    ModelOutput out;
    ASSERT_TRUE(g->client->Collect(&out).ok());
    EXPECT_EQ(out.step_id, recorded->outputs[i].step_id);
    EXPECT_EQ(out.sampled_token_ids, recorded->outputs[i].sampled_token_ids);
  }
  EXPECT_EQ(g->failures, 0);
}

// Rank 1 never answers while two steps are in flight: the first Collect fails within the
// timeout naming it, and the group stays failed.
TEST(ShardedWorkerClientTest, ARankThatStallsWithTwoStepsInFlightFailsTheGroup) {
  const auto recorded = RecordSteps();
  auto g = StartGroup(2, absl::Seconds(1));
  g->ranks[1].service->set_mode(Mode::kSilent);
  ASSERT_TRUE(SubmitRecorded(g->client.get(), recorded->steps[0]).ok());
  ASSERT_TRUE(SubmitRecorded(g->client.get(), recorded->steps[1]).ok());
  ModelOutput out;
  const absl::Status status = g->client->Collect(&out);  // a hang here is the failure
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("worker rank 1 at ", g->ranks[1].address,
                                     ": no answer to step ", recorded->outputs[0].step_id)));
  EXPECT_EQ(g->client->Collect(&out), status);
  EXPECT_EQ(SubmitRecorded(g->client.get(), recorded->steps[2]), status);
  EXPECT_EQ(g->failures, 1);
}

// Rank 1's server dies with two steps in flight (both read, neither answered): the first
// Collect fails at once naming it (the broken stream, not the timeout), and so does the second.
TEST(ShardedWorkerClientTest, ARankKilledWithTwoStepsInFlightFailsTheGroup) {
  const auto recorded = RecordSteps();
  auto g = StartGroup(2);
  g->ranks[1].service->set_mode(Mode::kSilent);
  ASSERT_TRUE(SubmitRecorded(g->client.get(), recorded->steps[0]).ok());
  ASSERT_TRUE(SubmitRecorded(g->client.get(), recorded->steps[1]).ok());
  ASSERT_TRUE(Eventually([&] { return g->ranks[1].service->num_steps() == 2; }));
  const std::string dead = g->ranks[1].address;
  g->ranks[1].Kill();
  const absl::Time start = absl::Now();
  ModelOutput out;
  const absl::Status status = g->client->Collect(&out);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // the worker timeout is 30 s
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("worker rank 1 at ", dead, ": the step stream broke")));
  EXPECT_EQ(g->client->Collect(&out), status);
  EXPECT_EQ(g->failures, 1);
}

// The client goes away with steps in flight (a worker holding them): nothing hangs.
TEST(ShardedWorkerClientTest, DestructionWithStepsInFlightEnds) {
  const auto recorded = RecordSteps();
  auto g = StartGroup(2);
  g->ranks[1].service->set_mode(Mode::kSilent);
  ASSERT_TRUE(SubmitRecorded(g->client.get(), recorded->steps[0]).ok());
  ASSERT_TRUE(SubmitRecorded(g->client.get(), recorded->steps[1]).ok());
  g->client.reset();  // a hang here is the failure
  EXPECT_EQ(g->failures, 0);
}

}  // namespace
}  // namespace llm
