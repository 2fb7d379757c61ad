#include "tests/integration/cluster_harness.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/grpc_security.h"
#include "common/port_file.h"
#include "tools/local_engine.h"

namespace llm::testing {
namespace fs = std::filesystem;

std::string DefaultModel() { return std::string(LLM_TEST_DATA_DIR) + "/models/tiny-llama"; }

namespace {

// /proc/PID/stat, or "" when the process is gone (reading the file of a process that exits
// meanwhile fails with ESRCH, which std::filebuf turns into an exception).
std::string ReadStat(const fs::path& path) {
  std::ifstream in(path);
  try {
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  } catch (const std::ios_base::failure&) {
    return "";
  }
}

}  // namespace

std::vector<std::pair<pid_t, std::string>> ChildrenOf(pid_t parent) {
  std::vector<std::pair<pid_t, std::string>> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator("/proc", ec)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(e.path().filename().string(), &pid)) continue;
    const std::string stat = ReadStat(e.path() / "stat");
    // pid (comm) state ppid ...; comm may hold spaces and parentheses: split at the last ')'.
    const size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    char state;
    pid_t ppid;
    if (!(rest >> state >> ppid) || ppid != parent || state == 'Z') continue;
    out.emplace_back(pid, stat.substr(open + 1, close - open - 1));
  }
  return out;
}

namespace {

// Alive: exists and is not a zombie.
bool Alive(pid_t pid) {
  const std::string stat = ReadStat(absl::StrCat("/proc/", pid, "/stat"));
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  return stat[close + 2] != 'Z' && stat[close + 2] != 'X';
}

}  // namespace

