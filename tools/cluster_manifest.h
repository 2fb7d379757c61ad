// A local cluster manifest (deploy/local/*.yaml): which model, how many tensor-parallel
// workers, where everything listens, and the engine options passed to llm-scheduler.
//
//   model: models/fortune-llama      # relative paths are relative to the current directory
//   tensor_parallel_size: 2
//   device: cpu
//   scheduler: {host: 127.0.0.1, port: 50051}     # port 0: any free port; with TLS (engine
//                                    # ssl_certfile) also tls_ca (the roots llm-cluster's health
//                                    # check trusts; default ssl_certfile) and tls_server_name
//   workers: {host: 127.0.0.1, base_port: 50061}  # rank r on base_port + r; 0: free ports
//   restart_workers: false           # true: a worker that dies is started again
//   restart_scheduler: false         # true: so is the scheduler, on its port
//   engine:                          # each key becomes an llm-scheduler flag --key-with-dashes
//     block_size: 16
//     enable_prefix_caching: true
//   worker: {threads: 1}             # each key becomes an llm-worker flag
//
// The reader is strict: an unknown key, a value of the wrong type, a duplicate key or a key
// that llm-cluster sets itself is an INVALID_ARGUMENT naming the file, the line and the key.
// Pure functions; thread-compatible.
#ifndef LLM_TOOLS_CLUSTER_MANIFEST_H_
#define LLM_TOOLS_CLUSTER_MANIFEST_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace llm {

struct ClusterManifest {
  std::string model;  // as written; the caller resolves it against the current directory
  int tensor_parallel_size = 1;
  std::string device = "cpu";
  std::string scheduler_host = "127.0.0.1";
  int scheduler_port = 50051;             // 0: any free port
  std::string scheduler_tls_ca;           // empty: engine's ssl_certfile
  std::string scheduler_tls_server_name;  // empty: the scheduler's address
  std::string workers_host = "127.0.0.1";
  int workers_base_port = 50061;  // rank r listens on base_port + r; 0: any free ports
  bool restart_workers = false;
  bool restart_scheduler = false;
  double restart_delay_s = 1.0;  // wait before a dead worker or scheduler is started again
  double startup_timeout_s = 120.0;
  // Options in file order, key as written (underscores) and value as text.
  std::vector<std::pair<std::string, std::string>> engine;
  std::vector<std::pair<std::string, std::string>> worker;

  // "--block-size=16", ... for llm-scheduler / llm-worker.
  std::vector<std::string> SchedulerFlags() const;
  std::vector<std::string> WorkerFlags() const;
  // The value of `key` under engine: (as written), or "" when not set.
  std::string EngineOption(const std::string& key) const;
};

// `file_name` appears in error messages only.
absl::StatusOr<ClusterManifest> ParseClusterManifest(std::string_view yaml,
                                                     const std::string& file_name);
absl::StatusOr<ClusterManifest> LoadClusterManifest(const std::string& path);

}  // namespace llm

#endif  // LLM_TOOLS_CLUSTER_MANIFEST_H_
