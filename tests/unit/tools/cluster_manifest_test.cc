#include "tools/cluster_manifest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace llm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<ClusterManifest> Parse(const std::string& yaml) {
  return ParseClusterManifest(yaml, "m.yaml");
}

TEST(ClusterManifestTest, ReadsEveryKey) {
  absl::StatusOr<ClusterManifest> m = Parse(R"(
model: models/fortune-llama   # a comment
tensor_parallel_size: 2
device: cpu
scheduler: {host: 0.0.0.0, port: 0}
workers:
  host: 127.0.0.1
  base_port: 50061
restart_workers: true
restart_scheduler: true
restart_delay_s: 0.5
startup_timeout_s: 30
engine:
  block_size: 16
  enable_prefix_caching: true
  preemption_mode: swap
  gpu_memory_utilization: 0.5
worker: {threads: 1}
)");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->model, "models/fortune-llama");
  EXPECT_EQ(m->tensor_parallel_size, 2);
  EXPECT_EQ(m->scheduler_host, "0.0.0.0");
  EXPECT_EQ(m->scheduler_port, 0);
  EXPECT_EQ(m->workers_base_port, 50061);
  EXPECT_TRUE(m->restart_workers);
  EXPECT_TRUE(m->restart_scheduler);
  EXPECT_DOUBLE_EQ(m->restart_delay_s, 0.5);
  EXPECT_DOUBLE_EQ(m->startup_timeout_s, 30);
  EXPECT_THAT(m->SchedulerFlags(),
              ElementsAre("--block-size=16", "--enable-prefix-caching=true",
                          "--preemption-mode=swap", "--gpu-memory-utilization=0.5"));
  EXPECT_THAT(m->WorkerFlags(), ElementsAre("--threads=1"));
}

TEST(ClusterManifestTest, DefaultsWhenOnlyTheModelIsGiven) {
  absl::StatusOr<ClusterManifest> m = Parse("model: m\n");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->tensor_parallel_size, 1);
  EXPECT_EQ(m->scheduler_port, 50051);
  EXPECT_FALSE(m->restart_workers);
  EXPECT_TRUE(m->SchedulerFlags().empty());
}

TEST(ClusterManifestTest, ReadsTheExposureKeys) {
  absl::StatusOr<ClusterManifest> m = Parse(R"(model: m
scheduler: {host: 127.0.0.1, port: 0, tls_ca: ca.pem, tls_server_name: llm.example}
engine:
  ssl_certfile: cert.pem
  ssl_keyfile: key.pem
  max_prompt_bytes: 1000
  max_stop_bytes: 64
  max_request_bytes: 2000000
  drain_timeout: 5
  cluster_secret_file: /run/secret
worker: {cluster_secret_file: /run/secret}
)");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->scheduler_tls_ca, "ca.pem");
  EXPECT_EQ(m->scheduler_tls_server_name, "llm.example");
  EXPECT_EQ(m->EngineOption("ssl_certfile"), "cert.pem");
  EXPECT_EQ(m->EngineOption("drain_timeout"), "5");
  EXPECT_EQ(m->EngineOption("api_key"), "");
  EXPECT_THAT(m->SchedulerFlags(), ElementsAre("--ssl-certfile=cert.pem", "--ssl-keyfile=key.pem",
                                               "--max-prompt-bytes=1000", "--max-stop-bytes=64",
                                               "--max-request-bytes=2000000", "--drain-timeout=5",
                                               "--cluster-secret-file=/run/secret"));
  EXPECT_THAT(m->WorkerFlags(), ElementsAre("--cluster-secret-file=/run/secret"));
  // The key does not belong in a manifest (llm-cluster logs argv): LLM_API_KEY instead.
  absl::StatusOr<ClusterManifest> key = Parse("model: m\nengine: {api_key: k}\n");
  EXPECT_FALSE(key.ok());
  // tls_ca is the scheduler's only: not a workers key.
  absl::StatusOr<ClusterManifest> w = Parse("model: m\nworkers: {host: h, tls_ca: x}\n");
  EXPECT_FALSE(w.ok());
}

