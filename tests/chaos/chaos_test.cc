// Chaos under load: a local cluster at tensor parallelism 2 (real llm-cluster, llm-scheduler
// and llm-worker processes on loopback) serves a steady mixed load while an injector, at random
// moments, SIGKILLs a worker, SIGSTOPs one for a random time (below and past the worker
// timeout), or fires a burst past the admission limit; faults may overlap (a second one before
// the first is repaired). The load: streaming requests of a fixed pool (prompts of 4 to about
// 250 tokens, greedy and seeded, n = 1 and 2, 8 to 48 tokens), some cancelled after a few
// responses, some with short deadlines; the KV cache is small enough that requests are
// preempted, and prefixes repeat.
//
// Invariants, checked on every request: the tokens a stream received are a prefix of that
// request's undisturbed output (measured twice before the faults, and equal); a request that
// ends OK received all of it; any other end is CANCELLED (only when the client cancelled),
// DEADLINE_EXCEEDED (only with a deadline of its own: without one, hitting the hang guard is a
// hang), RESOURCE_EXHAUSTED naming the limit, or UNAVAILABLE naming the cause (a worker rank,
// recovery, shutdown). At the end: the group serves again, every block is free, the pool's
// requests give their undisturbed outputs again (prefix cache included), the scheduler's
// resident memory grew at most 5%, and a SIGTERM drain in the middle of requests ends them
// well and leaves no process and no shared-memory file.
//
// Seeded and replayable: LLM_CHAOS_SEED chooses the fault schedule (printed first), which the
// same seed reproduces; LLM_CHAOS_SECONDS the length of the faulted load (default 60, as in
// `make test`; `make chaos MINUTES=30` runs longer with a fresh seed). Deadlines are hang
// guards; what the test asserts does not depend on timing.
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"
#include "tools/health_check.h"

namespace llm::testing {
namespace {

constexpr int kMaxConcurrent = 24;  // the scheduler's admission limit
constexpr int kLoadThreads = 6;     // clients that keep a request in flight each
constexpr int kBurst = kMaxConcurrent + 8;
constexpr absl::Duration kHangGuard = absl::Seconds(120);  // > the recovery timeout, 30 s

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = getenv(name);
  return v == nullptr || *v == '\0' ? fallback : strtoll(v, nullptr, 10);
}

// A deterministic generator: the same seed gives the same schedule with any standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  double Uniform(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(engine_() >> 11) * 0x1.0p-53;
  }
  int Below(int n) { return static_cast<int>(engine_() % static_cast<uint64_t>(n)); }

 private:
  std::mt19937_64 engine_;
};

// One request of the pool.
struct Kind {
  std::string prompt;
  int max_tokens = 8;
  int n = 1;
  bool seeded = false;  // temperature 0.8, top-k 40, a seed of its own; else greedy
  uint64_t seed = 0;
};

std::vector<Kind> Pool() {
  const char* kStarts[] = {"Once upon a time",     "The best programmers write code that",
                           "A fortune: you will",  "In the beginning",
                           "The weather tomorrow", "Rules for a quiet life:"};
  const int kMaxTokens[] = {8, 16, 32, 48};
  std::vector<Kind> pool;
  for (int i = 0; i < 24; ++i) {
    Kind k;
    // Prompts of a few tokens to about 250; every other one shares its start with another.
    k.prompt = kStarts[i % 6];
    for (int w = 0; w < (i * 37) % 60; ++w) absl::StrAppend(&k.prompt, " word", w % 17);
    absl::StrAppend(&k.prompt, " (", i, ")");
    k.max_tokens = kMaxTokens[i % 4];
    k.seeded = i % 3 == 2;
    k.n = k.seeded && i % 2 == 1 ? 2 : 1;
    k.seed = 1000 + i;
    pool.push_back(std::move(k));
  }
  return pool;
}

v1::GenerateRequest Request(const Kind& k) {
  v1::GenerateRequest req = GreedyRequest(k.prompt, k.max_tokens);
  v1::SamplingParams* p = req.mutable_sampling_params();
  p->set_n(k.n);
  if (k.seeded) {
    p->set_temperature(0.8f);
    p->set_top_k(40);
    p->set_seed(k.seed);
  }
  return req;
}

using Tokens = std::map<uint32_t, std::vector<int32_t>>;  // by sequence index

