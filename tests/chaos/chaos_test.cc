// Chaos under load: a local cluster at tensor parallelism 2 (real llm-cluster, llm-scheduler and
// llm-worker processes on loopback) serves a steady mixed load while an injector, at random
// moments, SIGKILLs a worker, SIGSTOPs one for a random time (below and past the worker timeout),
// cuts the workers' network for a random time (they run in a network namespace of their own
// where the test may create one: netns_harness.h), or fires a burst past the admission limit;
// faults may overlap (a second one before the first is repaired). A second, shorter phase SIGKILLs
// the scheduler too (llm-cluster restarts it on its port over the same workers), among the same
// worker faults. The load: streaming requests of a fixed pool (prompts of 4 to about 250 tokens,
// greedy and seeded, n = 1 and 2, 8 to 48 tokens), some cancelled after a few responses, some with
// short deadlines; the KV cache is small enough that requests are preempted, and prefixes repeat.
//
// Invariants, checked on every request: the tokens a stream received are a prefix of that request's
// undisturbed output (measured twice before the faults, and equal); a request that ends OK received
// all of it; any other end is CANCELLED (only when the client cancelled), DEADLINE_EXCEEDED (only
// with a deadline of its own: without one, hitting the hang guard is a hang), RESOURCE_EXHAUSTED
// naming the limit, or UNAVAILABLE naming the cause (a worker rank, recovery, shutdown) or, while a
// killed scheduler is away, in gRPC's words, within 5 s of the kill for a call it was serving.
// After each phase: the group serves again, every block is free, the pool's requests give their
// undisturbed outputs again (prefix cache included); the scheduler's resident memory grew at most
// 5% over the first phase, and so did the anonymous memory of each worker process that lived 45 s
// of it (ExpectWorkersMemoryFlat); at the end a SIGTERM drain in the middle of requests ends them
// well and leaves no process and no shared-memory file.
//
// Seeded and replayable: LLM_CHAOS_SEED chooses the fault schedules (printed first), which the same
// seed reproduces; LLM_CHAOS_SECONDS the length of the first phase (default 60, as in `make test`;
// `make chaos MINUTES=30` runs longer with a fresh seed), the second lasting a sixth of it, at
// least 15 s. Deadlines are hang guards; what the test asserts does not depend on timing.
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
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
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/netns_harness.h"
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

// What is wrong with `o`, given the undisturbed outputs; empty when nothing. `scheduler_down`:
// its call overlapped a killed scheduler's absence, when gRPC itself says UNAVAILABLE (the
// connection ended, or none could be made) in words of its own.
std::string Violation(const Outcome& o, const std::vector<Tokens>& want,
                      bool scheduler_down = false) {
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
      if (scheduler_down) return "";
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
  enum Type { kKill, kStopShort, kStopLong, kCut, kBurst, kKillScheduler } type;
  double at_s;
  int rank;           // which of the workers alive then (by pid order)
  double duration_s;  // stops and cuts
};

const char* Name(Fault::Type t) {
  switch (t) {
    case Fault::kKill:
      return "SIGKILL";
    case Fault::kStopShort:
      return "SIGSTOP below the worker timeout";
    case Fault::kStopLong:
      return "SIGSTOP past the worker timeout";
    case Fault::kCut:
      return "the workers' network cut";
    case Fault::kBurst:
      return "burst past the admission limit";
    case Fault::kKillScheduler:
      return "SIGKILL of the scheduler";
  }
  return "?";
}

