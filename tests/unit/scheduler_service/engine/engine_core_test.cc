#include "scheduler_service/engine/engine_core.h"

#include <atomic>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_detokenizer.h"
#include "tests/testing/fake_executor.h"
#include "tests/testing/scheduler_harness.h"

namespace llm {
namespace {

using ::testing::HasSubstr;

BlockSpaceManagerConfig Cache(int gpu = 200) {
  return {.block_size = 16, .num_gpu_blocks = gpu, .num_cpu_blocks = 0, .watermark = 0};
}

SchedulerConfig Config() {
  SchedulerConfig c;
  c.max_model_len = 512;
  c.max_num_batched_tokens = 512;
  return c;
}

std::vector<TokenId> Prompt(int n, int first) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Collects one request's stream; thread-safe.
struct Collector {
  absl::Mutex mu;
  std::map<std::string, std::vector<TokenId>> tokens ABSL_GUARDED_BY(mu);
  std::map<std::string, absl::Status> ended ABSL_GUARDED_BY(mu);

  StreamCallback For(const std::string& id, absl::BlockingCounter* done = nullptr) {
    return [this, id, done](const StreamUpdate& u) {
      bool last = !u.status.ok();
      {
        absl::MutexLock lock(&mu);
        if (u.output != nullptr) {
          for (const SequenceOutput& s : u.outputs->Seqs(*u.output)) {
            for (TokenId t : u.outputs->NewTokenIds(s)) tokens[id].push_back(t);
          }
          last = u.output->finished;
        }
        if (last) ended[id] = u.status;
      }
      if (last && done != nullptr) done->DecrementCount();
    };
  }
};

// Every test runs with synchronous and with asynchronous scheduling.
class EngineCoreTest : public ::testing::TestWithParam<bool> {};

SamplingParams Params(int max_tokens) {
  SamplingParams p;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

TEST_P(EngineCoreTest, StepsRequestsToCompletionThroughTheirStreams) {
  FakeExecutorConfig ec = SchedulerHarness::ExecConfig(Cache());
  FakeExecutor exec(ec);
  EngineCore engine(Config(), Cache(), &exec);
  engine.set_async_scheduling(GetParam());
  Collector c;
  for (int i = 0; i < 5; ++i) {
    const std::string id = "r" + std::to_string(i);
    ASSERT_TRUE(engine.AddRequest({id, Prompt(10 + i, 100 * i), Params(6 + i)}, c.For(id)).ok());
  }
  ASSERT_TRUE(engine.RunUntilIdle().ok());
  absl::MutexLock lock(&c.mu);
  for (int i = 0; i < 5; ++i) {
    const std::string id = "r" + std::to_string(i);
    EXPECT_TRUE(c.ended[id].ok()) << id;
    EXPECT_EQ(c.tokens[id],
              ExpectedStream(exec, ec, Prompt(10 + i, 100 * i), Params(6 + i), 0, -1, 512));
  }
  EXPECT_EQ(engine.scheduler().block_manager().stats().num_free_gpu_blocks, 200);
  EXPECT_EQ(exec.num_requests(), 0);
}

TEST_P(EngineCoreTest, RejectsBadAndDuplicateRequestsAtOnce) {
  FakeExecutor exec(SchedulerHarness::ExecConfig(Cache()));
  EngineCore engine(Config(), Cache(), &exec);
  engine.set_async_scheduling(GetParam());
  Collector c;
  SamplingParams bad = Params(4);
  bad.temperature = -1;
  EXPECT_THAT(engine.AddRequest({"a", Prompt(4, 1), bad}, c.For("a")).message(),
              HasSubstr("temperature is -1"));
  EXPECT_THAT(engine.AddRequest({"a", Prompt(600, 1), Params(4)}, c.For("a")).message(),
              HasSubstr("at most 511 are accepted (max_model_len 512"));
  // Refused, not clamped to the context: the sum names both numbers.
  EXPECT_THAT(engine.AddRequest({"a", Prompt(500, 1), Params(13)}, c.For("a")).message(),
              HasSubstr("the prompt is 500 tokens and max_tokens is 13: 500 + 13 = 513 tokens"));
  ASSERT_TRUE(engine.AddRequest({"a", Prompt(4, 1), Params(4)}, c.For("a")).ok());
  EXPECT_EQ(engine.AddRequest({"a", Prompt(4, 1), Params(4)}, c.For("a")).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(engine.Abort("nope").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(engine.RunUntilIdle().ok());
  // Finished: the id is free again.
  EXPECT_TRUE(engine.AddRequest({"a", Prompt(4, 1), Params(4)}, c.For("a")).ok());
  ASSERT_TRUE(engine.RunUntilIdle().ok());
}

TEST_P(EngineCoreTest, ServesConcurrentClientsAndAbortsFromAnotherThread) {
  FakeExecutorConfig ec = SchedulerHarness::ExecConfig(Cache());
  FakeExecutor exec(ec);
  EngineCore engine(Config(), Cache(), &exec);
  engine.set_async_scheduling(GetParam());
  engine.Start();
  Collector c;
  constexpr int kThreads = 4, kPerThread = 50;
  absl::BlockingCounter done(kThreads * kPerThread + 1);
  // A request that would run for long; aborted once it has produced a token.
  absl::Notification first_token, abort_sent;
  ASSERT_TRUE(engine
                  .AddRequest({"long", Prompt(8, 1), Params(400)},
                              [&](const StreamUpdate& u) {
                                if (u.output != nullptr && !first_token.HasBeenNotified()) {
                                  first_token.Notify();
                                  abort_sent.WaitForNotification();  // holds the engine thread
                                }
                                c.For("long", &done)(u);
                              })
                  .ok());
  std::vector<std::thread> clients;
  for (int t = 0; t < kThreads; ++t) {
    clients.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string id = absl::StrCat("t", t, "-", i);
        ASSERT_TRUE(engine
                        .AddRequest({id, Prompt(5 + i % 40, 1000 * t + i), Params(1 + i % 9)},
                                    c.For(id, &done))
                        .ok());
      }
    });
  }
  first_token.WaitForNotification();
  ASSERT_TRUE(engine.Abort("long").ok());
  abort_sent.Notify();
  for (std::thread& t : clients) t.join();
  done.Wait();
  engine.Stop();
  absl::MutexLock lock(&c.mu);
  EXPECT_EQ(c.ended["long"].code(), absl::StatusCode::kCancelled);
  EXPECT_LT(c.tokens["long"].size(), 400u);
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      const std::string id = absl::StrCat("t", t, "-", i);
      ASSERT_TRUE(c.ended[id].ok()) << id;
      EXPECT_EQ(c.tokens[id], ExpectedStream(exec, ec, Prompt(5 + i % 40, 1000 * t + i),
                                             Params(1 + i % 9), 0, -1, 512))
          << id;
    }
  }
  // Stopped: the engine thread is gone, so its state may be read here. The workers were told
  // about the last finished requests only if a step ran after them.
  EXPECT_EQ(engine.scheduler().block_manager().stats().num_free_gpu_blocks, 200);
  EXPECT_FALSE(engine.scheduler().HasUnfinishedRequests());
}