struct Outcome {
  int kind = 0;
  grpc::Status status;
  Tokens tokens;
  bool cancelled_by_client = false;
  bool own_deadline = false;
  absl::Time start, end;
};

// One streaming call of pool entry `kind`: cancelled after `cancel_after` responses (> 0), with
// `deadline` as its own deadline (> 0; else the hang guard).
Outcome Call(v1::LLMService::Stub& stub, const std::vector<Kind>& pool, int kind,
             int cancel_after = 0, absl::Duration deadline = absl::ZeroDuration()) {
  Outcome o;
  o.kind = kind;
  o.own_deadline = deadline > absl::ZeroDuration();
  o.start = absl::Now();
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(o.start + (o.own_deadline ? deadline : kHangGuard)));
  auto reader = stub.Generate(&ctx, Request(pool[kind]));
  v1::GenerateResponse resp;
  int responses = 0;
  while (reader->Read(&resp)) {
    for (const v1::SequenceOutput& s : resp.outputs()) {
      std::vector<int32_t>& ids = o.tokens[s.index()];
      ids.insert(ids.end(), s.token_ids().begin(), s.token_ids().end());
    }
    if (++responses == cancel_after) {
      ctx.TryCancel();
      o.cancelled_by_client = true;
    }
  }
  o.status = reader->Finish();
  o.end = absl::Now();
  return o;
}

// What is wrong with `o`, given the undisturbed outputs; empty when nothing.
std::string Violation(const Outcome& o, const std::vector<Tokens>& want) {
  const Tokens& ref = want[o.kind];
  for (const auto& [index, ids] : o.tokens) {
    auto it = ref.find(index);
    if (it == ref.end()) return absl::StrCat("a sequence index ", index, " it does not have");
    if (ids.size() > it->second.size() || !std::equal(ids.begin(), ids.end(), it->second.begin())) {
      return absl::StrCat("sequence ", index, " differs from its undisturbed output: got [",
                          absl::StrJoin(ids, " "), "], want [", absl::StrJoin(it->second, " "),
                          "]");
    }
  }
  const std::string& m = o.status.error_message();
  switch (o.status.error_code()) {
    case grpc::StatusCode::OK:
      if (o.tokens != ref) return "ended OK without all of its undisturbed output";
      return "";
    case grpc::StatusCode::CANCELLED:
      return o.cancelled_by_client ? "" : absl::StrCat("CANCELLED, not by its client: ", m);
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return o.own_deadline ? "" : "hung: no end within the hang guard";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return absl::StrContains(m, "concurrent requests") ? ""
                                                         : absl::StrCat("RESOURCE_EXHAUSTED: ", m);
    case grpc::StatusCode::UNAVAILABLE:
      for (const char* cause :
           {"worker rank", "recover", "not ready", "shutting down", "draining", "worker group"}) {
        if (absl::StrContains(m, cause)) return "";
      }
      return absl::StrCat("UNAVAILABLE without a cause: ", m);
    default:
      return absl::StrCat("status ", o.status.error_code(), ": ", m);
  }
}

// The pool's requests, all at once; their outputs, or why not.
std::vector<Outcome> RunPool(v1::LLMService::Stub& stub, const std::vector<Kind>& pool) {
  std::vector<Outcome> out(pool.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < pool.size(); ++i) {
    threads.emplace_back([&, i] { out[i] = Call(stub, pool, static_cast<int>(i)); });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

// A figure of /proc/PID/status in KiB (VmRSS, RssAnon, RssFile); -1 when absent.
int64_t StatusKiB(pid_t pid, const std::string& field) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(f, line);) {
    if (absl::StartsWith(line, field + ":")) {
      return strtoll(line.c_str() + field.size() + 1, nullptr, 10);
    }
  }
  return -1;
}

struct Fault {
  enum Type { kKill, kStopShort, kStopLong, kBurst } type;
  double at_s;
  int rank;           // which of the workers alive then (by pid order)
  double duration_s;  // stops
};

const char* Name(Fault::Type t) {
  switch (t) {
    case Fault::kKill:
      return "SIGKILL";
    case Fault::kStopShort:
      return "SIGSTOP below the worker timeout";
    case Fault::kStopLong:
      return "SIGSTOP past the worker timeout";
    case Fault::kBurst:
      return "burst past the admission limit";
  }
  return "?";
}

