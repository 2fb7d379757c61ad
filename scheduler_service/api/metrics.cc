#include "scheduler_service/api/metrics.h"

#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace llm {
namespace {

// Label values escape backslash, double quote and newline; HELP text backslash and newline.
std::string Escape(const std::string& s, bool quote) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

void Header(const std::string& name, const std::string& help, const char* type, std::string* out) {
  absl::StrAppend(out, "# HELP ", name, " ", Escape(help, false), "\n# TYPE ", name, " ", type,
                  "\n");
}

// `name{l1="v1",...} value\n`.
void Sample(const std::string& name, const MetricLabels& a, const MetricLabels& b, double value,
            std::string* out) {
  out->append(name);
  if (!a.empty() || !b.empty()) {
    out->push_back('{');
    bool first = true;
    for (const MetricLabels* ls : {&a, &b}) {
      for (const auto& [k, v] : *ls) {
        if (!first) out->push_back(',');
        first = false;
        absl::StrAppend(out, k, "=\"", Escape(v, true), "\"");
      }
    }
    out->push_back('}');
  }
  absl::StrAppend(out, " ", FormatMetricValue(value), "\n");
}

}  // namespace

std::string FormatMetricValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

void Counter::Inc(double v, const MetricLabels& labels) {
  if (v < 0) return;  // counters never decrease
  absl::MutexLock lock(&mu_);
  values_[labels] += v;
}

void Counter::Set(double v, const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  values_[labels] = v;
}

double Counter::Value(const MetricLabels& labels) const {
  absl::MutexLock lock(&mu_);
  auto it = values_.find(labels);
  return it == values_.end() ? 0 : it->second;
}

void Counter::Render(const MetricLabels& const_labels, std::string* out) const {
  const std::string total = name_ + "_total";
  Header(total, help_, "counter", out);
  absl::MutexLock lock(&mu_);
  if (values_.empty()) {
    Sample(total, const_labels, {}, 0, out);  // an unlabelled counter starts at 0
    return;
  }
  for (const auto& [labels, v] : values_) Sample(total, const_labels, labels, v, out);
}

void Gauge::Set(double v, const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  values_[labels] = v;
}

double Gauge::Value(const MetricLabels& labels) const {
  absl::MutexLock lock(&mu_);
  auto it = values_.find(labels);
  return it == values_.end() ? 0 : it->second;
}

void Gauge::Render(const MetricLabels& const_labels, std::string* out) const {
  Header(name_, help_, "gauge", out);
  absl::MutexLock lock(&mu_);
  // A gauge never set renders 0, as before it had labels.
  if (values_.empty()) Sample(name_, const_labels, {}, 0, out);
  for (const auto& [labels, v] : values_) Sample(name_, const_labels, labels, v, out);
}

Histogram::Histogram(std::string name, std::string help, std::vector<double> bounds)
    : name_(std::move(name)), help_(std::move(help)), bounds_(std::move(bounds)) {
  for (size_t i = 1; i < bounds_.size(); ++i) CHECK_LT(bounds_[i - 1], bounds_[i]) << name_;
  counts_.assign(bounds_.size() + 1, 0);
}

void Histogram::Observe(double v) {
  // The first bucket whose bound is >= v (le is inclusive); +Inf past the last.
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  absl::MutexLock lock(&mu_);
  ++counts_[i];
  sum_ += v;
}

uint64_t Histogram::Count() const {
  absl::MutexLock lock(&mu_);
  uint64_t n = 0;
  for (uint64_t c : counts_) n += c;
  return n;
}

double Histogram::Sum() const {
  absl::MutexLock lock(&mu_);
  return sum_;
}

void Histogram::Render(const MetricLabels& const_labels, std::string* out) const {
  Header(name_, help_, "histogram", out);
  absl::MutexLock lock(&mu_);
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? FormatMetricValue(bounds_[i]) : "+Inf";
    Sample(name_ + "_bucket", const_labels, {{"le", le}}, static_cast<double>(cumulative), out);
  }
  Sample(name_ + "_count", const_labels, {}, static_cast<double>(cumulative), out);
  Sample(name_ + "_sum", const_labels, {}, sum_, out);
}

Counter* MetricsRegistry::AddCounter(const std::string& name, const std::string& help) {
  auto c = std::make_unique<Counter>(name, help);
  Counter* p = c.get();
  absl::MutexLock lock(&mu_);
  families_.push_back(std::move(c));
  return p;
}