class FailingExecutor : public Executor {
 public:
  absl::Status Execute(const SchedulerOutput&, ModelOutput*) override {
    return absl::UnavailableError("worker 0 is gone");
  }
};

TEST_P(EngineCoreTest, AnExecutorErrorEndsEveryStreamWithIt) {
  FailingExecutor exec;
  EngineCore engine(Config(), Cache(), &exec);
  engine.set_async_scheduling(GetParam());
  Collector c;
  ASSERT_TRUE(engine.AddRequest({"a", Prompt(4, 1), Params(4)}, c.For("a")).ok());
  ASSERT_TRUE(engine.AddRequest({"b", Prompt(4, 9), Params(4)}, c.For("b")).ok());
  EXPECT_EQ(engine.Step().status().code(), absl::StatusCode::kUnavailable);
  absl::MutexLock lock(&c.mu);
  EXPECT_EQ(c.ended["a"].code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(c.ended["b"].code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(engine.scheduler().block_manager().stats().num_free_gpu_blocks, 200);
}

// Runs a hook inside Execute: what another thread does while a step is on the workers.
class HookedExecutor : public Executor {
 public:
  HookedExecutor(Executor* inner, std::function<void()> hook)
      : inner_(inner), hook_(std::move(hook)) {}
  absl::Status Execute(const SchedulerOutput& step, ModelOutput* out) override {
    if (hook_) std::exchange(hook_, nullptr)();
    return inner_->Execute(step, out);
  }

 private:
  Executor* const inner_;
  std::function<void()> hook_;
};

TEST_P(EngineCoreTest, AnAbortForARequestThatFinishedMeanwhileSparesTheNextOneWithItsId) {
  FakeExecutor fake(SchedulerHarness::ExecConfig(Cache()));
  EngineCore* engine_ptr = nullptr;
  // The client aborts "x" while the step that finishes it runs.
  HookedExecutor exec(&fake, [&] { ASSERT_TRUE(engine_ptr->Abort("x").ok()); });
  EngineCore engine(Config(), Cache(), &exec);
  engine.set_async_scheduling(GetParam());
  engine_ptr = &engine;
  Collector first, second;
  ASSERT_TRUE(engine.AddRequest({"x", Prompt(4, 1), Params(1)}, first.For("x")).ok());
  // Synchronous: the step's result is applied before the abort is seen. Asynchronous: the
  // abort is seen while the step is in flight, and wins the race (both are right for a
  // client that aborted a running request).
  for (int steps = 0; steps < (GetParam() ? 2 : 1); ++steps) ASSERT_TRUE(engine.Step().ok());
  {
    absl::MutexLock lock(&first.mu);
    ASSERT_TRUE(first.ended.contains("x"));
    if (GetParam()) {
      EXPECT_EQ(first.ended["x"].code(), absl::StatusCode::kCancelled) << first.ended["x"];
    } else {
      EXPECT_TRUE(first.ended["x"].ok()) << first.ended["x"];
    }
  }
  // The id is free again; the stale abort must not reach its new owner.
  ASSERT_TRUE(engine.AddRequest({"x", Prompt(4, 9), Params(3)}, second.For("x")).ok());
  ASSERT_TRUE(engine.RunUntilIdle().ok());
  absl::MutexLock lock(&second.mu);
  EXPECT_TRUE(second.ended["x"].ok()) << second.ended["x"];
  EXPECT_EQ(second.tokens["x"].size(), 3u);
}

// Reports, with every step's result, how many steps it ran (as rank 0 does in StepResult).
class CountingExecutor : public Executor {
 public:
  explicit CountingExecutor(Executor* inner) : inner_(inner) {}
  absl::Status Execute(const SchedulerOutput& step, ModelOutput* out) override {
    absl::Status s = inner_->Execute(step, out);
    out->worker_stats = WorkerStats{.steps = ++steps_};
    return s;
  }

 private:
  Executor* const inner_;
  int64_t steps_ = 0;
};

TEST_P(EngineCoreTest, AStreamThatEndsSeesTheStatsOfTheStepThatEndedIt) {
  FakeExecutor fake(SchedulerHarness::ExecConfig(Cache()));
  CountingExecutor exec(&fake);
  EngineCore engine(Config(), Cache(), &exec);
  engine.set_async_scheduling(GetParam());
  // A client that asks for stats as soon as its request ends (GetStats after Generate).
  std::vector<int64_t> seen;
  auto on_update = [&](const StreamUpdate& u) {
    if (u.output == nullptr || !u.output->finished) return;
    const EngineStats s = engine.stats_snapshot();
    seen.push_back(s.worker.has_value() ? s.worker->steps : -1);
  };
  ASSERT_TRUE(engine.AddRequest({"a", Prompt(4, 1), Params(1)}, on_update).ok());
  ASSERT_TRUE(engine.RunUntilIdle().ok());
  ASSERT_TRUE(engine.AddRequest({"b", Prompt(4, 9), Params(3)}, on_update).ok());
  ASSERT_TRUE(engine.RunUntilIdle().ok());
  // "a" ends in step 1 (its prefill samples its one token); step 2 tells the workers it
  // finished; "b" runs steps 3 to 5. Published after the streams were told, the first end
  // saw no stats and the second step 4's.
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 5}));
}

}  // namespace
}  // namespace llm