std::vector<pid_t> WaitUntilGone(const std::vector<pid_t>& pids, absl::Duration timeout) {
  // Gone: reaped here (as a child subreaper the test adopts a killed llm-cluster's orphans; a
  // zombie leader may still be waiting for its threads, so only a successful reap counts), or
  // not ours to reap and no longer alive.
  auto gone = [](pid_t p) {
    const pid_t r = waitpid(p, nullptr, WNOHANG);
    if (r == p) return true;
    return r < 0 && errno == ECHILD && !Alive(p);
  };
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<pid_t> alive = pids;
  while (true) {
    alive.erase(std::remove_if(alive.begin(), alive.end(), gone), alive.end());
    if (alive.empty() || absl::Now() > deadline) return alive;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(const ClusterOptions& options) {
  auto c = std::unique_ptr<LocalCluster>(new LocalCluster());
  char tmpl[] = "/tmp/llm-cluster-test.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp");
  c->dir_ = tmpl;
  const std::string manifest =
      options.manifest.empty() ? c->dir_ + "/cluster.yaml" : options.manifest;
  const std::string port_file = c->dir_ + "/port";
  if (options.manifest.empty()) {
    std::ofstream out(manifest);
    out << "model: " << (options.model.empty() ? DefaultModel() : options.model) << "\n"
        << "tensor_parallel_size: " << options.tensor_parallel_size << "\n"
        << "device: " << options.device << "\n"
        << "scheduler: {host: 127.0.0.1, port: 0}\n"
        << "workers: {host: " << options.worker_host << ", base_port: 0}\n"
        << "restart_workers: " << (options.restart_workers ? "true" : "false") << "\n"
        << "restart_scheduler: " << (options.restart_scheduler ? "true" : "false") << "\n"
        << "restart_delay_s: " << options.restart_delay_s << "\n"
        << "startup_timeout_s: 90\n"
        << "engine:\n";
    auto given = [&](const char* key) {
      return std::any_of(options.engine.begin(), options.engine.end(),
                         [&](const auto& kv) { return kv.first == key; });
    };
    // Small caches (and a swap space, which preemption tests use) unless the test sizes them.
    if (!given("cpu_kv_cache_space")) out << "  cpu_kv_cache_space: 0.05\n";
    if (!given("swap_space")) out << "  swap_space: 0.05\n";
    // The default step deadline, unless the test sets its own.
    if (std::none_of(options.engine.begin(), options.engine.end(),
                     [](const auto& kv) { return kv.first == "worker_timeout"; })) {
      out << "  worker_timeout: 30\n";
    }
    // float32 unless the test says otherwise: greedy outputs are compared with the in-process
    // engine's (float32) and across TP sizes, which bf16 (auto's choice on CPUs with
    // AVX512_BF16) does not promise bit for bit.
    bool dtype_given = false;
    for (const auto& [k, v] : options.engine) {
      out << "  " << k << ": " << v << "\n";
      dtype_given = dtype_given || k == "dtype";
    }
    if (!dtype_given) out << "  dtype: float32\n";
    out << "worker: {threads: 1";
    for (const auto& [k, v] : options.worker) out << ", " << k << ": " << v;
    out << "}\n";
  }
  std::vector<std::string> argv = {std::string(LLM_BIN_DIR) + "/llm-cluster",
                                   "--manifest=" + manifest,
                                   "--port-file=" + port_file,
                                   "--grace=10",
                                   "--scheduler-port=0",
                                   "--worker-base-port=0"};
  if (!options.worker_binary.empty()) argv.push_back("--worker-binary=" + options.worker_binary);
  if (!options.api_key.empty()) setenv("LLM_API_KEY", options.api_key.c_str(), 1);
  absl::StatusOr<std::unique_ptr<ChildProcess>> p = ChildProcess::Start({.argv = argv});
  if (!options.api_key.empty()) unsetenv("LLM_API_KEY");
  if (!p.ok()) return p.status();
  c->process_ = std::move(*p);
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  std::optional<int> port;
  while (!(port = ReadPortFile(port_file)).has_value()) {
    for (const auto& [pid, comm] : ChildrenOf(c->process_->pid())) c->seen_children_.push_back(pid);
    if (c->process_->Poll().has_value()) {
      return absl::UnavailableError(
          absl::StrCat("llm-cluster ", ChildProcess::DescribeStatus(*c->process_->wait_status()),
                       " before serving (its log is above)"));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError("llm-cluster did not serve within 120 s");
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  c->address_ = absl::StrCat("127.0.0.1:", *port);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      CreatePublicChannel(c->address_, {.tls_ca = options.tls_ca, .api_key = options.api_key});
  if (!channel.ok()) return channel.status();
  c->stub_ = v1::LLMService::NewStub(*std::move(channel));
  for (pid_t pid : c->Children()) c->seen_children_.push_back(pid);
  return c;
}

LocalCluster::~LocalCluster() {
  if (process_ != nullptr && process_->running()) (void)Stop();
  if (!dir_.empty()) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
}

std::vector<pid_t> LocalCluster::Children() const {
  std::vector<pid_t> out;
  for (const auto& [pid, comm] : ChildrenOf(process_->pid())) out.push_back(pid);
  return out;
}

std::vector<pid_t> LocalCluster::WorkerPids() const {
  std::vector<pid_t> out;
  for (const auto& [pid, comm] : ChildrenOf(process_->pid())) {
    if (comm.rfind("llm-worker", 0) == 0) out.push_back(pid);  // llm-worker, llm-worker-emu
  }
  return out;
}

pid_t LocalCluster::SchedulerPid() const {
  for (const auto& [pid, comm] : ChildrenOf(process_->pid())) {
    if (comm == "llm-scheduler") return pid;
  }
  return 0;
}

absl::StatusOr<int> LocalCluster::Stop() {
  if (process_->running()) {
    for (pid_t pid : Children()) seen_children_.push_back(pid);
  }
  process_->Signal(SIGTERM);
  std::optional<int> status = process_->Wait(absl::Seconds(60));
  if (!status.has_value()) {
    process_->Stop(absl::Seconds(1));
    return absl::DeadlineExceededError("llm-cluster did not stop within 60 s of SIGTERM");
  }
  const std::vector<pid_t> left = WaitUntilGone(seen_children_, absl::Seconds(30));
  if (!left.empty()) {
    for (pid_t pid : left) kill(pid, SIGKILL);
    return absl::InternalError(
        absl::StrCat("processes left behind by llm-cluster: ", absl::StrJoin(left, ", ")));
  }
  if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    return absl::InternalError("llm-cluster " + ChildProcess::DescribeStatus(*status));
  }
  return *status;
}

GenerateResult Generate(v1::LLMService::Stub& stub, const v1::GenerateRequest& request,
                        absl::Duration deadline) {
  GenerateResult r;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(deadline));
  auto reader = stub.Generate(&ctx, request);
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    ++r.num_responses;
    r.request_id = resp.request_id();
    for (const v1::SequenceOutput& s : resp.outputs()) {
      auto& ids = r.token_ids[s.index()];
      ids.insert(ids.end(), s.token_ids().begin(), s.token_ids().end());
      for (const v1::Logprobs& l : s.logprobs()) {
        r.logprobs[s.index()].push_back(l.sampled().logprob());
        if (l.top_size() >= 2) {
          r.margins[s.index()].push_back(l.top(0).logprob() - l.top(1).logprob());
        }
      }
      r.text[s.index()] += s.text();
      if (s.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
        r.finish_reason[s.index()] = s.finish_reason();
      }
    }
    if (resp.has_usage()) {
      r.usage = resp.usage();
      r.has_usage = true;
    }
  }
  r.status = reader->Finish();
  return r;
}

v1::GenerateRequest GreedyRequest(const std::string& prompt, int max_tokens, bool ignore_eos) {
  v1::GenerateRequest req;
  req.set_text(prompt);
  req.set_add_special_tokens(true);
  req.set_stream(true);
  v1::SamplingParams* p = req.mutable_sampling_params();
  p->set_temperature(0);
  p->set_max_tokens(max_tokens);
  p->set_ignore_eos(ignore_eos);
  return req;
}

