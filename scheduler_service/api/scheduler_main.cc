// llm-scheduler: the public gRPC server (llm.v1.LLMService) in front of a tensor-parallel group
// of llm-worker ranks. It tokenizes, schedules (EngineCore) and streams; the workers run the
// model (ShardedWorkerClient drives them, one Step stream per rank).
//
// This file parses and checks the flags and wires the parts: the rendezvous store the ranks
// meet at (TcpStoreServer), the service and its gRPC server, and the WorkerGroup, which brings
// the group up, probes it and re-initializes it after a failure (worker_group.h). Each time the
// group is up, an EngineCore is started over it and handed to the service, and health turns
// SERVING. Each time it goes down (a rank died, stalled or was cut off), health turns
// NOT_SERVING and new calls get UNAVAILABLE "the worker group is recovering: <the rank and
// what happened>", while the engine keeps every request in flight (put back as preempted by
// recompute) and, once the group is up again, continues them on it: their streams pause. A
// request still in flight --recovery-timeout after the failure ends with UNAVAILABLE naming it
// (--recovery-timeout=0: fail-stop, every stream ends at the failure).
//
// An attempt that every rank refuses with INVALID_ARGUMENT / FAILED_PRECONDITION (a bad model
// directory, heads not divisible by the ranks, no room for a KV cache block) cannot succeed on
// retry: it is logged and the process exits 2.
//
// SIGTERM / SIGINT drain: health turns NOT_SERVING, new Generate calls get UNAVAILABLE
// "draining ...", the calls in flight run to their end for up to --drain-timeout seconds;
// then (or at once on a second signal) every stream left ends with UNAVAILABLE "server
// shutting down" (with ": the worker group is down: <the rank and what happened>" when it is),
// the engine stops, the server shuts down and the process exits 0. The workers are left
// running: they are not the scheduler's to stop.
//
// Exposure (docs/operations/security.md): TLS from PEM files (--ssl-certfile, --ssl-keyfile,
// --ssl-ca-certs for client certificates), an API key (--api-key or $LLM_API_KEY), limits
// (--max-request-bytes, --max-prompt-bytes, --max-stop-bytes) and the cluster secret
// (--cluster-secret-file or $LLM_CLUSTER_SECRET) presented to the workers and required by the
// rendezvous store.
//
//   llm-scheduler --model=DIR --worker-addresses=H:P,H:P [--flag=value ...]   (--help)
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cluster_secret.h"
#include "common/flag_parser.h"
#include "common/gguf.h"
#include "common/grpc_security.h"
#include "common/model_config.h"
#include "common/port_file.h"
#include "common/reexec.h"
#include "common/tcp_store.h"
#include "glog/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "scheduler_service/api/llm_service.h"
#include "scheduler_service/chat/chat_template.h"
#include "scheduler_service/engine/engine_core.h"
#include "scheduler_service/engine/sharded_worker_client.h"
#include "scheduler_service/engine/worker_group.h"
#include "scheduler_service/http/openai_server.h"
#include "scheduler_service/http/reasoning_parser.h"
#include "scheduler_service/tokenizer/gguf_tokenizer.h"
#include "scheduler_service/tokenizer/incremental_detokenizer.h"
#include "scheduler_service/tokenizer/tokenizer.h"