// The faults of a phase of `seconds`, from `seed` alone. With `scheduler_kills`, about one in
// four SIGKILLs the scheduler, and at least one does.
std::vector<Fault> Schedule(uint64_t seed, double seconds, bool scheduler_kills) {
  Rng rng(seed);
  std::vector<Fault> faults;
  for (double t = 2;;) {
    t += rng.Uniform(1.5, 8);
    if (t > seconds - 3) break;
    const double r = rng.Uniform(0, 1);
    Fault f{.type = r < 0.25   ? Fault::kKill
                    : r < 0.4  ? Fault::kStopShort
                    : r < 0.65 ? Fault::kStopLong
                    : r < 0.8  ? Fault::kCut
                               : Fault::kBurst,
            .at_s = t,
            .rank = rng.Below(2),
            .duration_s = 0};
    if (f.type == Fault::kStopShort) f.duration_s = rng.Uniform(0.3, 2);
    if (f.type == Fault::kStopLong) f.duration_s = rng.Uniform(4, 12);
    if (f.type == Fault::kCut) f.duration_s = rng.Uniform(0.5, 10);
    f.duration_s = std::min(f.duration_s, std::max(0.0, seconds - 1 - t));
    if (scheduler_kills && rng.Uniform(0, 1) < 0.25) {
      f.type = Fault::kKillScheduler;
      f.duration_s = 0;
    }
    faults.push_back(f);
  }
  if (!scheduler_kills) return faults;
  const auto is_kill = [](const Fault& f) { return f.type == Fault::kKillScheduler; };
  if (!faults.empty() && std::none_of(faults.begin(), faults.end(), is_kill)) {
    faults[faults.size() / 2].type = Fault::kKillScheduler;
    faults[faults.size() / 2].duration_s = 0;
  }
  // The first scheduler kill, and half of the others, find a worker stopped past the worker
  // timeout, which the new scheduler must still bring into its group.
  std::vector<Fault> stalls;
  for (const Fault& f : faults) {
    if (!is_kill(f) || (!stalls.empty() && rng.Below(2) == 0)) continue;
    const double at = std::max(0.5, f.at_s - rng.Uniform(0.3, 1.5));
    stalls.push_back({.type = Fault::kStopLong,
                      .at_s = at,
                      .rank = rng.Below(2),
                      .duration_s = std::min(rng.Uniform(4, 8), std::max(0.0, seconds - 1 - at))});
  }
  faults.insert(faults.end(), stalls.begin(), stalls.end());
  std::stable_sort(faults.begin(), faults.end(),
                   [](const Fault& a, const Fault& b) { return a.at_s < b.at_s; });
  return faults;
}

