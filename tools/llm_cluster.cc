// llm-cluster: starts a local cluster from a manifest (deploy/local/*.yaml): one llm-worker
// per tensor-parallel rank, then llm-scheduler pointed at them, all on this machine. It waits
// until the scheduler's grpc.health.v1 says SERVING, prints the address and how to call it,
// and then supervises:
//   - SIGINT / SIGTERM / SIGHUP: stop every child (SIGTERM, then SIGKILL after --grace), exit 0.
//     The scheduler first, and it drains (finishes the requests in flight): it gets the
//     manifest's drain_timeout (default 30 s) on top of --grace before SIGKILL; the workers
//     are stopped once it has exited.
// The cluster secret: unless LLM_CLUSTER_SECRET is set already or the manifest names a
// cluster_secret_file, a random one is made and handed to every child in LLM_CLUSTER_SECRET
// (the environment, not argv, which ps shows). LLM_API_KEY, when set, reaches the scheduler
// the same way. With engine ssl_certfile the readiness check speaks TLS (scheduler.tls_ca,
// default the certificate itself; scheduler.tls_server_name).
//   - a child that exits on its own: report which and how, stop the rest, exit 1; except a
//     worker when the manifest says `restart_workers: true`: it is started again on the same
//     port after restart_delay_s (the scheduler re-initializes the group when it is back, and
//     the requests in flight continue on it); and the scheduler when it says
//     `restart_scheduler: true`: it is started again on the same port after restart_delay_s
//     and initializes the workers anew (they are not restarted). Its clients lost their calls
//     with its connections (UNAVAILABLE); new calls are served once it reports SERVING.
//   - the scheduler exits 2 (the workers refuse the configuration, e.g. heads not divisible by
//     the ranks: retrying cannot help; its message is forwarded just before): stop the rest
//     and exit 2 at once, also during startup.
// With `device: cuda` rank r gets --device=cuda:r (one GPU per rank; the scheduler gets
// --device=cuda). Children cannot outlive llm-cluster, even when it is SIGKILLed
// (PR_SET_PDEATHSIG), and run in their own process group so a terminal's Ctrl-C reaches only
// llm-cluster. Their output is forwarded to stderr line by line, prefixed "[scheduler] " or
// "[worker N] ".
//
//   llm-cluster --manifest=deploy/local/tp2-cpu.yaml [--scheduler-port=N]
//               [--worker-base-port=N] [--port-file=PATH] [--worker-binary=NAME]
//
// --port-file receives the scheduler's port (decimal, newline; written atomically) once the
// cluster is serving. llm-worker and llm-scheduler are found next to this binary (--bin-dir);
// --worker-binary=llm-worker-emu runs the workers from the CUDA-emulation build instead (a
// name is looked up in --bin-dir, a path with a '/' is used as it is).
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cluster_secret.h"
#include "common/flag_parser.h"
#include "common/grpc_security.h"
#include "common/port_file.h"
#include "tools/child_process.h"
#include "tools/cluster_manifest.h"
#include "tools/health_check.h"

namespace llm {
namespace {

namespace fs = std::filesystem;

struct Args {
  std::string manifest;
  std::string model;          // empty: the manifest's
  int scheduler_port = -1;    // -1: the manifest's
  int worker_base_port = -1;  // -1: the manifest's
  std::string port_file;
  std::string bin_dir;                       // empty: the directory of this binary
  std::string worker_binary = "llm-worker";  // a name in bin_dir, or a path with a '/'
                                             // (Run() makes it a path)
  double grace_s = 10;
};

void Log(const std::string& msg) {
  std::fprintf(stderr, "llm-cluster: %s\n", msg.c_str());
  std::fflush(stderr);
}

// The address a client on this machine uses for a server listening on `host`.
std::string ClientHost(const std::string& host) {
  return host == "0.0.0.0" || host == "::" || host.empty() ? "127.0.0.1" : host;
}

class Cluster {
 public:
  Cluster(ClusterManifest manifest, Args args, int signal_fd)
      : m_(std::move(manifest)), args_(std::move(args)), signal_fd_(signal_fd) {}
  ~Cluster() { StopAll(); }

