// llm-worker: one tensor-parallel rank of the model, served over gRPC (llm.v1.WorkerService,
// grpc.health.v1, reflection). It starts empty; the scheduler sends Init (model, rank, group),
// ProfileMemory, InitCache, then one Step stream (worker_server.h has the lifecycle).
//
//   llm-worker [--host=0.0.0.0] [--port=50061] [--port-file=PATH] [--peer-host=127.0.0.1]
//              [--device=cpu|cuda|cuda:N] [--threads=0]        (--help lists them)
//
// llm-worker-emu is the same program built against the CUDA emulation (cuda_emu):
// --device=cuda runs the real CUDA sources on the CPU, for tests.
//
// Logs "listening on HOST:PORT" to stderr once serving; with --port-file writes the bound port
// there (PATH.tmp, then renamed). SIGTERM / SIGINT (or the Shutdown rpc) stop it: rpcs in
// flight get a second, then it exits 0. Exit 1 when it cannot serve, 2 for a bad flag.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "common/cluster_secret.h"
#include "common/flag_parser.h"
#include "common/port_file.h"
#include "kernels/cpu/blas_setup.h"
#include "kernels/cpu/packed_linear.h"
#include "kernels/cpu/thread_pool.h"
#include "worker_service/model/device_context.h"
#include "worker_service/worker_server.h"

namespace llm {
namespace {

int g_signal_pipe = -1;

void OnStopSignal(int sig) {
  const unsigned char byte = static_cast<unsigned char>(sig);
  (void)!write(g_signal_pipe, &byte, 1);
}

[[noreturn]] void Fail(int code, const std::string& msg) {
  std::fprintf(stderr, "llm-worker: %s\n", msg.c_str());
  std::exit(code);
}

int Run(int argc, char** argv) {
  WorkerServerOptions options;
  options.port = 50061;
  std::string port_file;
  int threads = 0;
  FlagParser flags("usage: llm-worker [--flag=value ...]: one rank of the model over gRPC");
  flags.Add("host", &options.host, "gRPC listen address (0.0.0.0)");
  flags.Add("port", &options.port, "gRPC port; 0: any free port (50061)");
  flags.Add("port-file", &port_file, "write the bound port here once serving (none)");
  flags.Add("peer-host", &options.peer_host,
            "the address other ranks reach this rank at for Gloo collectives (127.0.0.1)");
  flags.Add("device", &options.device,
            "cpu, or cuda / cuda:N where the build has the CUDA backend (cpu)");
  flags.Add("shm-collectives", &options.shm_collectives,
            "ranks that can share a segment in --shm-dir (one host) run collectives through it; "
            "false: always Gloo over TCP (true)");
  flags.Add("shm-dir", &options.shm_directory,
            "the tmpfs for the shared-memory segment of the collectives (/dev/shm)");
  flags.Add("threads", &threads,
            "threads of the CPU backend's one pool (OpenMP: oneDNN's GEMMs and the attention); "
            "0: the CPUs of this process's cpuset (0)");
  bool pin_threads = false;
  flags.Add("pin-threads", &pin_threads,
            "pin the pool's threads one per CPU when --threads fills the cpuset (for dedicated "
            "cores); false: leave them to the OS scheduler (false)");
  bool coded_weights = true;
  flags.Add("coded-weights", &coded_weights,
            "cpu, bf16: decode steps of 1 to 4 rows read the GEMM weights from a lossless 12-bit "
            "copy (about 1.4x faster at batch 1; the copy costs 3/4 of the bf16 weights' "
            "memory); false: oneDNN on the bf16 weights only (true)");
  flags.Add("quantized-weights", &options.quantized_weights,
            "cpu, GGUF files: linear weights stored as Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K or Q6_K "
            "blocks (and the embedding table) stay the file's blocks and run on the quantized "
            "kernels (memory near the file's size); false: dequantized at load to --dtype (true)");
  std::string cluster_secret_file;
  flags.Add("cluster-secret-file", &cluster_secret_file,
            "file holding the cluster secret every WorkerService call must present (e.g. a "
            "Kubernetes Secret mounted as a file); default: $LLM_CLUSTER_SECRET; neither: "
            "anyone may call (none)");
  flags.Parse(argc, argv);
  absl::StatusOr<std::string> secret = LoadClusterSecret(cluster_secret_file);
  if (!secret.ok()) Fail(2, std::string(secret.status().message()));
  options.cluster_secret = *secret;
  if (options.port < 0 || options.port > 65535) Fail(2, "--port must be in [0, 65535]");
  if (threads < 0) Fail(2, "--threads must be >= 0");
  absl::StatusOr<TensorDevice> device = ParseWorkerDevice(options.device);
  if (!device.ok()) Fail(2, "--device: " + std::string(device.status().message()));
  if (device->is_cuda()) {
    // Every kernel module loaded when the context is made (CUDA 12+ loads them lazily, at a
    // kernel's first launch, by default): the memory profile then sees them all, and a first
    // decode step or graph capture loads nothing. A value the user set is kept.
    setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
    // Fail at start, as vLLM does, rather than at the scheduler's first Init.
    absl::StatusOr<std::unique_ptr<DeviceContext>> context = DeviceContext::Create(*device);
    if (!context.ok())
      Fail(1, "--device=" + options.device + ": " + std::string(context.status().message()));
  }
  llm::cpu::SetThreadPoolSize(threads);  // 0: the cpuset's CPUs
  llm::cpu::SetThreadPoolPinning(pin_threads);
  llm::cpu::SetCodedWeights(coded_weights);

  // SIGTERM and SIGINT: the handler writes to a pipe that a thread of ours reads (a handler
  // may run on any thread, OpenBLAS's included, and may do little more than write()).
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) Fail(1, "cannot create the signal pipe");
  g_signal_pipe = pipe_fds[1];
  struct sigaction action = {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);

  WorkerServer server(options);
  if (absl::Status s = server.Start(); !s.ok()) Fail(1, s.ToString());
  std::fprintf(stderr, "llm-worker: listening on %s:%d\n", options.host.c_str(), server.port());
  if (!port_file.empty()) {
    if (absl::Status s = WritePortFile(port_file, server.port()); !s.ok()) {
      server.Stop();
      Fail(1, "--port-file: " + std::string(s.message()));
    }
  }
  // Joined before `server` goes: once the server has stopped (the Shutdown rpc), a 0 byte wakes
  // it, so that a signal arriving late never reaches a destroyed server.
  std::thread signal_thread([&server, fd = pipe_fds[0]] {
    unsigned char sig = 0;
    while (read(fd, &sig, 1) < 0 && errno == EINTR) {
    }
    if (sig == 0) return;
    std::fprintf(stderr, "llm-worker: signal %d, stopping\n", sig);
    server.Stop();
  });
  server.Wait();
  const unsigned char wake = 0;
  (void)!write(pipe_fds[1], &wake, 1);
  signal_thread.join();
  std::fprintf(stderr, "llm-worker: stopped\n");
  return 0;
}

}  // namespace
}  // namespace llm

int main(int argc, char** argv) {
  llm::cpu::ReexecWithOpenMpSettings(argv);
  llm::cpu::ReexecWithMatchingBlasKernels(argv);
  return llm::Run(argc, argv);
}