absl::StatusOr<v1::GetStatsResponse> GetStats(v1::LLMService::Stub& stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::GetStatsResponse r;
  const grpc::Status s = stub.GetStats(&ctx, {}, &r);
  if (!s.ok())
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  return r;
}

absl::StatusOr<v1::GetModelInfoResponse> GetModelInfo(v1::LLMService::Stub& stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::GetModelInfoResponse r;
  const grpc::Status s = stub.GetModelInfo(&ctx, {}, &r);
  if (!s.ok())
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  return r;
}

absl::Duration TimeUntilNotServing(const HealthChecker& health, absl::Time since,
                                   absl::Duration limit) {
  while (absl::Now() - since < limit) {
    if (health.Check("", absl::Seconds(5)) != HealthChecker::kServing) return absl::Now() - since;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::InfiniteDuration();
}

bool WaitUntilServing(const HealthChecker& health, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while (absl::Now() < deadline) {
    if (health.Check("", absl::Seconds(5)) == HealthChecker::kServing) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

absl::StatusOr<v1::GetStatsResponse> WaitUntilAllBlocksFree(v1::LLMService::Stub& stub,
                                                            absl::Duration timeout) {
  absl::StatusOr<v1::GetModelInfoResponse> info = GetModelInfo(stub);
  if (!info.ok()) return info.status();
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::StatusOr<v1::GetStatsResponse> s = GetStats(stub);
    if (!s.ok()) return s.status();
    const bool idle = s->num_running() == 0 && s->num_waiting() == 0 && s->num_swapped() == 0 &&
                      s->num_free_gpu_blocks() == info->num_gpu_blocks();
    if (idle || absl::Now() > deadline) return s;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

namespace {

// Greedy runs of the in-process engine, one prompt at a time; with `top_logprobs` > 0 also the
// sampled token's logprob and the top-2 margin of every step.
absl::StatusOr<std::vector<ReferenceOutput>> RunReference(const std::string& model_dir,
                                                          const std::vector<std::string>& prompts,
                                                          int max_tokens, bool ignore_eos,
                                                          int top_logprobs) {
  absl::StatusOr<std::unique_ptr<LocalEngine>> local = LocalEngine::Create(model_dir, {});
  if (!local.ok()) return local.status();
  EngineCore& engine = (*local)->engine();
  std::vector<ReferenceOutput> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest req;
    req.request_id = absl::StrCat("reference-", i);
    req.prompt_token_ids = (*local)->tokenizer().Encode(prompts[i], /*add_special_tokens=*/true);
    req.sampling_params.temperature = 0;
    req.sampling_params.max_tokens = max_tokens;
    req.sampling_params.ignore_eos = ignore_eos;
    if (top_logprobs > 0) req.sampling_params.logprobs = top_logprobs;
    ReferenceOutput result;
    absl::Status failed;
    absl::Status add = engine.AddRequest(std::move(req), [&](const StreamUpdate& u) {
      if (!u.status.ok()) {
        failed = u.status;
        return;
      }
      for (const SequenceOutput& seq : u.outputs->Seqs(*u.output)) {
        for (uint32_t k = 0; k < seq.new_token_ids.size; ++k) {
          const uint32_t at = seq.new_token_ids.begin + k;
          result.token_ids.push_back(u.outputs->token_ids[at]);
          if (top_logprobs == 0) continue;
          if (at >= u.outputs->logprobs.size() || u.outputs->logprobs[at].top.size() < 2) {
            failed = absl::InternalError("the reference engine returned no top-2 logprobs");
            return;
          }
          const SampleLogprobs& l = u.outputs->logprobs[at];
          result.logprobs.push_back(l.logprob);
          result.margins.push_back(l.top[0].second - l.top[1].second);
        }
      }
    });
    if (!add.ok()) return add;
    if (absl::Status s = engine.RunUntilIdle(); !s.ok()) return s;
    if (!failed.ok()) return failed;
    out.push_back(std::move(result));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::vector<int32_t>>> ReferenceGreedy(
    const std::string& model_dir, const std::vector<std::string>& prompts, int max_tokens,
    bool ignore_eos) {
  absl::StatusOr<std::vector<ReferenceOutput>> r =
      RunReference(model_dir, prompts, max_tokens, ignore_eos, /*top_logprobs=*/0);
  if (!r.ok()) return r.status();
  std::vector<std::vector<int32_t>> out;
  for (ReferenceOutput& o : *r) out.push_back(std::move(o.token_ids));
  return out;
}

absl::StatusOr<std::vector<ReferenceOutput>> ReferenceGreedyWithMargins(
    const std::string& model_dir, const std::vector<std::string>& prompts, int max_tokens) {
  return RunReference(model_dir, prompts, max_tokens, /*ignore_eos=*/true, /*top_logprobs=*/2);
}

}  // namespace llm::testing