  // Starts everything and waits until the scheduler serves. Fails on a child's early exit,
  // the startup timeout or a stop signal.
  absl::Status Start();
  // Supervises until a stop signal (returns 0) or a fatal child exit (returns 1).
  int Supervise();
  void StopAll();
  // Whether the scheduler exited 2: the workers refused its configuration (llm-scheduler).
  bool SchedulerRefused() const {
    if (scheduler_ == nullptr || !scheduler_->wait_status().has_value()) return false;
    const int status = *scheduler_->wait_status();
    return WIFEXITED(status) && WEXITSTATUS(status) == 2;
  }

 private:
  struct Worker {
    int rank = 0;
    int port = 0;
    std::string port_file;
    std::unique_ptr<ChildProcess> process;
    std::optional<absl::Time> restart_at;
  };

  absl::Status StartWorker(Worker& w, int port);
  // cuda: rank r on GPU r of this machine (as NCCL wants: one device per rank), so that
  // tensor_parallel_size ranks need that many visible GPUs.
  std::string WorkerDevice(int rank) const {
    return m_.device == "cuda" ? absl::StrCat("cuda:", rank) : m_.device;
  }
  // Reads pending signals: true when a stop signal arrived. Waits up to `timeout` for one.
  bool TakeSignals(absl::Duration timeout);
  // The first child found dead (reaped), as a message; restarts are scheduled here.
  std::optional<std::string> CheckChildren();
  void RestartDueChildren();
  absl::Status StartScheduler();
  absl::Status WaitUntil(const std::string& what, const std::function<bool()>& ready,
                         absl::Time deadline);