namespace llm {
namespace {

struct Flags {
  std::string model;
  std::string served_model_name;
  std::string host = "0.0.0.0";
  int port = 50051;
  std::string port_file;
  std::string worker_addresses;
  int tensor_parallel_size = 1;
  std::string device = "cpu";
  std::string dtype = "auto";
  std::string kv_cache_dtype = "auto";
  bool enforce_eager = false;
  int block_size = 16;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 0;
  int max_model_len = 0;
  double gpu_memory_utilization = 0.9;
  double swap_space = -1;  // -1: 4 GiB on cuda, 0 on cpu
  double cpu_kv_cache_space = 1;
  int num_gpu_blocks_override = 0;
  double watermark = 0.01;
  bool enable_prefix_caching = false;
  bool enable_chunked_prefill = false;
  int long_prefill_token_threshold = 0;
  std::string preemption_mode = "recompute";
  std::string scheduling_policy = "fcfs";
  int max_concurrent_requests = 256;
  int max_logprobs = 20;
  int max_n = 16;
  std::string rendezvous_host = "127.0.0.1";
  int rendezvous_port = 0;
  double worker_timeout = 60;
  double keepalive_time = 2;
  double keepalive_timeout = 3;
  double collective_timeout = 30;
  std::string ssl_certfile;
  std::string ssl_keyfile;
  std::string ssl_ca_certs;
  std::string api_key;
  int64_t max_request_bytes = 16 << 20;
  int64_t max_prompt_bytes = 8 << 20;
  int max_stop_bytes = 1024;
  double drain_timeout = 30;
  std::string cluster_secret_file;
  int http_port = -1;  // -1: no HTTP server
  std::string http_host = "0.0.0.0";
  std::string http_port_file;
  std::string reasoning_parser;
  double recovery_timeout = 120;
  bool async_scheduling = true;
};

// Room above --max-prompt-bytes for the rest of a request (stop strings, ids, the prompt's
// token ids), so that a prompt over its limit reaches the service's check.
constexpr int64_t kRequestOverheadBytes = 1 << 20;

[[noreturn]] void Usage(const std::string& msg) {
  std::fprintf(stderr, "llm-scheduler: %s (--help lists the flags)\n", msg.c_str());
  std::exit(2);
}

[[noreturn]] void Fail(const std::string& msg) {
  std::fprintf(stderr, "llm-scheduler: %s\n", msg.c_str());
  std::exit(1);
}

Flags Parse(int argc, char** argv) {
  Flags f;
  FlagParser p(
      "usage: llm-scheduler --model=DIR --worker-addresses=H:P,... [--flag=value ...]\n"
      "Serves llm.v1.LLMService over a tensor-parallel group of llm-worker ranks.");
  p.Add("model", &f.model,
        "model directory (config.json, tokenizer.json, safetensors) or GGUF file (*.gguf); also "
        "sent to the workers "
        "as model_path, so it must be the same path on every host (required)");
  p.Add("served-model-name", &f.served_model_name,
        "the model name GetModelInfo reports (default: the model directory's base name, or the "
        "GGUF file's without .gguf)");
  p.Add("host", &f.host, "gRPC listen address (0.0.0.0)");
  p.Add("port", &f.port, "gRPC port; 0: any free port (50051)");
  p.Add("port-file", &f.port_file, "once serving, write the bound port to this file (none)");
  p.Add("worker-addresses", &f.worker_addresses,
        "the llm-worker of each rank, host:port, comma-separated in rank order (required)");
  p.Add("tensor-parallel-size", &f.tensor_parallel_size,
        "ranks; must equal the number of worker addresses (1)");
  p.Add("device", &f.device, "device the workers run on, sent to them (cpu)");
  p.Add("dtype", &f.dtype,
        "weight and activation type, sent to the workers: auto (bfloat16 on cuda, float32 on "
        "cpu), float32, bfloat16, float16 (auto)");
  p.Add("enforce-eager", &f.enforce_eager,
        "device cuda: never run steps from captured CUDA graphs (false)");
  p.Add("kv-cache-dtype", &f.kv_cache_dtype,
        "KV cache element type: auto (the model's dtype), bfloat16, float16, float32 (auto)");
  p.Add("block-size", &f.block_size, "tokens per KV cache block (16)");
  p.Add("max-num-seqs", &f.max_num_seqs, "sequences scheduled per step at most (256)");
  p.Add("max-num-batched-tokens", &f.max_num_batched_tokens,
        "tokens computed per step at most; 0: max(2048, max_model_len) without chunked "
        "prefill, 2048 with it (0)");
  p.Add("max-model-len", &f.max_model_len,
        "prompt + output tokens per sequence at most; 0: the model's max_position_embeddings "
        "(0)");
  p.Add("gpu-memory-utilization", &f.gpu_memory_utilization,
        "fraction of device memory a worker may use (0.9)");
  p.Add("swap-space", &f.swap_space,
        "GiB of host memory per rank for swapped-out blocks (4 on cuda; 0 on cpu, where a swap "
        "would copy between two regions of the same memory: preemption recomputes)");
  p.Add("cpu-kv-cache-space", &f.cpu_kv_cache_space,
        "GiB of host memory per rank for the KV cache of CPU workers (1)");
  p.Add("num-gpu-blocks-override", &f.num_gpu_blocks_override,
        "0: size the device KV cache by profiling; else exactly this many blocks (0)");
  p.Add("watermark", &f.watermark,
        "fraction of device blocks kept free when admitting requests (0.01)");
  p.Add("enable-prefix-caching", &f.enable_prefix_caching,
        "reuse the KV blocks of shared prompt prefixes (false)");
  p.Add("enable-chunked-prefill", &f.enable_chunked_prefill,
        "compute long prompts in chunks mixed with decodes (false)");
  p.Add("long-prefill-token-threshold", &f.long_prefill_token_threshold,
        "with chunked prefill, tokens per request per step at most; 0: no cap (0)");
  p.Add("preemption-mode", &f.preemption_mode, "recompute or swap (recompute)");
  p.Add("scheduling-policy", &f.scheduling_policy, "fcfs or priority (fcfs)");
  p.Add("max-concurrent-requests", &f.max_concurrent_requests,
        "Generate calls in flight at most; more get RESOURCE_EXHAUSTED (256)");
  p.Add("max-logprobs", &f.max_logprobs, "largest logprobs a request may ask for (20)");
  p.Add("max-n", &f.max_n, "largest n (sequences per request) a request may ask for (16)");
  p.Add("rendezvous-host", &f.rendezvous_host,
        "address the workers reach this scheduler's Gloo rendezvous store at (127.0.0.1)");
  p.Add("rendezvous-port", &f.rendezvous_port, "port of the rendezvous store; 0: any (0)");
  p.Add("worker-timeout", &f.worker_timeout,
        "seconds a step (or an Init) may take before the group is declared failed (60)");
  p.Add("keepalive-time", &f.keepalive_time,
        "seconds without a read from a worker before its channel sends a keepalive PING; 0: "
        "no keepalive (2)");
  p.Add("keepalive-timeout", &f.keepalive_timeout,
        "seconds a keepalive PING may go unanswered before the worker's channel is closed and "
        "the group fails: a stopped or cut-off worker is noticed within about keepalive-time "
        "+ keepalive-timeout (3)");
  p.Add("collective-timeout", &f.collective_timeout,
        "seconds, sent to the workers: limit of the Gloo rendezvous and collectives (30)");
  p.Add("ssl-certfile", &f.ssl_certfile,
        "PEM certificate chain: serve the public gRPC API and the HTTP API over TLS (with "
        "--ssl-keyfile) (none)");
  p.Add("ssl-keyfile", &f.ssl_keyfile, "PEM private key of --ssl-certfile (none)");
  p.Add("ssl-ca-certs", &f.ssl_ca_certs,
        "PEM CA certificates: require client certificates signed by them (none)");
  p.Add("api-key", &f.api_key,
        "every call must carry 'authorization: Bearer KEY' (health exempt); default: "
        "$LLM_API_KEY; neither: no key (none)");
  p.Add("max-request-bytes", &f.max_request_bytes,
        "largest request message the server receives; larger ones get gRPC's "
        "RESOURCE_EXHAUSTED. At least --max-prompt-bytes + 1 MiB (16777216)");
  p.Add("max-prompt-bytes", &f.max_prompt_bytes,
        "largest prompt text in bytes; larger ones get INVALID_ARGUMENT (8388608)");
  p.Add("max-stop-bytes", &f.max_stop_bytes, "largest stop string in bytes (1024)");
  p.Add("drain-timeout", &f.drain_timeout,
        "seconds SIGTERM lets requests in flight finish before ending them (30)");
  p.Add("cluster-secret-file", &f.cluster_secret_file,
        "file holding the cluster secret presented to the workers and required by the "
        "rendezvous store; default: $LLM_CLUSTER_SECRET; neither: none (none)");
  p.Add("http-port", &f.http_port,
        "serve the OpenAI-compatible HTTP API and /metrics on this port; 0: any free port; "
        "-1: none (-1)");
  p.Add("http-host", &f.http_host, "HTTP listen address (0.0.0.0)");
  p.Add("http-port-file", &f.http_port_file,
        "once the HTTP server listens, write its port to this file (none)");
  p.Add("reasoning-parser", &f.reasoning_parser,
        "HTTP chat: answer a reasoning model's <think>...</think> as reasoning_content: "
        "deepseek_r1 (the output is reasoning until </think>: DeepSeek-R1, QwQ, Qwen3 "
        "thinking models) or qwen3 (reasoning only when the output opens with <think>) (none)");
  p.Add("recovery-timeout", &f.recovery_timeout,
        "seconds a request in flight waits for the worker group to be rebuilt after a rank "
        "died, stalled or was cut off, before it ends with UNAVAILABLE; 0: none waits (every "
        "stream ends at the failure) (120)");
  p.Add("async-scheduling", &f.async_scheduling,
        "plan and send step N+1 while the workers run step N, so that they do not wait for the "
        "scheduler between steps; =false: each step's result is applied before the next is "
        "planned (true)");
  p.Parse(argc, argv);
  return f;
}

// What the flags configure: the scheduler, the worker group and the service.
struct ServingConfigs {
  SchedulerConfig scheduler;
  // All but rendezvous_address (known once the store listens) and the callbacks (wiring).
  WorkerGroupOptions group;
  LLMServiceOptions service;
};

// Checks the flags, alone and against the model (a bad one exits with usage), and derives the
// configs from them: the model bounds max_model_len and gives the vocabulary and EOS token.
ServingConfigs ConfigsFromFlags(const Flags& f, const ModelConfig& model,
                                const Tokenizer& tokenizer) {
  ServingConfigs s;
  if (f.model.empty()) Usage("--model is required");
  if (f.worker_addresses.empty()) Usage("--worker-addresses is required");
  WorkerGroupOptions& g = s.group;
  for (absl::string_view a : absl::StrSplit(f.worker_addresses, ',', absl::SkipWhitespace())) {
    g.addresses.emplace_back(a);
  }
  if (static_cast<int>(g.addresses.size()) != f.tensor_parallel_size) {
    Usage(absl::StrCat("--tensor-parallel-size is ", f.tensor_parallel_size, " but ",
                       g.addresses.size(), " worker addresses are given"));
  }
  if (f.port < 0 || f.port > 65535) Usage(absl::StrCat("--port is ", f.port));
  if (f.http_port < -1 || f.http_port > 65535) {
    Usage(absl::StrCat("--http-port must be -1 (none) or in [0, 65535], got ", f.http_port));
  }
  if (absl::StatusOr<openai::ReasoningFormat> r =
          openai::ReasoningFormatFromName(f.reasoning_parser);
      !r.ok()) {
    Usage(absl::StrCat("--reasoning-parser: ", r.status().message()));
  }
  if (f.worker_timeout <= 0) Usage("--worker-timeout must be positive");
  if (f.collective_timeout <= 0) Usage("--collective-timeout must be positive");
  if (f.keepalive_time < 0) {
    Usage(absl::StrCat("--keepalive-time must be >= 0 (0: no keepalive), got ", f.keepalive_time));
  }
  if (f.keepalive_time > 0 && f.keepalive_timeout <= 0) {
    Usage(absl::StrCat("--keepalive-timeout must be positive, got ", f.keepalive_timeout));
  }
  if (f.recovery_timeout < 0) Usage("--recovery-timeout must be >= 0");
  if (f.max_concurrent_requests < 1) Usage("--max-concurrent-requests must be at least 1");
  if (f.num_gpu_blocks_override < 0) Usage("--num-gpu-blocks-override must be >= 0");
  const double swap_space =
      f.swap_space == -1 ? (f.device.rfind("cuda", 0) == 0 ? 4 : 0) : f.swap_space;
  if (swap_space < 0 || f.cpu_kv_cache_space < 0) Usage("memory sizes must be >= 0");
  if (f.max_prompt_bytes < 1) Usage("--max-prompt-bytes must be at least 1");
  if (f.max_stop_bytes < 1) Usage("--max-stop-bytes must be at least 1");
  if (f.max_request_bytes > INT32_MAX ||
      f.max_request_bytes < f.max_prompt_bytes + kRequestOverheadBytes) {
    Usage(absl::StrCat("--max-request-bytes is ", f.max_request_bytes, "; expected at least ",
                       "--max-prompt-bytes + 1 MiB (", f.max_prompt_bytes + kRequestOverheadBytes,
                       ") and at most ", INT32_MAX));
  }
  if (f.drain_timeout < 0) Usage("--drain-timeout must be >= 0");

  SchedulerConfig& sc = s.scheduler;
  sc.max_model_len = f.max_model_len > 0 ? f.max_model_len : model.max_position_embeddings;
  if (sc.max_model_len > model.max_position_embeddings) {
    Usage(absl::StrCat("--max-model-len is ", sc.max_model_len,
                       " but the model's max_position_embeddings is ",
                       model.max_position_embeddings));
  }
  sc.max_num_batched_tokens = f.max_num_batched_tokens > 0 ? f.max_num_batched_tokens
                              : f.enable_chunked_prefill   ? 2048
                                                           : std::max(2048, sc.max_model_len);
  sc.max_num_seqs = f.max_num_seqs;
  sc.enable_chunked_prefill = f.enable_chunked_prefill;
  sc.long_prefill_token_threshold = f.long_prefill_token_threshold;
  if (f.preemption_mode == "recompute") {
    sc.preemption_mode = PreemptionMode::kRecompute;
  } else if (f.preemption_mode == "swap") {
    sc.preemption_mode = PreemptionMode::kSwap;
  } else {
    Usage("--preemption-mode must be recompute or swap, not " + f.preemption_mode);
  }
  if (f.scheduling_policy == "fcfs") {
    sc.policy = SchedulingPolicy::kFcfs;
  } else if (f.scheduling_policy == "priority") {
    sc.policy = SchedulingPolicy::kPriority;
  } else {
    Usage("--scheduling-policy must be fcfs or priority, not " + f.scheduling_policy);
  }
  if (!model.eos_token_ids.empty()) {
    sc.eos_token_id = model.eos_token_ids[0];
  } else if (!tokenizer.eos_token_ids().empty()) {
    sc.eos_token_id = tokenizer.eos_token_ids()[0];
  }
  sc.vocab_size = model.vocab_size;
  sc.sampling_limits = {.max_n = f.max_n, .max_logprobs = f.max_logprobs};
  if (absl::Status st = sc.Validate(); !st.ok()) Usage(std::string(st.message()));

  // num_gpu_blocks / num_cpu_blocks come from the workers.
  g.cache = {.block_size = f.block_size,
             .num_gpu_blocks = 1,
             .num_cpu_blocks = 0,
             .watermark = f.watermark,
             .enable_prefix_caching = f.enable_prefix_caching};
  if (absl::Status st = g.cache.Validate(); !st.ok()) Usage(std::string(st.message()));
  g.worker_timeout = absl::Seconds(f.worker_timeout);
  g.keepalive_time = absl::Seconds(f.keepalive_time);
  g.keepalive_timeout = absl::Seconds(f.keepalive_timeout);
  g.model_path = f.model;
  g.dtype = f.dtype;
  g.kv_cache_dtype = f.kv_cache_dtype;
  g.enforce_eager = f.enforce_eager;
  g.device = f.device;
  g.collective_timeout_ms = static_cast<uint32_t>(f.collective_timeout * 1000);
  g.max_model_len = sc.max_model_len;
  g.max_num_batched_tokens = sc.max_num_batched_tokens;
  g.max_num_seqs = sc.max_num_seqs;
  g.vocab_size = model.vocab_size;
  g.gpu_memory_utilization = f.gpu_memory_utilization;
  g.swap_space_gib = swap_space;
  g.cpu_kv_cache_space_gib = f.cpu_kv_cache_space;
  g.num_gpu_blocks_override = f.num_gpu_blocks_override;

  LLMServiceOptions& o = s.service;
  o.model_name = f.served_model_name;
  if (o.model_name.empty()) {
    o.model_name = std::filesystem::path(f.model).lexically_normal().filename().string();
    if (o.model_name.ends_with(".gguf")) o.model_name.resize(o.model_name.size() - 5);
    if (o.model_name.empty()) {
      o.model_name =
          std::filesystem::path(f.model).lexically_normal().parent_path().filename().string();
    }
  }
  o.max_model_len = sc.max_model_len;
  o.vocab_size = model.vocab_size;
  o.tensor_parallel_size = f.tensor_parallel_size;
  o.block_size = f.block_size;
  o.max_concurrent_requests = f.max_concurrent_requests;
  o.sampling_limits = sc.sampling_limits;
  o.api_key = ApiKeyFromFlagOrEnv(f.api_key);
  o.max_prompt_bytes = f.max_prompt_bytes;
  o.max_stop_bytes = f.max_stop_bytes;
  return s;
}

// Why the worker group is down, for the clients a shutdown drops ("" when it is up): the
// failure the engine waits to recover from, or else a rank that does not answer Health now.
std::string GroupDownReason(ServingEngine* engine, const std::vector<std::string>& addresses,
                            const std::string& cluster_secret) {
  if (engine != nullptr && engine->engine != nullptr) {
    const absl::Status paused = engine->engine->paused_on();
    if (!paused.ok()) return absl::StrCat("the worker group is down: ", paused.message());
  }
  absl::StatusOr<std::unique_ptr<ShardedWorkerClient>> probe =
      ShardedWorkerClient::Create({.addresses = addresses,
                                   .worker_timeout = absl::Seconds(1),
                                   .cluster_secret = cluster_secret});
  if (!probe.ok()) return "";
  const absl::Status health = (*probe)->CheckHealth();
  if (health.ok()) return "";
  return absl::StrCat("the worker group is down: ", health.message());
}

// The model's chat template: a GGUF file's tokenizer.chat_template, or a Hugging Face
// directory's (LoadChatTemplate). Null when the model has none.
absl::StatusOr<std::shared_ptr<const ChatTemplate>> LoadModelChatTemplate(
    const std::string& model) {
  if (!absl::EndsWith(model, ".gguf")) return LoadChatTemplate(model);
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(model);
  if (!file.ok()) return file.status();
  GgufChatInfo info = GgufChatInfoOf(**file);
  if (info.chat_template.empty()) return nullptr;
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> t = ChatTemplate::Create(
      std::move(info.chat_template), std::move(info.bos_token), std::move(info.eos_token));
  if (!t.ok()) {
    return absl::Status(t.status().code(),
                        absl::StrCat(model, ": tokenizer.chat_template: ", t.status().message()));
  }
  return t;
}

void SetServing(grpc::HealthCheckServiceInterface* health, bool serving) {
  health->SetServingStatus(serving);
  health->SetServingStatus("llm.v1.LLMService", serving);
}

// glibc's heap, set before any thread starts. With its defaults the scheduler's resident memory
// climbs under load and group rebuilds by more than what is in use (measured under the chaos
// test: docs/performance/results.md#chaos), as three defaults add up:
//  - up to 8 arenas per core, one for each thread that meets contention; each keeps the pages its
//    threads touched, and the threads come and go (gRPC's callback threads, each group attempt's
//    client threads);
//  - malloc_trim (every 10 s, in Run) returns the free pages inside every arena's bins, but not
//    the free top of an arena other than the main one: free() returns that only above
//    M_TRIM_THRESHOLD;
//  - that threshold follows the largest mmapped block freed (twice its size): the host block
//    pool's vectors, which each rebuild replaces, raise it past a megabyte, and from then on
//    those vectors come from an arena instead of mmap.
// Two arenas and both thresholds fixed at glibc's initial 128 KiB undo the three. A fourth
// needs ReexecWithoutThreadCaches.
void ConfigureHeap() {
  mallopt(M_ARENA_MAX, 2);
  mallopt(M_MMAP_THRESHOLD, 128 << 10);  // fixed: no longer raised by the blocks freed
  mallopt(M_TRIM_THRESHOLD, 128 << 10);
}

// glibc's per-thread caches (tcache) keep up to 7 freed chunks of each size up to 1 KiB for each
// thread, outside the arenas' bins: malloc_trim cannot return their pages, and the long-lived
// threads' caches fill, over a long run, with chunks of the sizes they meet, scattered over
// pages the heap can then not give back. Under the chaos test this was most of the growth left
// after ConfigureHeap (docs/performance/results.md#chaos); the arenas' locks it adds cost nothing
// measurable here. The cache is a tunable read only as the process starts, so the scheduler
// starts itself again once with glibc.malloc.tcache_count=0 added to GLIBC_TUNABLES; an
// environment that sets tcache_count itself is left as it is.
void ReexecWithoutThreadCaches(char** argv) {
  const char* given = std::getenv("GLIBC_TUNABLES");
  const std::string tunables = given == nullptr ? "" : given;
  if (absl::StrContains(tunables, "glibc.malloc.tcache_count")) return;
  const std::string with =
      absl::StrCat(tunables, tunables.empty() ? "" : ":", "glibc.malloc.tcache_count=0");
  setenv("GLIBC_TUNABLES", with.c_str(), /*overwrite=*/1);
  ReexecSelf(argv);
  // Still here: exec failed; run on with the caches.
  std::fprintf(stderr,
               "note: restarting without glibc's thread caches failed; running with them\n");
}

int Run(int argc, char** argv) {
  const Flags flags = Parse(argc, argv);
  if (flags.model.empty()) Usage("--model is required");
  absl::StatusOr<ModelConfig> model = ModelConfig::FromModelDir(flags.model);
  if (!model.ok()) Fail(model.status().ToString());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromDirectory(flags.model);
  if (!tok.ok()) Fail(tok.status().ToString());
  std::shared_ptr<const Tokenizer> tokenizer = std::move(*tok);
  ServingConfigs configs = ConfigsFromFlags(flags, *model, *tokenizer);
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(flags.ssl_certfile, flags.ssl_keyfile, flags.ssl_ca_certs);
  if (!credentials.ok()) Usage(std::string(credentials.status().message()));
  absl::StatusOr<std::string> secret = LoadClusterSecret(flags.cluster_secret_file);
  if (!secret.ok()) Usage(std::string(secret.status().message()));
  configs.group.cluster_secret = *secret;

  // Signals are taken by sigwait below; every thread started from here on has them blocked.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<TcpStoreServer>> store =
      TcpStoreServer::Start(flags.rendezvous_host, flags.rendezvous_port, *secret);
  if (!store.ok()) Fail("rendezvous store: " + store.status().ToString());

  const TokenizerDetokenizerFactory detokenizers(tokenizer);
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> chat_template =
      LoadModelChatTemplate(flags.model);
  if (!chat_template.ok()) Fail(chat_template.status().ToString());
  LLMServiceOptions service_options = configs.service;
  service_options.chat_template = *std::move(chat_template);
  service_options.metrics = std::make_shared<ServingMetrics>(service_options.model_name);
  LLMService service(service_options, tokenizer);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(absl::StrCat(flags.host, ":", flags.port), *credentials, &bound_port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(flags.max_request_bytes));
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    Fail(absl::StrCat("cannot listen on ", flags.host, ":", flags.port));
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  SetServing(health, false);
  std::fprintf(stderr, "listening on %s:%d\n", flags.host.c_str(), bound_port);
  std::unique_ptr<OpenAIServer> http;
  if (flags.http_port >= 0) {
    absl::StatusOr<std::unique_ptr<OpenAIServer>> started = OpenAIServer::Start(
        {.host = flags.http_host,
         .port = flags.http_port,
         .served_model_name = service_options.model_name,
         .api_key = service_options.api_key,
         .ssl_certfile = flags.ssl_certfile,
         .ssl_keyfile = flags.ssl_keyfile,
         .reasoning_parser = flags.reasoning_parser},
        server->InProcessChannel(grpc::ChannelArguments()), service_options.metrics);
    if (!started.ok()) Fail("HTTP server: " + started.status().ToString());
    http = std::move(*started);
    std::fprintf(stderr, "HTTP (OpenAI API, /metrics) listening on %s:%d\n",
                 flags.http_host.c_str(), http->port());
    if (!flags.http_port_file.empty()) {
      if (absl::Status s = WritePortFile(flags.http_port_file, http->port()); !s.ok()) {
        Fail(std::string(s.message()));
      }
    }
  }
  if (!flags.port_file.empty()) {
    if (absl::Status s = WritePortFile(flags.port_file, bound_port); !s.ok()) {
      Fail(std::string(s.message()));
    }
  }
  LOG(INFO) << "model " << configs.service.model_name << ", max_model_len "
            << configs.service.max_model_len << ", " << configs.group.addresses.size()
            << " worker rank(s); rendezvous store on " << flags.rendezvous_host << ":"
            << (*store)->port() << "; TLS " << (flags.ssl_certfile.empty() ? "off" : "on")
            << (flags.ssl_ca_certs.empty() ? "" : " (client certificates required)") << "; API key "
            << (configs.service.api_key.empty() ? "none" : "required") << "; cluster secret "
            << (secret->empty() ? "none" : "set");

  WorkerGroupOptions group_options = configs.group;
  group_options.rendezvous_address = absl::StrCat(flags.rendezvous_host, ":", (*store)->port());
  // The engine lives across group rebuilds (with a recovery timeout): each new group's client
  // replaces the failed one's under it. Group's thread; main once the group is stopped.
  absl::Mutex serving_mu;  // serving is written on the group's thread, read by main
  std::shared_ptr<ServingEngine> serving;
  const bool recover = flags.recovery_timeout > 0;
  // Each time the group is up: an engine over it (or the engine that waits for it), served.
  group_options.serve =
      [&](std::unique_ptr<ShardedWorkerClient> client,
          const BlockSpaceManagerConfig& cache) -> std::shared_ptr<ServingEngine> {
    if (serving != nullptr) {
      if (cache.num_gpu_blocks != serving->num_gpu_blocks ||
          cache.num_cpu_blocks != serving->num_cpu_blocks) {
        LOG(WARNING) << "the new worker group's KV cache differs: " << cache.num_gpu_blocks
                     << " device blocks, " << cache.num_cpu_blocks << " host blocks";
      }
      // Returns once the engine uses the new client: the old one may go.
      serving->engine->ReplaceExecutor(client.get(), cache);
      serving->executor = std::move(client);
      serving->num_gpu_blocks = cache.num_gpu_blocks;
      serving->num_cpu_blocks = cache.num_cpu_blocks;
      service.SetReady(serving);
      SetServing(health, true);
      return serving;
    }
    auto engine = std::make_shared<ServingEngine>();
    engine->num_gpu_blocks = cache.num_gpu_blocks;
    engine->num_cpu_blocks = cache.num_cpu_blocks;
    engine->executor = std::move(client);
    engine->engine = std::make_unique<EngineCore>(configs.scheduler, cache, engine->executor.get(),
                                                  &detokenizers);
    engine->engine->set_recovery_timeout(absl::Seconds(flags.recovery_timeout));
    engine->engine->set_async_scheduling(flags.async_scheduling);
    engine->engine->Start();
    service.SetReady(engine);
    SetServing(health, true);
    if (recover) {
      absl::MutexLock lock(&serving_mu);
      serving = engine;
    }
    return engine;
  };
  group_options.not_ready = [&](const std::string& reason) {
    SetServing(health, false);
    if (serving != nullptr) {
      service.SetRecovering(reason);  // the requests in flight wait for the next group
    } else {
      (void)service.SetNotReady(reason);
    }
  };
  // A configuration the workers refuse: exit 2 (through the signal path below).
  std::atomic<bool> refused{false};
  group_options.on_permanent_failure = [&](const absl::Status& status) {
    LOG(ERROR) << "the workers refuse this configuration; retrying cannot help: " << status;
    std::fprintf(stderr, "llm-scheduler: the workers refuse this configuration: %s\n",
                 std::string(status.message()).c_str());
    refused = true;
    kill(getpid(), SIGTERM);
  };
  // Each attempt's ranks meet under a prefix of their own: the store keeps that attempt's keys
  // only, not every attempt's since the scheduler started.
  group_options.on_rendezvous = [&store](const std::string& prefix) {
    (void)(*store)->RetainOnly(prefix);
  };
  const std::vector<std::string> worker_addresses = group_options.addresses;
  const std::string cluster_secret = group_options.cluster_secret;
  WorkerGroup group(std::move(group_options));
  group.Start();

  // Until a signal, every 10 s, the heap's free pages go back to the kernel: the scheduler's
  // threads come and go (gRPC's callback threads, each worker group's client threads), and
  // glibc keeps what each thread's arena once held, so resident memory would creep up with the
  // requests and the group rebuilds served (with ConfigureHeap's settings, which this does not
  // replace: it does not trim the top of an arena other than the main one).
  int sig = -1;
  while (sig <= 0) {
    const timespec period = {.tv_sec = 10, .tv_nsec = 0};
    sig = sigtimedwait(&signals, nullptr, &period);
    if (sig <= 0) malloc_trim(0);
  }
  // Drain: no new requests; those in flight may finish until the timeout or a second signal.
  // Draining before health says NOT_SERVING: a client that sees it is refused from then on.
  service.Drain();
  SetServing(health, false);
  // The engine's current engine (null when the group is not ready).
  auto serving_engine = [&] {
    absl::MutexLock lock(&serving_mu);
    return serving;
  };
  // An engine paused on a failed step (a worker died or stalled) cannot finish what is in
  // flight until the group is rebuilt: no drain then.
  // The group is down (the engine paused on a failed step, or the service recovering), now or
  // at any point of the drain: nothing in flight can finish until the group is rebuilt, so
  // the drain ends and the clients are told why.
  auto group_down = [&] {
    if (!service.ready()) return true;
    std::shared_ptr<ServingEngine> held = serving_engine();
    return held != nullptr && held->engine != nullptr && !held->engine->paused_on().ok();
  };
  LOG(INFO) << "signal " << sig << ": draining " << service.num_calls()
            << " request(s) in flight, for up to " << flags.drain_timeout << " s";
  const absl::Time drain_deadline = absl::Now() + absl::Seconds(flags.drain_timeout);
  while (service.num_calls() > 0 && absl::Now() < drain_deadline) {
    if (group_down()) {
      LOG(INFO) << "the worker group is down: ending the drain";
      break;
    }
    const timespec poll = {.tv_sec = 0, .tv_nsec = 20'000'000};
    if (sigtimedwait(&signals, nullptr, &poll) > 0) {
      LOG(INFO) << "second signal: ending the drain";
      break;
    }
  }
  LOG(INFO) << "shutting down; " << service.num_calls() << " request(s) still in flight end";
  // Say so to the clients when the group is down (a worker died, and llm-cluster, which does
  // not restart workers, stops the cluster because of it): the engine's failure, or a rank
  // that does not answer Health now.
  const std::string why =
      refused ? "" : GroupDownReason(serving_engine().get(), worker_addresses, cluster_secret);
  std::shared_ptr<ServingEngine> engine = service.Shutdown(why);
  if (http != nullptr) http->Stop();  // its streams ended with the service's calls
  group.Stop();
  engine.reset();
  {
    absl::MutexLock lock(&serving_mu);
    serving.reset();
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return refused ? 2 : 0;
}

}  // namespace
}  // namespace llm

int main(int argc, char** argv) {
  llm::ReexecWithoutThreadCaches(argv);
  llm::ConfigureHeap();
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  return llm::Run(argc, argv);
}