Gauge* MetricsRegistry::AddGauge(const std::string& name, const std::string& help) {
  auto g = std::make_unique<Gauge>(name, help);
  Gauge* p = g.get();
  absl::MutexLock lock(&mu_);
  families_.push_back(std::move(g));
  return p;
}

Histogram* MetricsRegistry::AddHistogram(const std::string& name, const std::string& help,
                                         std::vector<double> bounds) {
  auto h = std::make_unique<Histogram>(name, help, std::move(bounds));
  Histogram* p = h.get();
  absl::MutexLock lock(&mu_);
  families_.push_back(std::move(h));
  return p;
}

std::string MetricsRegistry::Render() const {
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& f : families_) f->Render(const_labels_, &out);
  return out;
}

ServingMetrics::ServingMetrics(const std::string& model_name)
    : registry({{"model_name", model_name}}) {
  MetricsRegistry& r = registry;
  num_requests_running =
      r.AddGauge("vllm:num_requests_running", "Number of requests in model execution batches.");
  num_requests_waiting =
      r.AddGauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.");
  kv_cache_usage_perc =
      r.AddGauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.");
  prefix_cache_queries = r.AddCounter(
      "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.");
  prefix_cache_hits = r.AddCounter("vllm:prefix_cache_hits",
                                   "Prefix cache hits, in terms of number of cached tokens.");
  num_preemptions = r.AddCounter("vllm:num_preemptions", "Cumulative number of preemption.");
  window_released_blocks = r.AddCounter(
      "llm:kv_blocks_released_by_window",
      "KV-cache blocks given back before their sequences ended because no query could see them "
      "any more (a model whose every layer attends through a sliding window).");
  prompt_tokens = r.AddCounter("vllm:prompt_tokens", "Number of prefill tokens processed.");
  generation_tokens =
      r.AddCounter("vllm:generation_tokens", "Number of generation tokens processed.");
  request_success =
      r.AddCounter("vllm:request_success", "Count of successfully processed requests.");
  for (const char* reason : {"stop", "length", "abort"}) {
    request_success->Inc(0, {{"finished_reason", reason}});
  }
  // vLLM's buckets (vllm/v1/metrics/loggers.py).
  time_to_first_token_seconds = r.AddHistogram(
      "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
      {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
       1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0});
  inter_token_latency_seconds = r.AddHistogram(
      "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
      {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
       20.0, 40.0, 80.0});
  e2e_request_latency_seconds = r.AddHistogram(
      "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
      {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
       30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0});
  worker_memory_bytes = r.AddGauge(
      "llm:worker_memory_bytes",
      "Memory of the rank-0 worker by kind, in bytes, as of its last step (resident: the "
      "process's resident set).");
  worker_constrained_samples = r.AddGauge(
      "llm:worker_constrained_samples",
      "Tokens the rank-0 worker sampled under a structured output's token mask since it started "
      "(a count; reset when the worker restarts).");
}

void ServingMetrics::UpdateFromStats(const v1::GetStatsResponse& s) {
  num_requests_running->Set(s.num_running());
  num_requests_waiting->Set(s.num_waiting());
  kv_cache_usage_perc->Set(s.gpu_kv_usage());
  prefix_cache_queries->Set(static_cast<double>(s.prefix_cache_queries()));
  prefix_cache_hits->Set(static_cast<double>(s.prefix_cache_hits()));
  num_preemptions->Set(static_cast<double>(s.num_preemptions()));
  window_released_blocks->Set(static_cast<double>(s.num_window_released_blocks()));
  if (s.has_worker()) {
    const v1::WorkerStats::Memory& m = s.worker().memory();
    const std::pair<const char*, uint64_t> kinds[] = {{"resident", m.resident()},
                                                      {"weights", m.weights()},
                                                      {"coded_weights", m.coded_weights()},
                                                      {"kv_cache_reserved", m.kv_cache_reserved()},
                                                      {"kv_cache_resident", m.kv_cache_resident()},
                                                      {"swap_reserved", m.swap_reserved()},
                                                      {"swap_resident", m.swap_resident()},
                                                      {"activations", m.activations()},
                                                      {"other", OtherResidentBytes(m)}};
    for (const auto& [kind, bytes] : kinds) {
      worker_memory_bytes->Set(static_cast<double>(bytes), {{"kind", kind}});
    }
    worker_constrained_samples->Set(static_cast<double>(s.worker().constrained_samples()));
  }
}

uint64_t OtherResidentBytes(const v1::WorkerStats::Memory& m) {
  const uint64_t known = m.weights() + m.kv_cache_resident() + m.swap_resident() + m.activations();
  return m.resident() > known ? m.resident() - known : 0;
}

}  // namespace llm