  const ClusterManifest m_;
  const Args args_;
  const int signal_fd_;
  std::string tmp_dir_;
  std::string model_dir_;
  std::vector<Worker> workers_;
  std::unique_ptr<ChildProcess> scheduler_;
  ChildSpec scheduler_spec_;  // --port= becomes the port it got, once known
  std::string scheduler_port_file_;
  std::optional<absl::Time> scheduler_restart_at_;
  int scheduler_port_ = 0;
  bool stop_requested_ = false;
  bool serving_ = false;  // Start() succeeded: from now on a dead worker may be restarted
};

absl::Status Cluster::StartWorker(Worker& w, int port) {
  std::error_code ec;
  fs::remove(w.port_file, ec);
  ChildSpec spec;
  spec.argv = {args_.worker_binary, "--host=" + m_.workers_host, absl::StrCat("--port=", port),
               "--port-file=" + w.port_file, "--device=" + WorkerDevice(w.rank)};
  for (const std::string& f : m_.WorkerFlags()) spec.argv.push_back(f);
  spec.log_prefix = absl::StrCat("[worker ", w.rank, "] ");
  absl::StatusOr<std::unique_ptr<ChildProcess>> p = ChildProcess::Start(spec);
  if (!p.ok()) return p.status();
  w.process = std::move(*p);
  w.restart_at.reset();
  Log(absl::StrCat("worker rank ", w.rank, " pid ", w.process->pid(), ": ",
                   absl::StrJoin(spec.argv, " ")));
  return absl::OkStatus();
}

bool Cluster::TakeSignals(absl::Duration timeout) {
  const int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
  pollfd pfd{signal_fd_, POLLIN, 0};
  if (poll(&pfd, 1, timeout_ms) <= 0) return stop_requested_;
  signalfd_siginfo info;
  while (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
    if (info.ssi_signo != SIGCHLD && !stop_requested_) {
      Log(absl::StrCat("got ", strsignal(static_cast<int>(info.ssi_signo)), ", stopping"));
      stop_requested_ = true;
    }
  }
  return stop_requested_;
}

std::optional<std::string> Cluster::CheckChildren() {
  if (scheduler_ != nullptr && !scheduler_restart_at_.has_value() &&
      scheduler_->Poll().has_value()) {
    const std::string what = absl::StrCat("the scheduler (pid ", scheduler_->pid(), ") ",
                                          ChildProcess::DescribeStatus(*scheduler_->wait_status()));
    // As for workers, only once serving; and never one the workers refused (exit 2).
    if (!m_.restart_scheduler || !serving_ || SchedulerRefused()) return what;
    Log(absl::StrCat(what, "; restarting it on port ", scheduler_port_, " in ", m_.restart_delay_s,
                     " s"));
    scheduler_restart_at_ = absl::Now() + absl::Seconds(m_.restart_delay_s);
  }
  for (Worker& w : workers_) {
    if (w.process == nullptr || w.restart_at.has_value() || !w.process->Poll().has_value()) {
      continue;
    }
    const std::string what = absl::StrCat("worker rank ", w.rank, " (pid ", w.process->pid(), ") ",
                                          ChildProcess::DescribeStatus(*w.process->wait_status()));
    // Restarts only once the group is up (Start() returned): during startup a dying worker is
    // a configuration error that a restart would only repeat, and nothing restarts it there.
    if (!m_.restart_workers || !serving_) return what;
    Log(absl::StrCat(what, "; restarting it on port ", w.port, " in ", m_.restart_delay_s, " s"));
    w.restart_at = absl::Now() + absl::Seconds(m_.restart_delay_s);
  }
  return std::nullopt;
}

absl::Status Cluster::StartScheduler() {
  std::error_code ec;
  fs::remove(scheduler_port_file_, ec);
  absl::StatusOr<std::unique_ptr<ChildProcess>> p = ChildProcess::Start(scheduler_spec_);
  if (!p.ok()) return p.status();
  scheduler_ = std::move(*p);
  scheduler_restart_at_.reset();
  Log(absl::StrCat("scheduler pid ", scheduler_->pid(), ": ",
                   absl::StrJoin(scheduler_spec_.argv, " ")));
  return absl::OkStatus();
}

void Cluster::RestartDueChildren() {
  if (scheduler_restart_at_.has_value() && absl::Now() >= *scheduler_restart_at_) {
    if (absl::Status s = StartScheduler(); !s.ok()) {
      Log(absl::StrCat("cannot restart the scheduler: ", s.ToString()));
      scheduler_restart_at_ = absl::Now() + absl::Seconds(m_.restart_delay_s);
    }
  }
  for (Worker& w : workers_) {
    if (!w.restart_at.has_value() || absl::Now() < *w.restart_at) continue;
    if (absl::Status s = StartWorker(w, w.port); !s.ok()) {
      Log(absl::StrCat("cannot restart worker rank ", w.rank, ": ", s.ToString()));
      w.restart_at = absl::Now() + absl::Seconds(m_.restart_delay_s);
    }
  }
}

absl::Status Cluster::WaitUntil(const std::string& what, const std::function<bool()>& ready,
                                absl::Time deadline) {
  while (!ready()) {
    if (std::optional<std::string> dead = CheckChildren()) {
      return absl::UnavailableError(absl::StrCat(*dead, " while waiting for ", what));
    }
    if (TakeSignals(absl::Milliseconds(50))) {
      return absl::CancelledError("stopped while waiting for " + what);
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, " did not happen within ",
                                                      m_.startup_timeout_s,
                                                      " s (startup_timeout_s in the manifest)"));
    }
  }
  return absl::OkStatus();
}

