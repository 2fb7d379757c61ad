// The integration-test harness: a real local cluster (llm-cluster starting llm-scheduler and
// llm-worker processes from build/bin) on free loopback ports, and helpers to call it.
//
// LocalCluster::Start writes a manifest with port 0 everywhere into a temporary directory,
// starts llm-cluster as a child (which cannot outlive the test process), and waits for its
// --port-file, i.e. until the scheduler reports SERVING. Stop() sends SIGTERM, waits, and
// checks that every process the cluster started is gone: no test leaves a process behind.
//
// Not thread-safe, except stub() and the free functions, which any thread may call.
#ifndef LLM_TESTS_INTEGRATION_CLUSTER_HARNESS_H_
#define LLM_TESTS_INTEGRATION_CLUSTER_HARNESS_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "llm/v1/llm_service.grpc.pb.h"
#include "tools/child_process.h"
#include "tools/health_check.h"

namespace llm::testing {

struct ClusterOptions {
  std::string model;  // default: tests/data/models/tiny-llama
  int tensor_parallel_size = 1;
  bool restart_workers = false;
  bool restart_scheduler = false;
  double restart_delay_s = 1;
  std::string device = "cpu";  // the manifest's `device`
  // The manifest's `workers: host` (the workers listen there and the scheduler calls them there),
  // e.g. an address of a network namespace that `worker_binary` starts them in.
  std::string worker_host = "127.0.0.1";
  // llm-cluster --worker-binary (a name in build/bin, e.g. llm-worker-emu, or a path); empty:
  // llm-worker. Applies to `manifest` too.
  std::string worker_binary;
  // llm-scheduler options (manifest `engine:` keys, underscores), e.g. {"block_size", "16"}.
  std::vector<std::pair<std::string, std::string>> engine;
  // llm-worker options (manifest `worker:` keys) besides threads: 1, e.g. {"shm_dir", "/tmp/x"}.
  std::vector<std::pair<std::string, std::string>> worker;
  // When set, this existing manifest is used as it is (the fields above are ignored), except
  // that every port becomes 0 (llm-cluster --scheduler-port=0 --worker-base-port=0).
  std::string manifest;
  // When set, llm-cluster starts with it as LLM_API_KEY (the public APIs then require it), and
  // stub() presents it on every call.
  std::string api_key;
  // PEM roots stub() trusts: set when the engine serves TLS (ssl_certfile / ssl_keyfile).
  std::string tls_ca;
};

class LocalCluster {
 public:
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const ClusterOptions& options);
  ~LocalCluster();  // Stop()s when still running
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  const std::string& address() const { return address_; }
  v1::LLMService::Stub& stub() const { return *stub_; }
  pid_t pid() const { return process_->pid(); }
  ChildProcess& process() { return *process_; }

  // The processes llm-cluster started now (its children), by /proc/PID/comm.
  std::vector<pid_t> Children() const;
  std::vector<pid_t> WorkerPids() const;
  pid_t SchedulerPid() const;

  // SIGTERM to llm-cluster; returns its wait status. OK only when llm-cluster exited 0 and
  // every process it had started is gone.
  absl::StatusOr<int> Stop();

 private:
  LocalCluster() = default;

  std::string dir_;
  std::string address_;
  std::unique_ptr<ChildProcess> process_;
  std::unique_ptr<v1::LLMService::Stub> stub_;
  std::vector<pid_t> seen_children_;  // every child ever observed, for the orphan check
};

// The children of `parent` (by /proc/*/stat), with their comm names.
std::vector<std::pair<pid_t, std::string>> ChildrenOf(pid_t parent);
// Waits up to `timeout` until no process in `pids` is alive (zombies count as gone); the ones
// still alive otherwise.
std::vector<pid_t> WaitUntilGone(const std::vector<pid_t>& pids, absl::Duration timeout);

// The outcome of one Generate call, assembled from its stream.
struct GenerateResult {
  grpc::Status status;
  std::string request_id;
  std::map<uint32_t, std::vector<int32_t>> token_ids;  // by sequence index
  std::map<uint32_t, std::string> text;
  std::map<uint32_t, v1::FinishReason> finish_reason;
  // The sampled tokens' logprobs, by sequence index, when the request asked for logprobs.
  std::map<uint32_t, std::vector<float>> logprobs;
  // Top-1 minus top-2 logprob of every step, when the request asked for 2 or more.
  std::map<uint32_t, std::vector<float>> margins;
  v1::Usage usage;
  bool has_usage = false;
  int num_responses = 0;
};

// Runs the call to its end. `deadline` is a hang guard only.
GenerateResult Generate(v1::LLMService::Stub& stub, const v1::GenerateRequest& request,
                        absl::Duration deadline = absl::Seconds(120));

// A greedy request for `prompt` (text, BOS added) with `max_tokens`.
v1::GenerateRequest GreedyRequest(const std::string& prompt, int max_tokens,
                                  bool ignore_eos = true);

absl::StatusOr<v1::GetStatsResponse> GetStats(v1::LLMService::Stub& stub);
absl::StatusOr<v1::GetModelInfoResponse> GetModelInfo(v1::LLMService::Stub& stub);
// Polls GetStats until nothing runs or waits and every device block is free; the last stats
// otherwise.
// Polls `health` (the scheduler's grpc.health.v1) until it is not SERVING: how long that took
// since `since` (InfiniteDuration when it still serves after `limit`).
absl::Duration TimeUntilNotServing(const HealthChecker& health, absl::Time since,
                                   absl::Duration limit);
// Polls `health` until it is SERVING; false when it is not within `limit`.
bool WaitUntilServing(const HealthChecker& health, absl::Duration limit);

absl::StatusOr<v1::GetStatsResponse> WaitUntilAllBlocksFree(v1::LLMService::Stub& stub,
                                                            absl::Duration timeout);

// The in-process engine (tokenizer + EngineCore + ModelRunner, as llm-generate assembles it):
// the greedy token ids for each prompt, each run alone.
absl::StatusOr<std::vector<std::vector<int32_t>>> ReferenceGreedy(
    const std::string& model_dir, const std::vector<std::string>& prompts, int max_tokens,
    bool ignore_eos = true);

// ReferenceGreedy with each step's top-2 logprobs: margins[i] is logprob(top 1) - logprob(top
// 2) at output token i, the distance from a tie that a less precise run must stay within to
// pick the same token.
struct ReferenceOutput {
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;  // of token_ids[i]
  std::vector<float> margins;
};
absl::StatusOr<std::vector<ReferenceOutput>> ReferenceGreedyWithMargins(
    const std::string& model_dir, const std::vector<std::string>& prompts, int max_tokens);

std::string DefaultModel();

}  // namespace llm::testing

#endif  // LLM_TESTS_INTEGRATION_CLUSTER_HARNESS_H_
