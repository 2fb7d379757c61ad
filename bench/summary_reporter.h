// A console reporter that also keeps each benchmark's time per iteration, so that a
// benchmark's main() can print a summary: figures, ratios against the baselines run in the
// same process, and the targets.
#ifndef LLM_BENCH_SUMMARY_REPORTER_H_
#define LLM_BENCH_SUMMARY_REPORTER_H_

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"

namespace llm {

class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  // kCpu: this thread's CPU time (on a shared machine wall time also counts the time other
  // processes hold the core); kReal: wall time (what multi-threaded work needs).
  enum class Clock { kReal, kCpu };
  explicit SummaryReporter(Clock clock = Clock::kReal) : clock_(clock) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.error_occurred) continue;
      std::string name = r.benchmark_name();
      for (const char* suffix : {"/iterations", "/repeats", "/real_time"}) {
        if (auto pos = name.find(suffix); pos != std::string::npos) name.resize(pos);
      }
      const double t = clock_ == Clock::kCpu ? r.GetAdjustedCPUTime() : r.GetAdjustedRealTime();
      const double ns = t * 1e9 / benchmark::GetTimeUnitMultiplier(r.time_unit);
      auto [it, inserted] = ns_.emplace(name, ns);  // the best of the repetitions
      if (!inserted) it->second = std::min(it->second, ns);
    }
  }

  // Nanoseconds per iteration of the named benchmark ("BM_X/arg:1"); 0 when it did not run.
  double ns(const std::string& name) const {
    auto it = ns_.find(name);
    return it == ns_.end() ? 0.0 : it->second;
  }
  double seconds(const std::string& name) const { return ns(name) * 1e-9; }

 private:
  Clock clock_;
  std::map<std::string, double> ns_;
};

// A benchmark program's main(): runs what the command line selects, then `summary`.
inline int RunBenchmarksWithSummary(int argc, char** argv, SummaryReporter& reporter,
                                    const std::function<void(const SummaryReporter&)>& summary) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  summary(reporter);
  benchmark::Shutdown();
  return 0;
}

}  // namespace llm

#endif  // LLM_BENCH_SUMMARY_REPORTER_H_