void PrintSchedule(const char* phase, const std::vector<Fault>& schedule, double seconds) {
  std::printf("chaos: %s, %.0f s, %zu faults:\n", phase, seconds, schedule.size());
  for (const Fault& f : schedule) {
    std::printf("  +%5.1f s  %s%s%s\n", f.at_s, Name(f.type),
                f.type == Fault::kKillScheduler || f.type == Fault::kBurst || f.type == Fault::kCut
                    ? ""
                    : absl::StrCat(", worker ", f.rank).c_str(),
                f.duration_s > 0 ? absl::StrCat(", for ", f.duration_s, " s").c_str() : "");
  }
  std::fflush(stdout);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// What one phase of faulted load gave.
struct Phase {
  std::vector<Outcome> outcomes;
  std::vector<std::pair<absl::Time, absl::Time>> fault_windows;  // for the latency figures
  std::vector<absl::Time> scheduler_kills;
  // Kill time -> seconds until a fresh channel saw SERVING.
  std::map<absl::Time, double> scheduler_back_s;
  std::map<std::string, int> injected;  // by kind
  std::vector<int64_t> anon_samples;    // the sampled process's RssAnon in KiB, every 5 s
  // With a sampled process: each worker process's RssAnon in KiB every 5 s while the group
  // serves, by pid, with the seconds since the phase began.
  std::map<pid_t, std::vector<std::pair<double, int64_t>>> worker_anon;
};

// `kLoadThreads` clients, each keeping a request of the pool in flight (some cancelled, some
// with deadlines), on `c` for `seconds` while `schedule` is injected; the client's random
// choices come from `seed`. The workers' network is host 0 of `net` (null: no cuts). When
// `sample` > 0, its anonymous resident memory every 5 s.
Phase RunFaultedLoad(LocalCluster& c, NetworkGuard* net, const std::vector<Kind>& pool,
                     const std::vector<Fault>& schedule, double seconds, uint64_t seed,
                     pid_t sample) {
  Phase phase;
  v1::LLMService::Stub& stub = c.stub();
  std::mutex mu;
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
          phase.outcomes.push_back(std::move(o));
        }
        if (refused) absl::SleepFor(absl::Milliseconds(100));
      }
    });
  }

  const absl::Time started = absl::Now();
  std::thread sampler([&] {
    while (sample > 0 && !stop_load) {
      for (int i = 0; i < 500 && !stop_load; ++i) absl::SleepFor(absl::Milliseconds(10));
      phase.anon_samples.push_back(StatusKiB(sample, "RssAnon"));
      // The workers only while the group serves: a worker frees its KV cache when the group
      // fails and allocates it again at the next Init.
      if (HealthChecker(c.address()).Check("", absl::Milliseconds(200)) !=
          HealthChecker::kServing) {
        continue;
      }
      const double at = absl::ToDoubleSeconds(absl::Now() - started);
      for (pid_t pid : c.WorkerPids()) {
        if (const int64_t kib = StatusKiB(pid, "RssAnon"); kib > 0) {
          phase.worker_anon[pid].push_back({at, kib});
        }
      }
    }
  });

  // The faults, on this thread.
  std::vector<std::thread> bursts, watchers;
  struct Stopped {
    pid_t pid;
    absl::Time at, until;
  };
  std::vector<Stopped> stopped;
  std::optional<std::pair<absl::Time, absl::Time>> cut;  // from, until
  const absl::Time t0 = absl::Now();
  auto continue_due = [&](bool all) {
    if (cut.has_value() && (all || absl::Now() >= cut->second)) {
      const absl::Status s = net->SetHostLink(0, true);
      EXPECT_TRUE(s.ok()) << s;
      std::lock_guard<std::mutex> lock(mu);
      phase.fault_windows.push_back({cut->first, absl::Now() + absl::Seconds(5)});
      cut.reset();
    }
    for (auto it = stopped.begin(); it != stopped.end();) {
      if (!all && absl::Now() < it->until) {
        ++it;
        continue;
      }
      kill(it->pid, SIGCONT);
      std::lock_guard<std::mutex> lock(mu);
      phase.fault_windows.push_back({it->at, absl::Now() + absl::Seconds(5)});
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
          phase.outcomes.push_back(std::move(o));
        });
      }
      std::lock_guard<std::mutex> lock(mu);
      phase.fault_windows.push_back({absl::Now(), absl::Now() + absl::Seconds(3)});
    } else if (f.type == Fault::kCut) {
      if (net == nullptr) {
        ++phase.injected["skipped: no network namespace for the workers"];
        continue;
      }
      const absl::Time until = absl::Now() + absl::Seconds(f.duration_s);
      if (cut.has_value()) {
        cut->second = std::max(cut->second, until);  // a cut during a cut lengthens it
      } else {
        const absl::Status s = net->SetHostLink(0, false);
        EXPECT_TRUE(s.ok()) << s;
        cut = {absl::Now(), until};
      }
    } else if (f.type == Fault::kKillScheduler) {
      const pid_t scheduler = c.SchedulerPid();
      if (scheduler == 0) {
        ++phase.injected["skipped: no scheduler alive"];
        continue;
      }
      kill(scheduler, SIGKILL);
      const absl::Time killed = absl::Now();
      // How soon the new scheduler serves, through a new channel each time (no reconnect
      // backoff of the clients' channel in the figure).
      watchers.emplace_back([&, killed] {
        while (absl::Now() < killed + absl::Seconds(60)) {
          if (HealthChecker(c.address()).Check("", absl::Milliseconds(200)) ==
              HealthChecker::kServing) {
            std::lock_guard<std::mutex> lock(mu);
            phase.scheduler_back_s[killed] = absl::ToDoubleSeconds(absl::Now() - killed);
            return;
          }
          absl::SleepFor(absl::Milliseconds(20));
        }
      });
      std::lock_guard<std::mutex> lock(mu);
      phase.scheduler_kills.push_back(killed);
      phase.fault_windows.push_back({killed, killed + absl::Seconds(5)});
    } else {
      const std::vector<pid_t> workers = c.WorkerPids();
      if (workers.empty()) {
        ++phase.injected["skipped: no worker alive"];
        continue;
      }
      const pid_t pid = workers[f.rank % workers.size()];
      if (f.type == Fault::kKill) {
        kill(pid, SIGKILL);
        std::erase_if(stopped, [pid](const Stopped& s) { return s.pid == pid; });
        std::lock_guard<std::mutex> lock(mu);
        phase.fault_windows.push_back({absl::Now(), absl::Now() + absl::Seconds(5)});
      } else {
        kill(pid, SIGSTOP);
        stopped.push_back({pid, absl::Now(), absl::Now() + absl::Seconds(f.duration_s)});
      }
    }
    ++phase.injected[Name(f.type)];
  }
  while (absl::Now() < t0 + absl::Seconds(seconds)) {
    continue_due(false);
    absl::SleepFor(absl::Milliseconds(5));
  }
  continue_due(true);
  stop_load = true;
  for (std::thread& t : clients) t.join();
  for (std::thread& t : bursts) t.join();
  for (std::thread& t : watchers) t.join();
  sampler.join();
  return phase;
}