// Each bad manifest fails with file:line, the key and what is wrong.
TEST(ClusterManifestTest, RejectsWithFileLineAndKey) {
  struct Case {
    std::string yaml;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"", "m.yaml:1: the manifest is empty"},
      {"- a\n- b\n", "m.yaml:1: expected a mapping"},
      {"tensor_parallel_size: 1\n", "m.yaml:1: model: is required"},
      {"model: m\nmodle: x\n", "m.yaml:2: modle: unknown key"},
      {"model: m\ntensor_parallel_size: two\n",
       "m.yaml:2: tensor_parallel_size: expected an integer, got \"two\""},
      {"model: m\ntensor_parallel_size: 0\n", "tensor_parallel_size: expected 1..1024, got 0"},
      {"model: m\ntensor_parallel_size: \"2\"\n",
       "m.yaml:2: tensor_parallel_size: expected an integer, got the string \"2\""},
      {"model: m\nmodel: n\n", "m.yaml:2: model: duplicate key"},
      {"model: m\ndevice: tpu\n", "m.yaml:2: device: expected cpu or cuda"},
      {"model: m\nscheduler: {host: h, prot: 1}\n", "m.yaml:2: scheduler.prot: unknown key"},
      {"model: m\nscheduler: {port: 70000}\n", "scheduler.port: expected 0..65535, got 70000"},
      {"model: m\nworkers: 5\n", "m.yaml:2: workers: expected a mapping"},
      {"model: m\nengine:\n  block_sise: 16\n", "m.yaml:3: engine.block_sise: unknown key"},
      {"model: m\nengine:\n  block_size: 1.5\n",
       "m.yaml:3: engine.block_size: expected an integer, got \"1.5\""},
      {"model: m\nengine:\n  enable_prefix_caching: yes\n",
       "engine.enable_prefix_caching: expected true or false, got \"yes\""},
      {"model: m\nengine:\n  preemption_mode: evict\n",
       "engine.preemption_mode: expected recompute or swap, got \"evict\""},
      {"model: m\nengine:\n  port: 1\n",
       "m.yaml:3: engine.port: is set by llm-cluster from the manifest's top-level keys"},
      {"model: m\nengine:\n  block_size: [16]\n",
       "engine.block_size: expected an integer, got a list"},
      {"model: m\nworker: {threads: 1, gpus: 2}\n", "m.yaml:2: worker.gpus: unknown key"},
      {"model: m\nrestart_workers: 1\n", "restart_workers: expected true or false"},
      {"model: m\n  bad: indent\n", "m.yaml:2: invalid YAML"},
      {"model: m\n---\nmodel: n\n", "m.yaml: expected one YAML document"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ClusterManifest> m = Parse(c.yaml);
    ASSERT_FALSE(m.ok()) << c.yaml;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_THAT(std::string(m.status().message()), HasSubstr(c.message)) << c.yaml;
  }
}

// A YAML syntax error in a second document is an error like one in the first, not ignored.
TEST(ClusterManifestTest, RejectsInvalidYamlInASecondDocument) {
  absl::StatusOr<ClusterManifest> m = Parse("model: m\n---\nengine: [\n");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("invalid YAML"));
}

// Numbers are finite: "nan" and "inf" parse as doubles but mean nothing as seconds.
TEST(ClusterManifestTest, RejectsNonFiniteSeconds) {
  for (const char* yaml :
       {"model: m\nstartup_timeout_s: nan\n", "model: m\nrestart_delay_s: inf\n"}) {
    absl::StatusOr<ClusterManifest> m = Parse(yaml);
    ASSERT_FALSE(m.ok()) << yaml;
    EXPECT_THAT(std::string(m.status().message()), HasSubstr("expected a number >= 0")) << yaml;
  }
}

TEST(ClusterManifestTest, TheCommittedManifestsParse) {
  for (const char* name : {"tp1-cpu.yaml", "tp2-cpu.yaml"}) {
    absl::StatusOr<ClusterManifest> m =
        LoadClusterManifest(std::string(LLM_SOURCE_DIR) + "/deploy/local/" + name);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->model, "models/fortune-llama");
  }
}

TEST(ClusterManifestTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadClusterManifest("/nonexistent/m.yaml").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace llm
