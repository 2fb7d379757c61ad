#include "scheduler_service/engine/engine_core.h"

#include <functional>
#include <map>
#include <numeric>
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
#include "tests/testing/fake_executor.h"
#include "tests/unit/scheduler_service/core/scheduler_harness.h"

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

SamplingParams Params(int max_tokens) {
  SamplingParams p;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

TEST(EngineCore, StepsRequestsToCompletionThroughTheirStreams) {
  FakeExecutorConfig ec = SchedulerHarness::ExecConfig(Cache());
  FakeExecutor exec(ec);
  EngineCore engine(Config(), Cache(), &exec);
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

TEST(EngineCore, RejectsBadAndDuplicateRequestsAtOnce) {
  FakeExecutor exec(SchedulerHarness::ExecConfig(Cache()));
  EngineCore engine(Config(), Cache(), &exec);
  Collector c;
  SamplingParams bad = Params(4);
  bad.temperature = -1;
  EXPECT_THAT(engine.AddRequest({"a", Prompt(4, 1), bad}, c.For("a")).message(),
              HasSubstr("temperature is -1"));
  EXPECT_THAT(engine.AddRequest({"a", Prompt(600, 1), Params(4)}, c.For("a")).message(),
              HasSubstr("max_model_len = 512"));
  ASSERT_TRUE(engine.AddRequest({"a", Prompt(4, 1), Params(4)}, c.For("a")).ok());
  EXPECT_EQ(engine.AddRequest({"a", Prompt(4, 1), Params(4)}, c.For("a")).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(engine.Abort("nope").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(engine.RunUntilIdle().ok());
  // Finished: the id is free again.
  EXPECT_TRUE(engine.AddRequest({"a", Prompt(4, 1), Params(4)}, c.For("a")).ok());
  ASSERT_TRUE(engine.RunUntilIdle().ok());
}

TEST(EngineCore, ServesConcurrentClientsAndAbortsFromAnotherThread) {
  FakeExecutorConfig ec = SchedulerHarness::ExecConfig(Cache());
  FakeExecutor exec(ec);
  EngineCore engine(Config(), Cache(), &exec);
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

TEST(EngineCore, AnExecutorErrorEndsEveryStreamWithIt) {
  FailingExecutor exec;
  EngineCore engine(Config(), Cache(), &exec);
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

TEST(EngineCore, AnAbortForARequestThatFinishedMeanwhileSparesTheNextOneWithItsId) {
  FakeExecutor fake(SchedulerHarness::ExecConfig(Cache()));
  EngineCore* engine_ptr = nullptr;
  // The client aborts "x" while the step that finishes it runs.
  HookedExecutor exec(&fake, [&] { ASSERT_TRUE(engine_ptr->Abort("x").ok()); });
  EngineCore engine(Config(), Cache(), &exec);
  engine_ptr = &engine;
  Collector first, second;
  ASSERT_TRUE(engine.AddRequest({"x", Prompt(4, 1), Params(1)}, first.For("x")).ok());
  ASSERT_TRUE(engine.Step().ok());
  {
    absl::MutexLock lock(&first.mu);
    ASSERT_TRUE(first.ended.contains("x"));
    EXPECT_TRUE(first.ended["x"].ok());
  }
  // The id is free again; the stale abort must not reach its new owner.
  ASSERT_TRUE(engine.AddRequest({"x", Prompt(4, 9), Params(3)}, second.For("x")).ok());
  ASSERT_TRUE(engine.RunUntilIdle().ok());
  absl::MutexLock lock(&second.mu);
  EXPECT_TRUE(second.ended["x"].ok()) << second.ended["x"];
  EXPECT_EQ(second.tokens["x"].size(), 3u);
}

}  // namespace
}  // namespace llm