absl::Status Cluster::Start() {
  const absl::Time deadline = absl::Now() + absl::Seconds(m_.startup_timeout_s);
  char tmpl[] = "/tmp/llm-cluster.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed");
  tmp_dir_ = tmpl;
  std::error_code ec;
  model_dir_ = fs::absolute(m_.model, ec).lexically_normal().string();
  const bool gguf_file = model_dir_.ends_with(".gguf") && fs::is_regular_file(model_dir_, ec);
  if (!gguf_file && !fs::is_directory(model_dir_, ec)) {
    return absl::NotFoundError(absl::StrCat(args_.manifest, ": model: ", m_.model,
                                            " is not a directory or a .gguf file (relative "
                                            "paths are relative "
                                            "to the current directory, ",
                                            fs::current_path(ec).string(), ")"));
  }

  workers_.resize(m_.tensor_parallel_size);
  for (int r = 0; r < m_.tensor_parallel_size; ++r) {
    Worker& w = workers_[r];
    w.rank = r;
    w.port_file = absl::StrCat(tmp_dir_, "/worker-", r, ".port");
    if (absl::Status s = StartWorker(w, m_.workers_base_port == 0 ? 0 : m_.workers_base_port + r);
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = WaitUntil(
          "the workers' ports",
          [&] {
            for (Worker& w : workers_) {
              if (w.port == 0) w.port = ReadPortFile(w.port_file).value_or(0);
              if (w.port == 0) return false;
            }
            return true;
          },
          deadline);
      !s.ok()) {
    return s;
  }

  std::vector<std::string> addresses;
  for (const Worker& w : workers_) {
    addresses.push_back(absl::StrCat(ClientHost(m_.workers_host), ":", w.port));
  }
  scheduler_port_file_ = tmp_dir_ + "/scheduler.port";
  ChildSpec& spec = scheduler_spec_;
  spec.argv = {
      args_.bin_dir + "/llm-scheduler",
      "--model=" + model_dir_,
      "--host=" + m_.scheduler_host,
      absl::StrCat("--port=", args_.scheduler_port >= 0 ? args_.scheduler_port : m_.scheduler_port),
      "--port-file=" + scheduler_port_file_,
      "--worker-addresses=" + absl::StrJoin(addresses, ","),
      absl::StrCat("--tensor-parallel-size=", m_.tensor_parallel_size),
      "--device=" + m_.device};
  for (const std::string& f : m_.SchedulerFlags()) spec.argv.push_back(f);
  spec.log_prefix = "[scheduler] ";
  if (absl::Status s = StartScheduler(); !s.ok()) return s;

  if (absl::Status s = WaitUntil(
          "the scheduler's port",
          [&] {
            scheduler_port_ = ReadPortFile(scheduler_port_file_).value_or(0);
            return scheduler_port_ != 0;
          },
          deadline);
      !s.ok()) {
    return s;
  }
  // A restarted scheduler listens where its clients know to find it.
  for (std::string& arg : spec.argv) {
    if (arg.starts_with("--port=")) arg = absl::StrCat("--port=", scheduler_port_);
  }
  const std::string address = absl::StrCat(ClientHost(m_.scheduler_host), ":", scheduler_port_);
  PublicChannelOptions channel_options;
  if (!m_.EngineOption("ssl_certfile").empty()) {
    channel_options.tls = true;
    channel_options.tls_ca =
        m_.scheduler_tls_ca.empty() ? m_.EngineOption("ssl_certfile") : m_.scheduler_tls_ca;
    channel_options.tls_server_name = m_.scheduler_tls_server_name;
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      CreatePublicChannel(address, channel_options);
  if (!channel.ok()) return channel.status();
  HealthChecker health(*channel);
  if (absl::Status s = WaitUntil(
          "the scheduler to report SERVING",
          [&] { return health.Check("", absl::Seconds(1)) == HealthChecker::kServing; }, deadline);
      !s.ok()) {
    return s;
  }
  if (!args_.port_file.empty()) {
    if (absl::Status s = WritePortFile(args_.port_file, scheduler_port_); !s.ok()) return s;
  }

  fs::path client = fs::path(args_.bin_dir) / "llm-client";
  const fs::path relative = fs::relative(client, fs::current_path(ec), ec);
  if (!ec && !relative.empty() && relative.string().rfind("..", 0) != 0) client = relative;
  std::printf(
      "llm-cluster: serving %s (tensor_parallel_size %d, %s) at %s\n"
      "  scheduler pid %d; workers:",
      m_.model.c_str(), m_.tensor_parallel_size, m_.device.c_str(), address.c_str(),
      scheduler_->pid());
  for (const Worker& w : workers_) {
    std::printf(" rank %d %s pid %d;", w.rank, addresses[w.rank].c_str(), w.process->pid());
  }
  std::printf(
      "\n  try:  %s --address=%s generate \"Once upon a time\" --max-tokens=64\n"
      "        %s --address=%s info      (and: stats)\n"
      "  stop: Ctrl-C or kill -TERM %d\n",
      client.c_str(), address.c_str(), client.c_str(), address.c_str(), getpid());
  std::fflush(stdout);
  serving_ = true;
  return absl::OkStatus();
}

int Cluster::Supervise() {
  while (!TakeSignals(absl::Milliseconds(100))) {
    if (std::optional<std::string> dead = CheckChildren()) {
      Log(*dead + "; stopping the cluster");
      return SchedulerRefused() ? 2 : 1;
    }
    RestartDueChildren();
  }
  return 0;
}

void Cluster::StopAll() {
  const absl::Duration grace = absl::Seconds(args_.grace_s);
  // The scheduler first, so that it does not report the workers' exits as failures, and so
  // that it drains (the requests in flight finish on the workers) before they stop.
  if (scheduler_ != nullptr && scheduler_->running()) {
    double drain_s = 30;  // llm-scheduler's default --drain-timeout
    if (const std::string d = m_.EngineOption("drain_timeout"); !d.empty()) {
      (void)absl::SimpleAtod(d, &drain_s);
    }
    const int status = scheduler_->Stop(grace + absl::Seconds(drain_s));
    Log(absl::StrCat("scheduler ", ChildProcess::DescribeStatus(status)));
  }
  for (Worker& w : workers_) {
    if (w.process != nullptr) w.process->Signal(SIGTERM);
  }
  for (Worker& w : workers_) {
    if (w.process == nullptr || !w.process->running()) continue;
    const int status = w.process->Stop(grace);
    Log(absl::StrCat("worker rank ", w.rank, " ", ChildProcess::DescribeStatus(status)));
  }
  scheduler_.reset();
  workers_.clear();  // joins the log threads
  if (!tmp_dir_.empty()) {
    std::error_code ec;
    fs::remove_all(tmp_dir_, ec);
    tmp_dir_.clear();
  }
}

std::string SelfDir() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "." : self.parent_path().string();
}