namespace llm {
namespace {

// The workers of a group that fails: answers as `inner` for `ok_steps` steps, then UNAVAILABLE
// for good (as ShardedWorkerClient does once a rank died).
class DyingExecutor : public Executor {
 public:
  DyingExecutor(Executor* inner, int ok_steps) : inner_(inner), ok_steps_(ok_steps) {}
  absl::Status Execute(const SchedulerOutput& step, ModelOutput* out) override {
    if (ok_steps_-- <= 0) return absl::UnavailableError("worker rank 1 at 127.0.0.1:9: died");
    return inner_->Execute(step, out);
  }

 private:
  Executor* const inner_;
  int ok_steps_;
};

struct Load {
  std::string id;
  std::vector<TokenId> prompt;
  SamplingParams params;
};

std::vector<Load> RecoveryLoad() {
  std::vector<Load> load;
  for (int i = 0; i < 24; ++i) {
    SamplingParams p = Params(5 + i % 13);
    p.n = i % 4 == 0 ? 2 : 1;
    load.push_back({absl::StrCat("r", i), Prompt(6 + 3 * i, 100 * i), p});
  }
  return load;
}

// Streams of an undisturbed run (synchronous: the reference for both modes).
std::map<std::string, std::vector<TokenId>> Undisturbed(const std::vector<Load>& load) {
  FakeExecutor exec(SchedulerHarness::ExecConfig(Cache()));
  EngineCore engine(Config(), Cache(), &exec);
  Collector c;
  for (const Load& l : load) {
    EXPECT_TRUE(engine.AddRequest({l.id, l.prompt, l.params}, c.For(l.id)).ok());
  }
  EXPECT_TRUE(engine.RunUntilIdle().ok());
  absl::MutexLock lock(&c.mu);
  return c.tokens;
}

TEST_P(EngineCoreTest, RequestsSurviveAFailedGroupAndResumeOnTheNewOneWithTheSameTokens) {
  const std::vector<Load> load = RecoveryLoad();
  const std::map<std::string, std::vector<TokenId>> want = Undisturbed(load);
  FakeExecutor old_workers(SchedulerHarness::ExecConfig(Cache()));
  DyingExecutor dying(&old_workers, /*ok_steps=*/7);
  EngineCore engine(Config(), Cache(), &dying);
  engine.set_async_scheduling(GetParam());
  engine.set_recovery_timeout(absl::Seconds(600));
  engine.Start();
  Collector c;
  absl::BlockingCounter done(static_cast<int>(load.size()));
  for (const Load& l : load) {
    ASSERT_TRUE(engine.AddRequest({l.id, l.prompt, l.params}, c.For(l.id, &done)).ok());
  }
  // Paused on the failure, with no stream ended by it (some finished before).
  for (int i = 0; i < 6000 && engine.paused_on().ok(); ++i) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_THAT(engine.paused_on().message(), HasSubstr("worker rank 1"));
  {
    absl::MutexLock lock(&c.mu);
    for (const auto& [id, status] : c.ended) EXPECT_TRUE(status.ok()) << id << ": " << status;
    EXPECT_LT(c.ended.size(), load.size());
    int streamed = 0;
    for (const auto& [id, t] : c.tokens) streamed += static_cast<int>(t.size());
    EXPECT_GT(streamed, 0) << "the group failed before any token: nothing to resume";
  }
  // The new group, with a cache of another size.
  FakeExecutor new_workers(SchedulerHarness::ExecConfig(Cache(150)));
  engine.ReplaceExecutor(&new_workers, Cache(150));
  EXPECT_TRUE(engine.paused_on().ok());
  done.Wait();
  engine.Stop();
  absl::MutexLock lock(&c.mu);
  for (const Load& l : load) {
    EXPECT_TRUE(c.ended[l.id].ok()) << l.id << ": " << c.ended[l.id];
    EXPECT_EQ(c.tokens[l.id], want.at(l.id)) << l.id;
  }
  EXPECT_EQ(engine.scheduler().block_manager().stats().num_free_gpu_blocks, 150);
  EXPECT_EQ(engine.stats_snapshot().scheduler.num_worker_resets, 2);  // at the failure, at the swap
}

TEST_P(EngineCoreTest,
       WithoutNewWorkersWithinTheRecoveryTimeoutStreamsEndUnavailableNamingTheCause) {
  FakeExecutor old_workers(SchedulerHarness::ExecConfig(Cache()));
  DyingExecutor dying(&old_workers, /*ok_steps=*/2);
  EngineCore engine(Config(), Cache(), &dying);
  engine.set_async_scheduling(GetParam());
  engine.set_recovery_timeout(absl::Milliseconds(200));
  engine.Start();
  Collector c;
  absl::BlockingCounter done(3);
  for (const char* id : {"a", "b", "c"}) {
    ASSERT_TRUE(engine.AddRequest({id, Prompt(8, 1), Params(50)}, c.For(id, &done)).ok());
  }
  done.Wait();
  engine.Stop();
  absl::MutexLock lock(&c.mu);
  for (const char* id : {"a", "b", "c"}) {
    EXPECT_EQ(c.ended[id].code(), absl::StatusCode::kUnavailable) << id;
    EXPECT_THAT(c.ended[id].message(),
                HasSubstr("did not recover within 200ms after worker rank 1 at 127.0.0.1:9: died"));
  }
  EXPECT_FALSE(engine.scheduler().HasUnfinishedRequests());
}

TEST_P(EngineCoreTest, AbortWhilePausedEndsTheStreamAndFreesTheId) {
  FakeExecutor old_workers(SchedulerHarness::ExecConfig(Cache()));
  DyingExecutor dying(&old_workers, /*ok_steps=*/1);
  EngineCore engine(Config(), Cache(), &dying);
  engine.set_async_scheduling(GetParam());
  engine.set_recovery_timeout(absl::Seconds(600));
  Collector c;
  ASSERT_TRUE(engine.AddRequest({"a", Prompt(8, 1), Params(50)}, c.For("a")).ok());
  ASSERT_TRUE(engine.AddRequest({"b", Prompt(8, 7), Params(50)}, c.For("b")).ok());
  ASSERT_TRUE(engine.Step().ok());
  EXPECT_EQ(engine.Step().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(engine.paused_on().ok());
  ASSERT_TRUE(engine.Abort("a").ok());
  ASSERT_TRUE(engine.Step().ok());  // paused: drains the abort, schedules nothing
  {
    absl::MutexLock lock(&c.mu);
    EXPECT_EQ(c.ended["a"].code(), absl::StatusCode::kCancelled);
    EXPECT_FALSE(c.ended.contains("b"));
  }
  FakeExecutor new_workers(SchedulerHarness::ExecConfig(Cache()));
  engine.ReplaceExecutor(&new_workers, Cache());
  ASSERT_TRUE(engine.AddRequest({"a", Prompt(8, 1), Params(5)}, c.For("a")).ok());
  ASSERT_TRUE(engine.RunUntilIdle().ok());
  absl::MutexLock lock(&c.mu);
  EXPECT_TRUE(c.ended["b"].ok());
  EXPECT_EQ(c.tokens["b"].size(), 50u);
}

}  // namespace
}  // namespace llm

namespace llm {
namespace {

TEST_P(EngineCoreTest, AnAbortedIdIsFreeAtOnceAndOnlyTheOldRequestIsAborted) {
  FakeExecutorConfig ec = SchedulerHarness::ExecConfig(Cache());
  FakeExecutor exec(ec);
  EngineCore engine(Config(), Cache(), &exec);
  engine.set_async_scheduling(GetParam());
  std::vector<absl::Status> old_end, new_end;
  std::vector<TokenId> new_tokens;
  ASSERT_TRUE(engine
                  .AddRequest({"a", Prompt(8, 1), Params(50)},
                              [&](const StreamUpdate& u) {
                                if (!u.status.ok()) old_end.push_back(u.status);
                              })
                  .ok());
  ASSERT_TRUE(engine.Step().ok());  // "a" runs
  ASSERT_TRUE(engine.Abort("a").ok());
  EXPECT_EQ(engine.Abort("a").code(), absl::StatusCode::kNotFound);  // already aborted
  // No step in between: the id is free at once.
  ASSERT_TRUE(engine
                  .AddRequest({"a", Prompt(9, 70), Params(6)},
                              [&](const StreamUpdate& u) {
                                if (!u.status.ok()) new_end.push_back(u.status);
                                if (u.output == nullptr) return;
                                for (const SequenceOutput& s : u.outputs->Seqs(*u.output)) {
                                  for (TokenId t : u.outputs->NewTokenIds(s)) {
                                    new_tokens.push_back(t);
                                  }
                                }
                              })
                  .ok());
  EXPECT_EQ(engine.AddRequest({"a", Prompt(9, 70), Params(6)}, [](const StreamUpdate&) {}).code(),
            absl::StatusCode::kAlreadyExists);  // the new one holds it
  ASSERT_TRUE(engine.RunUntilIdle().ok());
  ASSERT_EQ(old_end.size(), 1u);
  EXPECT_EQ(old_end[0].code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(new_end.empty());
  EXPECT_EQ(new_tokens, ExpectedStream(exec, ec, Prompt(9, 70), Params(6), 0, -1, 512));
  EXPECT_EQ(engine.scheduler().block_manager().stats().num_free_gpu_blocks, 200);
}

// Counts the steps it ran; readable from any thread.
class AtomicStepCounter : public Executor {
 public:
  explicit AtomicStepCounter(Executor* inner) : inner_(inner) {}
  absl::Status Execute(const SchedulerOutput& step, ModelOutput* out) override {
    ++steps_;
    thread_ = std::this_thread::get_id();
    return inner_->Execute(step, out);
  }
  int steps() const { return steps_.load(); }
  std::thread::id thread() const { return thread_.load(); }  // of the last step: the engine's

 private:
  Executor* const inner_;
  std::atomic<int> steps_{0};
  std::atomic<std::thread::id> thread_;
};

TEST_P(EngineCoreTest, ASlowStreamCallbackDoesNotHoldTheEngineThread) {
  FakeExecutor fake(SchedulerHarness::ExecConfig(Cache()));
  AtomicStepCounter exec(&fake);
  EngineCore engine(Config(), Cache(), &exec);
  engine.set_async_scheduling(GetParam());
  engine.Start();
  Collector c;
  absl::BlockingCounter done(1);
  absl::Notification release;
  std::atomic<int> updates{0};
  const StreamCallback collect = c.For("slow", &done);
  // The first update blocks until the test has seen the engine run steps past it: it could
  // not, were the callbacks on the engine thread.
  ASSERT_TRUE(engine
                  .AddRequest({"slow", Prompt(4, 1), Params(24)},
                              [&](const StreamUpdate& u) {
                                if (updates++ == 0) {
                                  release.WaitForNotificationWithTimeout(absl::Seconds(60));
                                }
                                collect(u);
                              })
                  .ok());
  // Wait for the first callback to be entered (the output thread may take a while to pick up
  // the first delivery), then for the engine to run steps while it stays blocked.
  const int ahead = 1 + static_cast<int>(EngineCore::kMaxQueuedOutputs);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (updates.load() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(updates.load(), 1) << "the first update never reached its stream";
  while (exec.steps() < ahead && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_GE(exec.steps(), ahead) << "the engine thread waited for a stream callback";
  EXPECT_EQ(updates.load(), 1);
  release.Notify();
  done.Wait();
  engine.Stop();
  absl::MutexLock lock(&c.mu);
  EXPECT_TRUE(c.ended["slow"].ok());
  EXPECT_EQ(c.tokens["slow"].size(), 24u);  // every update delivered, in order, after the wait
}

// FakeDetokenizers that record the threads they run on.
class ThreadRecordingDetokenizers : public DetokenizerFactory {
 public:
  std::unique_ptr<IncrementalDetokenizer> Create(std::span<const TokenId> prompt,
                                                 const DetokenizeOptions& options) const override {
    return std::make_unique<Recording>(this, fake_.Create(prompt, options));
  }
  std::set<std::thread::id> threads() const {
    absl::MutexLock lock(&mu_);
    return threads_;
  }

 private:
  class Recording : public IncrementalDetokenizer {
   public:
    Recording(const ThreadRecordingDetokenizers* f, std::unique_ptr<IncrementalDetokenizer> d)
        : factory_(f), inner_(std::move(d)) {}
    Delta Append(std::span<const TokenId> ids) override {
      factory_->Record();
      return inner_->Append(ids);
    }
    std::string Flush() override {
      factory_->Record();
      return inner_->Flush();
    }
    const std::string& output_text() const override { return inner_->output_text(); }

   private:
    const ThreadRecordingDetokenizers* factory_;
    std::unique_ptr<IncrementalDetokenizer> inner_;
  };
  void Record() const {
    absl::MutexLock lock(&mu_);
    threads_.insert(std::this_thread::get_id());
  }

  FakeDetokenizerFactory fake_;
  mutable absl::Mutex mu_;
  mutable std::set<std::thread::id> threads_ ABSL_GUARDED_BY(mu_);
};

// Each sequence's tokens, text and end, as its client saw them.
struct TextCollector {
  struct Seq {
    std::vector<TokenId> tokens;
    std::string text;
    SequenceStatus status = SequenceStatus::kRunning;
    std::string stop_string;
  };
  absl::Mutex mu;
  std::map<std::string, std::map<int, Seq>> seqs ABSL_GUARDED_BY(mu);
  std::map<std::string, int> ends ABSL_GUARDED_BY(mu);  // final updates seen
  std::map<std::string, int> late ABSL_GUARDED_BY(mu);  // updates after the final one

  StreamCallback For(const std::string& id, absl::BlockingCounter* done) {
    return [this, id, done](const StreamUpdate& u) {
      // A slow client now and then: the engine runs steps ahead of the output thread.
      if (id.back() == '0') absl::SleepFor(absl::Milliseconds(2));
      absl::MutexLock lock(&mu);
      if (ends[id] > 0) ++late[id];
      bool last = !u.status.ok();
      if (u.output != nullptr) {
        for (const SequenceOutput& so : u.outputs->Seqs(*u.output)) {
          Seq& seq = seqs[id][so.index];
          for (TokenId t : u.outputs->NewTokenIds(so)) seq.tokens.push_back(t);
          seq.text += u.outputs->Text(so);
          seq.status = so.status;
          seq.stop_string = so.stop_string;
        }
        last = u.output->finished;
      }
      if (last) {
        ++ends[id];
        if (ends[id] == 1) done->DecrementCount();
      }
    };
  }
};

// The case: stop strings are found in the text on the output thread, while the engine
// has planned and run steps past them; no client sees a token past its stop, the text ends
// where the stop string starts (or after it when included), and every block is freed.
TEST_P(EngineCoreTest, StopStringsEndSequencesOffTheEngineThreadWithNothingPastTheStop) {
  const FakeExecutorConfig ec = SchedulerHarness::ExecConfig(Cache(2000));
  FakeExecutor fake(ec);
  AtomicStepCounter exec(&fake);
  ThreadRecordingDetokenizers detok;
  EngineCore engine(Config(), Cache(2000), &exec, &detok);
  engine.set_async_scheduling(GetParam());
  engine.Start();
  constexpr int kRequests = 40;
  struct Sent {
    std::vector<TokenId> prompt;
    SamplingParams params;
  };
  std::map<std::string, Sent> sent;
  TextCollector c;
  absl::BlockingCounter done(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    // Most stop at one of the first 20 tokens of sequence 0's stream, with room for many more;
    // some (i % 5 == 4) run to max_tokens.
    const bool stops = i % 5 != 4;
    Sent s{Prompt(4 + i % 11, 1000 + 53 * i), Params(stops ? 400 : 10 + i % 17)};
    s.params.n = i % 4 == 3 ? 2 : 1;
    s.params.seed = i;
    const std::vector<TokenId> reference = ExpectedStream(fake, ec, s.prompt, s.params, 0, -1, 512);
    if (stops) s.params.stop = {FakeText({reference[(i * 7) % 20]})};
    s.params.include_stop_str_in_output = i % 3 == 0;
    const std::string id = "r" + std::to_string(i);
    ASSERT_TRUE(engine.AddRequest({id, s.prompt, s.params}, c.For(id, &done)).ok());
    sent.emplace(id, std::move(s));
  }
  done.Wait();
  // The stops reach the engine thread after the streams end: wait for it to free everything.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    const EngineStats st = engine.stats_snapshot();
    if (st.num_free_gpu_blocks == 2000 && st.scheduler.num_running == 0) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  engine.Stop();
  absl::MutexLock lock(&c.mu);
  int stopped_by_text = 0;
  int64_t bound = 0;  // tokens the engine may compute: each stop learnt within a few steps
  for (const auto& [id, s] : sent) {
    bound += static_cast<int64_t>(s.prompt.size());
    EXPECT_EQ(c.ends[id], 1) << id;
    EXPECT_EQ(c.late[id], 0) << id << ": updates after its end";
    for (int j = 0; j < s.params.n; ++j) {
      std::vector<TokenId> want = ExpectedStream(fake, ec, s.prompt, s.params, j, -1, 512);
      bool stops = false;
      for (size_t k = 0; k < want.size() && !s.params.stop.empty(); ++k) {
        if (FakeText({want[k]}) == s.params.stop[0]) {
          want.resize(k + 1);
          stops = true;
          break;
        }
      }
      bound += static_cast<int64_t>(want.size()) + 2 + 2 * EngineCore::kMaxQueuedOutputs;
      const TextCollector::Seq& got = c.seqs[id][j];
      EXPECT_EQ(got.tokens, want) << id << " sequence " << j;
      if (stops) {
        ++stopped_by_text;
        EXPECT_EQ(got.status, SequenceStatus::kFinishedStopped) << id << " sequence " << j;
        EXPECT_EQ(got.stop_string, s.params.stop[0]) << id << " sequence " << j;
        const std::vector<TokenId> before(want.begin(), want.end() - 1);
        EXPECT_EQ(got.text, s.params.include_stop_str_in_output ? FakeText(want) : FakeText(before))
            << id << " sequence " << j;
      } else {
        EXPECT_EQ(got.status, SequenceStatus::kFinishedLength) << id << " sequence " << j;
        EXPECT_EQ(got.text, FakeText(want)) << id << " sequence " << j;
      }
    }
  }
  EXPECT_GT(stopped_by_text, kRequests / 2);
  // The stops reached the scheduler: it did not run the sequences on to max_tokens.
  EXPECT_LT(engine.scheduler().stats().total_num_scheduled_tokens, bound);
  const BlockSpaceManagerStats blocks = engine.scheduler().block_manager().stats();
  EXPECT_EQ(blocks.num_free_gpu_blocks, 2000);
  EXPECT_EQ(engine.scheduler().num_requests(), 0);
  EXPECT_EQ(fake.num_requests(), 0) << "the workers still hold requests";
  // With steps planned past the stops, the scheduler dropped what they sampled (synchronous,
  // the output thread alone dropped the tokens the engine ran past a stop).
  if (GetParam()) EXPECT_GT(engine.scheduler().stats().num_samples_discarded, 0);
  // Text was made on the output thread only.
  const std::set<std::thread::id> threads = detok.threads();
  EXPECT_FALSE(threads.empty());
  EXPECT_EQ(threads.count(exec.thread()), 0u) << "a detokenizer ran on the engine thread";
}

TEST_P(EngineCoreTest, StopStringsNeedADetokenizer) {
  FakeExecutor exec(SchedulerHarness::ExecConfig(Cache()));
  EngineCore engine(Config(), Cache(), &exec);
  engine.set_async_scheduling(GetParam());
  SamplingParams stop = Params(4);
  stop.stop = {"x"};
  EXPECT_THAT(engine.AddRequest({"a", Prompt(4, 1), stop}, [](const StreamUpdate&) {}).message(),
              HasSubstr("stop strings need a detokenizer"));
}

INSTANTIATE_TEST_SUITE_P(Scheduling, EngineCoreTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Async" : "Sync";
                         });

}  // namespace
}  // namespace llm