// For each scheduler kill, the time its clients may be told UNAVAILABLE in gRPC's words: from the
// kill until the start of the first call after it that was served (got a token).
std::vector<std::pair<absl::Time, absl::Time>> SchedulerDownWindows(const Phase& phase) {
  std::vector<std::pair<absl::Time, absl::Time>> windows;
  for (absl::Time kill : phase.scheduler_kills) {
    absl::Time back = absl::InfiniteFuture();
    for (const Outcome& o : phase.outcomes) {
      if (o.start > kill && !o.tokens.empty()) back = std::min(back, o.start);
    }
    windows.push_back({kill, back});
  }
  return windows;
}

// Checks every request of `phase` (ADD_FAILURE for the first 20 violations), prints its figures
// under `title`; the number of violations.
int CheckAndReport(const char* title, const Phase& phase, const std::vector<Tokens>& want) {
  const std::vector<std::pair<absl::Time, absl::Time>> down = SchedulerDownWindows(phase);
  std::map<std::string, int> by_status;
  std::vector<double> latency_in_faults, latency_outside;
  int violations = 0;
  const auto overlaps = [](const Outcome& o, const std::pair<absl::Time, absl::Time>& w) {
    return o.start < w.second && o.end > w.first;
  };
  for (const Outcome& o : phase.outcomes) {
    ++by_status[o.status.ok() ? std::string("OK")
                              : absl::StrCat(static_cast<int>(o.status.error_code()))];
    const bool scheduler_down =
        std::any_of(down.begin(), down.end(), [&](const auto& w) { return overlaps(o, w); });
    std::string v = Violation(o, want, scheduler_down);
    // A killed scheduler's calls end with its connections, at once: none waits for a guard.
    for (absl::Time kill : phase.scheduler_kills) {
      if (v.empty() && !o.status.ok() && o.start < kill && o.end > kill + absl::Seconds(5)) {
        v = absl::StrCat("ended ", absl::FormatDuration(o.end - kill),
                         " after the scheduler was killed: ", o.status.error_message());
      }
    }
    if (!v.empty() && ++violations <= 20) {
      ADD_FAILURE() << title << ": request of kind " << o.kind << " ("
                    << absl::FormatTime("%H:%M:%E3S", o.end, absl::LocalTimeZone()) << "): " << v;
    }
    if (!o.status.ok() || o.cancelled_by_client) continue;
    const bool in_fault = std::any_of(phase.fault_windows.begin(), phase.fault_windows.end(),
                                      [&](const auto& w) { return overlaps(o, w); });
    (in_fault ? latency_in_faults : latency_outside)
        .push_back(absl::ToDoubleMilliseconds(o.end - o.start));
  }

  std::printf("chaos: %s: faults injected:\n", title);
  for (const auto& [name, n] : phase.injected) std::printf("  %3d  %s\n", n, name.c_str());
  std::printf("chaos: %s: %zu requests by status (gRPC code):\n", title, phase.outcomes.size());
  for (const auto& [name, n] : by_status) std::printf("  %5d  %s\n", n, name.c_str());
  std::printf(
      "chaos: %s: latency of the requests served whole, ms: outside faults p50 %.0f p99 %.0f "
      "(%zu), during faults p50 %.0f p99 %.0f (%zu)\n",
      title, Percentile(latency_outside, 0.5), Percentile(latency_outside, 0.99),
      latency_outside.size(), Percentile(latency_in_faults, 0.5),
      Percentile(latency_in_faults, 0.99), latency_in_faults.size());
  if (!down.empty()) {
    // Per kill: "to SERVING on a new channel / to the next call served", in seconds.
    std::vector<std::string> gaps;
    for (const auto& [kill, back] : down) {
      auto it = phase.scheduler_back_s.find(kill);
      gaps.push_back(absl::StrFormat(
          "%s/%.2f", it == phase.scheduler_back_s.end() ? "-" : absl::StrFormat("%.2f", it->second),
          absl::ToDoubleSeconds(back - kill)));
    }
    std::printf(
        "chaos: %s: from each scheduler kill to SERVING on a new channel / to the next call "
        "served, "
        "s: %s\n",
        title, absl::StrJoin(gaps, " ").c_str());
  }
  std::printf("chaos: %s: %d invariant violation(s)\n", title, violations);
  std::fflush(stdout);
  return violations;
}