// The faults of a run of `seconds`, from `seed` alone.
std::vector<Fault> Schedule(uint64_t seed, double seconds) {
  Rng rng(seed);
  std::vector<Fault> faults;
  for (double t = 2;;) {
    t += rng.Uniform(1.5, 8);
    if (t > seconds - 3) break;
    const double r = rng.Uniform(0, 1);
    Fault f{.type = r < 0.3   ? Fault::kKill
                    : r < 0.5 ? Fault::kStopShort
                    : r < 0.8 ? Fault::kStopLong
                              : Fault::kBurst,
            .at_s = t,
            .rank = rng.Below(2),
            .duration_s = 0};
    if (f.type == Fault::kStopShort) f.duration_s = rng.Uniform(0.3, 2);
    if (f.type == Fault::kStopLong) f.duration_s = rng.Uniform(4, 12);
    f.duration_s = std::min(f.duration_s, std::max(0.0, seconds - 1 - t));
    faults.push_back(f);
  }
  return faults;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

TEST(ChaosTest, FaultsUnderLoadLoseNoTokenHangNothingAndLeakNothing) {
  const uint64_t seed = static_cast<uint64_t>(EnvInt("LLM_CHAOS_SEED", 20261128));
  const double seconds = static_cast<double>(EnvInt("LLM_CHAOS_SECONDS", 60));
  const std::vector<Fault> schedule = Schedule(seed, seconds);
  std::printf("chaos: seed %llu (LLM_CHAOS_SEED), %.0f s (LLM_CHAOS_SECONDS), %zu faults:\n",
              static_cast<unsigned long long>(seed), seconds, schedule.size());
  for (const Fault& f : schedule) {
    std::printf("  +%5.1f s  %s, worker %d%s\n", f.at_s, Name(f.type), f.rank,
                f.duration_s > 0 ? absl::StrCat(", for ", f.duration_s, " s").c_str() : "");
  }
  std::fflush(stdout);

  const std::string shm_dir =
      std::filesystem::temp_directory_path() / absl::StrCat("llm-chaos-shm-", getpid());
  std::filesystem::create_directories(shm_dir);
  ClusterOptions options{
      .tensor_parallel_size = 2, .restart_workers = true, .restart_delay_s = 0.5};
  options.engine = {{"worker_timeout", "3"},
                    {"collective_timeout", "3"},
                    {"recovery_timeout", "30"},
                    {"max_concurrent_requests", absl::StrCat(kMaxConcurrent)},
                    {"num_gpu_blocks_override", "96"},
                    {"enable_prefix_caching", "true"},
                    {"enable_chunked_prefill", "true"},
                    {"max_num_batched_tokens", "128"},
                    {"drain_timeout", "30"}};
  options.worker = {{"shm_dir", shm_dir}};
  absl::StatusOr<std::unique_ptr<LocalCluster>> started = LocalCluster::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  LocalCluster& c = **started;
  v1::LLMService::Stub& stub = c.stub();

  // The undisturbed outputs, twice: a run that differs from itself could not be compared.
  const std::vector<Kind> pool = Pool();
  std::vector<Tokens> want;
  for (const Outcome& o : RunPool(stub, pool)) {
    ASSERT_TRUE(o.status.ok()) << o.status.error_message();
    want.push_back(o.tokens);
  }
  for (const Outcome& o : RunPool(stub, pool)) {
    ASSERT_TRUE(o.status.ok()) << o.status.error_message();
    ASSERT_EQ(o.tokens, want[o.kind]) << "request " << o.kind << " is not deterministic";
  }
  // Warm-up at the peak concurrency of the run (a burst), so that the baseline of the memory
  // check holds what serving at that concurrency keeps (threads, buffers, the allocator's).
  {
    std::vector<std::thread> warm;
    for (int i = 0; i < kBurst; ++i) {
      warm.emplace_back([&, i] { (void)Call(stub, pool, i % static_cast<int>(pool.size())); });
    }
    for (std::thread& t : warm) t.join();
  }
  const pid_t scheduler = c.SchedulerPid();
  const int64_t rss_before = StatusKiB(scheduler, "VmRSS");
  const int64_t anon_before = StatusKiB(scheduler, "RssAnon");

  // The load.
  std::mutex mu;
  std::vector<Outcome> outcomes;
  std::vector<std::pair<absl::Time, absl::Time>> fault_windows;
  std::atomic<bool> stop_load{false};
  std::vector<std::thread> clients;
  for (int t = 0; t < kLoadThreads; ++t) {
    clients.emplace_back([&, t] {
      Rng rng(seed * 1000 + t);
      while (!stop_load) {
        const int kind = rng.Below(static_cast<int>(pool.size()));
        const double r = rng.Uniform(0, 1);
        const int cancel_after = r < 0.15 ? 1 + rng.Below(4) : 0;
        const absl::Duration deadline = r >= 0.15 && r < 0.25
                                            ? absl::Milliseconds(rng.Uniform(200, 1500))
                                            : absl::ZeroDuration();
        Outcome o = Call(stub, pool, kind, cancel_after, deadline);
        // Refused (recovering, at the limit): back off as a client would, not spin.
        const bool refused = o.status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                             o.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
        {
          std::lock_guard<std::mutex> lock(mu);
          outcomes.push_back(std::move(o));
        }
        if (refused) absl::SleepFor(absl::Milliseconds(100));
      }
    });
  }

  std::vector<int64_t> rss_samples;  // the scheduler's anonymous resident memory, every 5 s
  std::thread sampler([&] {
    while (!stop_load) {
      for (int i = 0; i < 500 && !stop_load; ++i) absl::SleepFor(absl::Milliseconds(10));
      rss_samples.push_back(StatusKiB(scheduler, "RssAnon"));
    }
  });

  // The faults, on this thread.
  std::map<std::string, int> injected;
  std::vector<std::thread> bursts;
  struct Stopped {
    pid_t pid;
    absl::Time at, until;
  };
  std::vector<Stopped> stopped;
  const absl::Time t0 = absl::Now();
  auto continue_due = [&](bool all) {
    for (auto it = stopped.begin(); it != stopped.end();) {
      if (!all && absl::Now() < it->until) {
        ++it;
        continue;
      }
      kill(it->pid, SIGCONT);
      std::lock_guard<std::mutex> lock(mu);
      fault_windows.push_back({it->at, absl::Now() + absl::Seconds(5)});
      it = stopped.erase(it);
    }
  };
  for (const Fault& f : schedule) {
    while (absl::Now() < t0 + absl::Seconds(f.at_s)) {
      continue_due(false);
      absl::SleepFor(absl::Milliseconds(5));
    }
    if (f.type == Fault::kBurst) {
      for (int i = 0; i < kBurst; ++i) {
        bursts.emplace_back([&, i] {
          Outcome o = Call(stub, pool, i % static_cast<int>(pool.size()));
          std::lock_guard<std::mutex> lock(mu);
          outcomes.push_back(std::move(o));
        });
      }
      std::lock_guard<std::mutex> lock(mu);
      fault_windows.push_back({absl::Now(), absl::Now() + absl::Seconds(3)});
    } else {
      const std::vector<pid_t> workers = c.WorkerPids();
      if (workers.empty()) {
        ++injected["skipped: no worker alive"];
        continue;
      }
      const pid_t pid = workers[f.rank % workers.size()];
      if (f.type == Fault::kKill) {
        kill(pid, SIGKILL);
        std::erase_if(stopped, [pid](const Stopped& s) { return s.pid == pid; });
        std::lock_guard<std::mutex> lock(mu);
        fault_windows.push_back({absl::Now(), absl::Now() + absl::Seconds(5)});
      } else {
        kill(pid, SIGSTOP);
        stopped.push_back({pid, absl::Now(), absl::Now() + absl::Seconds(f.duration_s)});
      }
    }
    ++injected[Name(f.type)];
  }
  while (absl::Now() < t0 + absl::Seconds(seconds)) {
    continue_due(false);
    absl::SleepFor(absl::Milliseconds(5));
  }
  continue_due(true);
  stop_load = true;
  for (std::thread& t : clients) t.join();
  for (std::thread& t : bursts) t.join();
  sampler.join();

  // Every request's end.
  std::map<std::string, int> by_status;
  std::vector<double> latency_in_faults, latency_outside;
  int violations = 0;
  for (const Outcome& o : outcomes) {
    ++by_status[o.status.ok() ? std::string("OK")
                              : absl::StrCat(static_cast<int>(o.status.error_code()))];
    const std::string v = Violation(o, want);
    if (!v.empty() && ++violations <= 20) {
      ADD_FAILURE() << "request of kind " << o.kind << " ("
                    << absl::FormatTime("%H:%M:%E3S", o.end, absl::LocalTimeZone()) << "): " << v;
    }
    if (!o.status.ok() || o.cancelled_by_client) continue;
    const bool in_fault =
        std::any_of(fault_windows.begin(), fault_windows.end(),
                    [&](const auto& w) { return o.start < w.second && o.end > w.first; });
    (in_fault ? latency_in_faults : latency_outside)
        .push_back(absl::ToDoubleMilliseconds(o.end - o.start));
  }

  // After the load: the group serves again, every block is free, the pool's outputs are the same.
  HealthChecker health(c.address());
  EXPECT_TRUE(WaitUntilServing(health, absl::Seconds(90))) << "the group did not come back";
  absl::StatusOr<v1::GetStatsResponse> stats = WaitUntilAllBlocksFree(stub, absl::Seconds(60));
  EXPECT_TRUE(stats.ok()) << stats.status();
  for (const Outcome& o : RunPool(stub, pool)) {
    EXPECT_TRUE(o.status.ok()) << o.status.error_message();
    EXPECT_EQ(o.tokens, want[o.kind]) << "request " << o.kind << " after the faults";
  }
  stats = WaitUntilAllBlocksFree(stub, absl::Seconds(60));
  EXPECT_TRUE(stats.ok()) << stats.status();
  // Measured once the scheduler has returned its free heap pages (every 10 s), not in the
  // middle of what the last requests held.
  absl::SleepFor(absl::Seconds(11));
  const int64_t rss_after = StatusKiB(scheduler, "VmRSS");
  const int64_t anon_after = StatusKiB(scheduler, "RssAnon");
  EXPECT_EQ(c.SchedulerPid(), scheduler);
  EXPECT_LE(rss_after, rss_before * 105 / 100)
      << "the scheduler's resident memory grew from " << rss_before << " KiB to " << rss_after;

  // A SIGTERM drain in the middle of requests: each ends with its output or says why.
  std::vector<Outcome> drained(8);
  std::vector<std::thread> last;
  for (int i = 0; i < 8; ++i) {
    last.emplace_back([&, i] { drained[i] = Call(stub, pool, 3 + 4 * (i % 6)); });
  }
  for (const absl::Time guard = absl::Now() + absl::Seconds(10); absl::Now() < guard;) {
    absl::StatusOr<v1::GetStatsResponse> s = GetStats(stub);
    if (s.ok() && s->num_running() + s->num_waiting() >= 8) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  absl::StatusOr<int> exit_status = c.Stop();  // SIGTERM; every process gone
  for (std::thread& t : last) t.join();
  EXPECT_TRUE(exit_status.ok()) << exit_status.status();
  for (const Outcome& o : drained) {
    const std::string v = Violation(o, want);
    EXPECT_TRUE(v.empty()) << "drained request of kind " << o.kind << ": " << v;
  }
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(shm_dir)) {
    left.push_back(e.path().filename());
  }
  EXPECT_TRUE(left.empty()) << "shared-memory files left: " << absl::StrJoin(left, ", ");
  std::filesystem::remove_all(shm_dir);

  std::printf("chaos: faults injected:\n");
  for (const auto& [name, n] : injected) std::printf("  %3d  %s\n", n, name.c_str());
  std::printf("chaos: %zu requests by status (gRPC code):\n", outcomes.size());
  for (const auto& [name, n] : by_status) std::printf("  %5d  %s\n", n, name.c_str());
  std::printf(
      "chaos: latency of the requests served whole, ms: outside faults p50 %.0f p99 %.0f (%zu), "
      "during faults p50 %.0f p99 %.0f (%zu)\n",
      Percentile(latency_outside, 0.5), Percentile(latency_outside, 0.99), latency_outside.size(),
      Percentile(latency_in_faults, 0.5), Percentile(latency_in_faults, 0.99),
      latency_in_faults.size());
  std::printf(
      "chaos: scheduler resident memory %lld KiB before the faults, %lld KiB after (anonymous: "
      "%lld, %lld; every 5 s: %s)\n",
      static_cast<long long>(rss_before), static_cast<long long>(rss_after),
      static_cast<long long>(anon_before), static_cast<long long>(anon_after),
      absl::StrJoin(rss_samples, " ").c_str());
  std::printf("chaos: %d invariant violation(s)\n", violations);
  EXPECT_EQ(violations, 0);
}

}  // namespace
}  // namespace llm::testing
