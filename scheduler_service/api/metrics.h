// Prometheus metrics of llm-scheduler, under vLLM's names so that dashboards made for vLLM
// work unchanged.
//
// MetricsRegistry is a small registry of counters, gauges and histograms rendered in the text
// exposition format 0.0.4 (# HELP / # TYPE, then one line per sample), as prometheus_client
// writes it: a counter `x` is exposed as `x_total`, a histogram `h` as `h_bucket{le=...}`
// (cumulative, ending with le="+Inf"), `h_sum` and `h_count`. Every sample carries the
// registry's constant labels (model_name) before its own.
//
// ServingMetrics holds vLLM's metric set on one registry:
//   recorded per request by LLMService (so gRPC and HTTP clients both count):
//     vllm:prompt_tokens, vllm:generation_tokens, vllm:request_success{finished_reason},
//     vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds (one observation
//     per request per step that produced tokens), vllm:e2e_request_latency_seconds;
//   set from the engine's stats at scrape time (UpdateFromStats):
//     vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc
//     (a fraction in [0, 1], as vLLM's), vllm:prefix_cache_queries, vllm:prefix_cache_hits
//     (tokens), vllm:num_preemptions; and ours, vLLM having none:
//     llm:kv_blocks_released_by_window (blocks given back before their sequences ended, a
//     model whose every layer has a sliding window),
//     llm:worker_memory_bytes{kind} (rank 0's worker, from its last step: kind resident,
//     weights, coded_weights, kv_cache_reserved, kv_cache_resident, swap_reserved,
//     swap_resident, activations, other = resident - weights - kv_cache_resident -
//     swap_resident - activations on cpu, whose every kind is host memory) and
//     llm:worker_constrained_samples (tokens rank 0 sampled under a structured output's mask).
//
// Thread-safety: every method is thread-safe. Metric pointers stay valid as long as their
// registry.
#ifndef LLM_SCHEDULER_SERVICE_API_METRICS_H_
#define LLM_SCHEDULER_SERVICE_API_METRICS_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "llm/v1/llm_service.pb.h"

namespace llm {

// Label name/value pairs, in the order they are written.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class MetricFamily {
 public:
  virtual ~MetricFamily() = default;
  // Appends the family's # HELP, # TYPE and sample lines; `const_labels` go first on each.
  virtual void Render(const MetricLabels& const_labels, std::string* out) const = 0;
};

// A monotonically increasing value per label set (written as <name>_total).
class Counter final : public MetricFamily {
 public:
  Counter(std::string name, std::string help) : name_(std::move(name)), help_(std::move(help)) {}
  void Inc(double v = 1, const MetricLabels& labels = {});
  // For totals kept elsewhere (the engine's cumulative stats): sets the value.
  void Set(double v, const MetricLabels& labels = {});
  double Value(const MetricLabels& labels = {}) const;
  void Render(const MetricLabels& const_labels, std::string* out) const override;

 private:
  const std::string name_;
  const std::string help_;
  mutable absl::Mutex mu_;
  std::map<MetricLabels, double> values_ ABSL_GUARDED_BY(mu_);
};

class Gauge final : public MetricFamily {
 public:
  Gauge(std::string name, std::string help) : name_(std::move(name)), help_(std::move(help)) {}
  void Set(double v, const MetricLabels& labels = {});
  double Value(const MetricLabels& labels = {}) const;
  void Render(const MetricLabels& const_labels, std::string* out) const override;

 private:
  const std::string name_;
  const std::string help_;
  mutable absl::Mutex mu_;
  std::map<MetricLabels, double> values_ ABSL_GUARDED_BY(mu_);
};

class Histogram final : public MetricFamily {
 public:
  // `bounds`: the buckets' upper bounds, increasing (+Inf is implicit).
  Histogram(std::string name, std::string help, std::vector<double> bounds);
  void Observe(double v);
  uint64_t Count() const;
  double Sum() const;
  void Render(const MetricLabels& const_labels, std::string* out) const override;

 private:
  const std::string name_;
  const std::string help_;
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // per bucket, not cumulative; +Inf last
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
};

class MetricsRegistry {
 public:
  explicit MetricsRegistry(MetricLabels const_labels = {})
      : const_labels_(std::move(const_labels)) {}
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // `name` without the _total suffix.
  Counter* AddCounter(const std::string& name, const std::string& help);
  Gauge* AddGauge(const std::string& name, const std::string& help);
  Histogram* AddHistogram(const std::string& name, const std::string& help,
                          std::vector<double> bounds);
  // Every family in the order added, in the text format 0.0.4.
  std::string Render() const;

 private:
  const MetricLabels const_labels_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<MetricFamily>> families_ ABSL_GUARDED_BY(mu_);
};

// A number as Prometheus' text format writes it: the shortest form that reads back exactly,
// "+Inf", "-Inf", "NaN".
std::string FormatMetricValue(double v);

// vLLM's metric set for one served model.
struct ServingMetrics {
  explicit ServingMetrics(const std::string& model_name);

  // The scrape-time values from GetStats.
  void UpdateFromStats(const v1::GetStatsResponse& stats);

  MetricsRegistry registry;
  Gauge* num_requests_running;
  Gauge* num_requests_waiting;
  Gauge* kv_cache_usage_perc;
  Counter* prefix_cache_queries;
  Counter* prefix_cache_hits;
  Counter* num_preemptions;
  Counter* window_released_blocks;
  Counter* prompt_tokens;
  Counter* generation_tokens;
  Counter* request_success;  // label finished_reason: stop, length, abort
  Histogram* time_to_first_token_seconds;
  Histogram* inter_token_latency_seconds;
  Histogram* e2e_request_latency_seconds;
  Gauge* worker_memory_bytes;  // label kind (see above)
  Gauge* worker_constrained_samples;
};

// The worker's resident bytes not accounted for by a kind (libraries, gRPC, scratch of the
// ops, malloc's slack): resident - weights - kv_cache_resident - swap_resident - activations,
// at least 0. Meaningful on cpu, where every kind is host memory.
uint64_t OtherResidentBytes(const v1::WorkerStats::Memory& m);

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_API_METRICS_H_