// The workers' anonymous memory over a phase. Workers are killed and restarted through the run,
// so each worker process is checked over its own life, if it was sampled over at least 45 s:
// the median of its samples over its last 15 s against the median of those between 10 and 25 s
// after its first (sampled while the group served, so with its KV cache allocated, and poisoned
// whole at Init: resident). At most 5% growth.
void ExpectWorkersMemoryFlat(const Phase& phase) {
  auto median = [](std::vector<int64_t> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? int64_t{-1} : v[v.size() / 2];
  };
  int checked = 0;
  for (const auto& [pid, samples] : phase.worker_anon) {
    const double first = samples.front().first;
    const double last = samples.back().first;
    if (last - first < 45) continue;
    std::vector<int64_t> early, late;
    for (const auto& [at, kib] : samples) {
      if (at >= first + 10 && at <= first + 25) early.push_back(kib);
      if (at >= last - 15) late.push_back(kib);
    }
    const int64_t baseline = median(early), final = median(late);
    if (baseline < 0 || final < 0) continue;
    ++checked;
    EXPECT_LE(final, baseline * 105 / 100)
        << "worker " << pid << "'s anonymous memory grew from " << baseline << " KiB to " << final
        << " KiB over " << last - first << " s";
    std::printf("chaos: worker %d, sampled over %.0f s: anonymous memory %lld KiB -> %lld KiB\n",
                static_cast<int>(pid), last - first, static_cast<long long>(baseline),
                static_cast<long long>(final));
  }
  if (checked == 0) {
    std::printf("chaos: no worker process was sampled over 45 s; workers' memory not checked\n");
  }
}

// After a phase: the group serves again, every block is free, and the pool's requests give
// their undisturbed outputs (through the prefix cache when it survived).
void ExpectServesUndisturbedOutputs(LocalCluster& c, const std::vector<Kind>& pool,
                                    const std::vector<Tokens>& want, const char* after) {
  HealthChecker health(c.address());
  EXPECT_TRUE(WaitUntilServing(health, absl::Seconds(90))) << "not serving after " << after;
  absl::StatusOr<v1::GetStatsResponse> stats = WaitUntilAllBlocksFree(c.stub(), absl::Seconds(60));
  EXPECT_TRUE(stats.ok()) << after << ": " << stats.status();
  for (const Outcome& o : RunPool(c.stub(), pool)) {
    EXPECT_TRUE(o.status.ok()) << after << ": " << o.status.error_message();
    EXPECT_EQ(o.tokens, want[o.kind]) << "request " << o.kind << " after " << after;
  }
  stats = WaitUntilAllBlocksFree(c.stub(), absl::Seconds(60));
  EXPECT_TRUE(stats.ok()) << after << ": " << stats.status();
}