int Run(int argc, char** argv) {
  Args args;
  FlagParser flags(
      "usage: llm-cluster --manifest=FILE [--scheduler-port=N] [--worker-base-port=N] "
      "[--port-file=PATH] [--worker-binary=NAME]\n"
      "Starts llm-worker (one per tensor-parallel rank) and llm-scheduler on this machine as "
      "the manifest\nsays, waits until they serve, and stops them all on SIGINT/SIGTERM.\n"
      "Without a GPU, `device: cuda` manifests run with --worker-binary=llm-worker-emu (the "
      "worker built\nagainst the CUDA emulation: same flags, emulated devices, slow).");
  flags.Add("manifest", &args.manifest, "cluster manifest (deploy/local/tp2-cpu.yaml)");
  flags.Add("model", &args.model,
            "the model (a Hugging Face directory or a .gguf file), overriding the manifest's "
            "(none)");
  flags.Add("scheduler-port", &args.scheduler_port,
            "the scheduler's port, overriding the manifest (0: any free port; -1: the "
            "manifest's) (-1)");
  flags.Add("worker-base-port", &args.worker_base_port,
            "rank r listens on this + r, overriding the manifest (0: any free ports; -1: the "
            "manifest's) (-1)");
  flags.Add("port-file", &args.port_file,
            "write the scheduler's port here once the cluster serves (none)");
  flags.Add("bin-dir", &args.bin_dir,
            "where llm-worker and llm-scheduler are (the directory of llm-cluster)");
  flags.Add("worker-binary", &args.worker_binary,
            "the worker executable: a name looked up in --bin-dir, or a path containing '/'; "
            "llm-worker-emu: the CUDA-emulation build (llm-worker)");
  flags.Add("grace", &args.grace_s, "seconds a child has to stop after SIGTERM (10)");
  flags.Parse(argc, argv);
  if (args.manifest.empty()) {
    std::fprintf(stderr, "llm-cluster: --manifest is required\n\n%s", flags.Usage().c_str());
    return 2;
  }
  if (args.bin_dir.empty()) args.bin_dir = SelfDir();
  if (args.worker_binary.find('/') == std::string::npos) {
    args.worker_binary = args.bin_dir + "/" + args.worker_binary;
  }
  {
    std::error_code ec;
    const bool file = fs::is_regular_file(args.worker_binary, ec);
    if (!file || access(args.worker_binary.c_str(), X_OK) != 0) {
      Log(absl::StrCat("--worker-binary: ", args.worker_binary, " is not an executable file",
                       file ? absl::StrCat(" (", strerror(errno), ")") : std::string()));
      return 2;
    }
  }
  absl::StatusOr<ClusterManifest> manifest = LoadClusterManifest(args.manifest);
  if (!manifest.ok()) {
    Log(std::string(manifest.status().message()));
    return 2;
  }
  if (args.worker_base_port >= 0) manifest->workers_base_port = args.worker_base_port;
  if (!args.model.empty()) manifest->model = args.model;
  if (!manifest->EngineOption("ssl_ca_certs").empty()) {
    Log(absl::StrCat(args.manifest,
                     ": engine.ssl_ca_certs: llm-cluster's readiness check "
                     "presents no client certificate; run llm-scheduler "
                     "directly to require them"));
    return 2;
  }
  // The cluster secret for the internal ports (see the top of this file).
  const std::string secret_file = manifest->EngineOption("cluster_secret_file");
  if (!secret_file.empty()) {
    bool worker_has_it = false;
    for (const auto& [k, v] : manifest->worker) worker_has_it |= k == "cluster_secret_file";
    if (!worker_has_it) manifest->worker.emplace_back("cluster_secret_file", secret_file);
  } else if (const char* env = std::getenv(kClusterSecretEnv); env == nullptr || *env == 0) {
    absl::StatusOr<std::string> secret = GenerateClusterSecret();
    if (!secret.ok()) {
      Log(std::string(secret.status().message()));
      return 1;
    }
    setenv(kClusterSecretEnv, secret->c_str(), 1);
  }

  // Signals are read from a signalfd by the main thread; every thread inherits the mask.
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&mask, sig);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);
  const int signal_fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  if (signal_fd < 0) {
    Log("signalfd failed");
    return 1;
  }

  Cluster cluster(std::move(*manifest), args, signal_fd);
  if (absl::Status s = cluster.Start(); !s.ok()) {
    Log(std::string(s.message()));
    if (cluster.SchedulerRefused()) {
      Log("the workers refuse this configuration (the scheduler's message is above); retrying "
          "cannot help: fix the manifest");
      cluster.StopAll();
      return 2;
    }
    cluster.StopAll();
    return s.code() == absl::StatusCode::kCancelled ? 0 : 1;
  }
  const int rc = cluster.Supervise();
  cluster.StopAll();
  Log(rc == 0 ? "stopped" : "stopped after a failure");
  return rc;
}

}  // namespace
}  // namespace llm

int main(int argc, char** argv) { return llm::Run(argc, argv); }
