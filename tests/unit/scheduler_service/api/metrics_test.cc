#include "scheduler_service/api/metrics.h"

#include <cmath>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace llm {
namespace {

using ::testing::HasSubstr;

// A labelled gauge renders one sample per label set; UpdateFromStats fills the worker's memory
// by kind, "other" being what the kinds leave of the resident set.
TEST(MetricsTest, WorkerMemoryIsAGaugePerKind) {
  ServingMetrics m("m");
  v1::GetStatsResponse s;
  v1::WorkerStats::Memory* mem = s.mutable_worker()->mutable_memory();
  mem->set_resident(1000);
  mem->set_weights(600);
  mem->set_kv_cache_reserved(4000);
  mem->set_kv_cache_resident(200);
  mem->set_activations(50);
  m.UpdateFromStats(s);
  EXPECT_EQ(m.worker_memory_bytes->Value({{"kind", "weights"}}), 600);
  EXPECT_EQ(m.worker_memory_bytes->Value({{"kind", "kv_cache_reserved"}}), 4000);
  EXPECT_EQ(m.worker_memory_bytes->Value({{"kind", "other"}}), 150);
  const std::string text = m.registry.Render();
  EXPECT_THAT(text,
              HasSubstr("llm:worker_memory_bytes{model_name=\"m\",kind=\"resident\"} 1000\n"));
  EXPECT_THAT(text,
              HasSubstr("llm:worker_memory_bytes{model_name=\"m\",kind=\"swap_reserved\"} 0\n"));
  // More than the resident set accounted for: other is 0, not negative.
  mem->set_weights(2000);
  m.UpdateFromStats(s);
  EXPECT_EQ(m.worker_memory_bytes->Value({{"kind", "other"}}), 0);
}

TEST(MetricsTest, RendersTheTextFormatAsPrometheusClientDoes) {
  MetricsRegistry r(MetricLabels{{"model_name", "m"}});
  Counter* c = r.AddCounter("vllm:prompt_tokens", "Prompt tokens.");
  Gauge* g = r.AddGauge("vllm:num_requests_running", "Running.");
  Histogram* h = r.AddHistogram("vllm:e2e_request_latency_seconds", "Latency.", {0.5, 1, 2.5});
  c->Inc(3);
  c->Inc(4.5);
  g->Set(2);
  h->Observe(0.5);  // le is inclusive: the 0.5 bucket
  h->Observe(0.75);
  h->Observe(10);  // only +Inf
  EXPECT_EQ(r.Render(),
            "# HELP vllm:prompt_tokens_total Prompt tokens.\n"
            "# TYPE vllm:prompt_tokens_total counter\n"
            "vllm:prompt_tokens_total{model_name=\"m\"} 7.5\n"
            "# HELP vllm:num_requests_running Running.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            "vllm:num_requests_running{model_name=\"m\"} 2\n"
            "# HELP vllm:e2e_request_latency_seconds Latency.\n"
            "# TYPE vllm:e2e_request_latency_seconds histogram\n"
            "vllm:e2e_request_latency_seconds_bucket{model_name=\"m\",le=\"0.5\"} 1\n"
            "vllm:e2e_request_latency_seconds_bucket{model_name=\"m\",le=\"1\"} 2\n"
            "vllm:e2e_request_latency_seconds_bucket{model_name=\"m\",le=\"2.5\"} 2\n"
            "vllm:e2e_request_latency_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 3\n"
            "vllm:e2e_request_latency_seconds_count{model_name=\"m\"} 3\n"
            "vllm:e2e_request_latency_seconds_sum{model_name=\"m\"} 11.25\n");
  EXPECT_EQ(h->Count(), 3u);
  EXPECT_DOUBLE_EQ(h->Sum(), 11.25);
}

TEST(MetricsTest, LabelledCounterKeepsOneSeriesPerLabelSet) {
  MetricsRegistry r(MetricLabels{{"model_name", "m"}});
  Counter* c = r.AddCounter("vllm:request_success", "Finished.");
  c->Inc(1, {{"finished_reason", "stop"}});
  c->Inc(1, {{"finished_reason", "length"}});
  c->Inc(1, {{"finished_reason", "stop"}});
  c->Inc(-5, {{"finished_reason", "stop"}});  // ignored: counters never decrease
  EXPECT_EQ(c->Value({{"finished_reason", "stop"}}), 2);
  const std::string text = r.Render();
  EXPECT_THAT(text, HasSubstr("vllm:request_success_total{model_name=\"m\","
                              "finished_reason=\"stop\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("vllm:request_success_total{model_name=\"m\","
                              "finished_reason=\"length\"} 1\n"));
}

TEST(MetricsTest, EscapesLabelValuesAndHelp) {
  MetricsRegistry r(MetricLabels{{"model_name", "a\"b\\c\nd"}});
  r.AddGauge("g", "line1\nline2 \\ end")->Set(1);
  EXPECT_EQ(r.Render(),
            "# HELP g line1\\nline2 \\\\ end\n"
            "# TYPE g gauge\n"
            "g{model_name=\"a\\\"b\\\\c\\nd\"} 1\n");
}

TEST(MetricsTest, FormatsValuesExactly) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(0.1), "0.1");
  EXPECT_EQ(FormatMetricValue(123456789012.0), "123456789012");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatMetricValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatMetricValue(std::nan("")), "NaN");
  // Shortest form that reads back exactly.
  const double v = 0.009263428123456789;
  EXPECT_EQ(std::stod(FormatMetricValue(v)), v);
}

TEST(MetricsTest, ServingMetricsHasVllmNamesAndTakesStats) {
  ServingMetrics m("tiny");
  v1::GetStatsResponse s;
  s.set_num_running(3);
  s.set_num_waiting(4);
  s.set_gpu_kv_usage(0.25);
  s.set_prefix_cache_queries(100);
  s.set_prefix_cache_hits(40);
  s.set_num_preemptions(2);
  m.UpdateFromStats(s);
  m.generation_tokens->Inc(5);
  const std::string text = m.registry.Render();
  for (const char* line : {
           "vllm:num_requests_running{model_name=\"tiny\"} 3\n",
           "vllm:num_requests_waiting{model_name=\"tiny\"} 4\n",
           "vllm:kv_cache_usage_perc{model_name=\"tiny\"} 0.25\n",
           "vllm:prefix_cache_queries_total{model_name=\"tiny\"} 100\n",
           "vllm:prefix_cache_hits_total{model_name=\"tiny\"} 40\n",
           "vllm:num_preemptions_total{model_name=\"tiny\"} 2\n",
           "vllm:prompt_tokens_total{model_name=\"tiny\"} 0\n",
           "vllm:generation_tokens_total{model_name=\"tiny\"} 5\n",
           "vllm:request_success_total{model_name=\"tiny\",finished_reason=\"abort\"} 0\n",
           "# TYPE vllm:time_to_first_token_seconds histogram\n",
           "vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"2560\"} 0\n",
           "# TYPE vllm:inter_token_latency_seconds histogram\n",
           "vllm:e2e_request_latency_seconds_bucket{model_name=\"tiny\",le=\"7680\"} 0\n",
       }) {
    EXPECT_THAT(text, HasSubstr(line));
  }
}

}  // namespace
}  // namespace llm