// Phase one: SIGKILLs and SIGSTOPs of workers and bursts past the admission limit, with the
// scheduler's memory watched. Phase two: the same with the scheduler killed as well (llm-cluster
// restarts it on its port over the same workers), where its clients may only be told UNAVAILABLE
// at once. Then a SIGTERM drain.
TEST(ChaosTest, FaultsUnderLoadLoseNoTokenHangNothingAndLeakNothing) {
  const uint64_t seed = static_cast<uint64_t>(EnvInt("LLM_CHAOS_SEED", 20261128));
  const double seconds = static_cast<double>(EnvInt("LLM_CHAOS_SECONDS", 60));
  const double scheduler_seconds = std::max(15.0, seconds / 6);
  const std::vector<Fault> schedule = Schedule(seed, seconds, false);
  const std::vector<Fault> scheduler_schedule = Schedule(seed + 1, scheduler_seconds, true);
  std::printf("chaos: seed %llu (LLM_CHAOS_SEED), %.0f s (LLM_CHAOS_SECONDS)\n",
              static_cast<unsigned long long>(seed), seconds);
  PrintSchedule("workers' faults", schedule, seconds);
  PrintSchedule("with the scheduler's", scheduler_schedule, scheduler_seconds);

  const std::string shm_dir =
      std::filesystem::temp_directory_path() / absl::StrCat("llm-chaos-shm-", getpid());
  std::filesystem::create_directories(shm_dir);

  // The workers' own host: a network namespace behind a link the injector cuts (both ranks at
  // once; their collectives go through shared memory, not that link). Destroyed after the
  // cluster (declared before it).
  std::unique_ptr<NetworkGuard> net;
  std::string no_cuts = CannotUseNetns();
  if (no_cuts.empty()) {
    net = std::make_unique<NetworkGuard>(214);
    if (absl::Status s = net->Build(1); !s.ok()) {
      no_cuts = s.ToString();
      net.reset();
    }
  }
  if (!no_cuts.empty()) {
    std::printf("chaos: NO NETWORK CUTS in this run, the workers stay on loopback: %s\n",
                no_cuts.c_str());
  }
  const std::string wrapper = shm_dir + "-worker-in-netns.sh";
  ClusterOptions options{.tensor_parallel_size = 2,
                         .restart_workers = true,
                         .restart_scheduler = true,
                         .restart_delay_s = 0.5};
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
  if (net != nullptr) {
    // llm-cluster starts (and restarts) each worker through this script, in the namespace.
    std::ofstream(wrapper) << "#!/bin/sh\nexec ip netns exec " << net->Host(0) << " " << LLM_BIN_DIR
                           << "/llm-worker \"$@\"\n";
    std::filesystem::permissions(wrapper, std::filesystem::perms::owner_all);
    options.worker_binary = wrapper;
    options.worker_host = net->HostAddress(0);
    options.engine.push_back({"rendezvous_host", net->SchedulerAddress()});
  }
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
  // The scheduler started itself again without glibc's per-thread caches (scheduler_main.cc),
  // which the memory check below depends on.
  {
    std::ifstream environ(absl::StrCat("/proc/", scheduler, "/environ"));
    const std::string env((std::istreambuf_iterator<char>(environ)),
                          std::istreambuf_iterator<char>());
    EXPECT_TRUE(absl::StrContains(env, "GLIBC_TUNABLES=glibc.malloc.tcache_count=0"))
        << "the scheduler runs with glibc's per-thread caches";
  }
  const int64_t rss_before = StatusKiB(scheduler, "VmRSS");
  const int64_t anon_before = StatusKiB(scheduler, "RssAnon");

  const Phase workers_phase =
      RunFaultedLoad(c, net.get(), pool, schedule, seconds, seed, scheduler);
  const int violations = CheckAndReport("workers' faults", workers_phase, want);
  EXPECT_EQ(violations, 0);
  ExpectServesUndisturbedOutputs(c, pool, want, "the workers' faults");

  // Measured once the scheduler has returned its free heap pages (every 10 s), not in the
  // middle of what the last requests held.
  absl::SleepFor(absl::Seconds(11));
  const int64_t rss_after = StatusKiB(scheduler, "VmRSS");
  const int64_t anon_after = StatusKiB(scheduler, "RssAnon");
  EXPECT_EQ(c.SchedulerPid(), scheduler);
  EXPECT_LE(rss_after, rss_before * 105 / 100)
      << "the scheduler's resident memory grew from " << rss_before << " KiB to " << rss_after;
  std::printf(
      "chaos: scheduler resident memory %lld KiB before the faults, %lld KiB after (anonymous: "
      "%lld, %lld; every 5 s: %s)\n",
      static_cast<long long>(rss_before), static_cast<long long>(rss_after),
      static_cast<long long>(anon_before), static_cast<long long>(anon_after),
      absl::StrJoin(workers_phase.anon_samples, " ").c_str());
  ExpectWorkersMemoryFlat(workers_phase);

  const Phase scheduler_phase =
      RunFaultedLoad(c, net.get(), pool, scheduler_schedule, scheduler_seconds, seed + 1, 0);
  EXPECT_EQ(CheckAndReport("with the scheduler's", scheduler_phase, want), 0);
  EXPECT_NE(c.SchedulerPid(), scheduler) << "the scheduler was killed but not restarted";
  ExpectServesUndisturbedOutputs(c, pool, want, "the scheduler's faults");

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
  std::filesystem::remove(wrapper);
}

}  // namespace
}  // namespace llm::testing
