// llm-worker: one tensor-parallel rank of the model, served over gRPC (llm.v1.WorkerService,
// grpc.health.v1, reflection). It starts empty; the scheduler sends Init (model, rank, group),
// ProfileMemory, InitCache, then one Step stream (worker_server.h has the lifecycle).
//
//   llm-worker [--host=0.0.0.0] [--port=50061] [--port-file=PATH] [--peer-host=127.0.0.1]
//              [--device=cpu|cuda|cuda:N] [--threads=0]        (--help lists them)
//
// llm-worker-emu is the same program built against the CUDA emulation (kernels/cuda/emu):
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

#include "cblas.h"
#include "common/flag_parser.h"
#include "common/port_file.h"
#include "kernels/cpu/blas_setup.h"
#include "kernels/cpu/cpu_ops.h"
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
  flags.Add("threads", &threads, "OpenBLAS threads; 0: leave the default (0)");
  flags.Parse(argc, argv);
  if (options.port < 0 || options.port > 65535) Fail(2, "--port must be in [0, 65535]");
  if (threads < 0) Fail(2, "--threads must be >= 0");
  absl::StatusOr<TensorDevice> device = ParseWorkerDevice(options.device);
  if (!device.ok()) Fail(2, "--device: " + std::string(device.status().message()));
  if (device->is_cuda()) {
    // Fail at start, as vLLM does, rather than at the scheduler's first Init.
    absl::StatusOr<std::unique_ptr<DeviceContext>> context = DeviceContext::Create(*device);
    if (!context.ok())
      Fail(1, "--device=" + options.device + ": " + std::string(context.status().message()));
  }
  if (threads > 0) openblas_set_num_threads(threads);
  // CPU paged attention runs on the OpenMP pool. Until the GEMMs run on that pool too (issue
  // 18), OpenBLAS's own threads and an OpenMP team spin against each other (measured: TPOT
  // 61 ms with one OpenMP thread, 76 ms with two, TTFT 1.8 s against 3.4 s), so attention
  // runs on the step's thread unless OMP_NUM_THREADS says otherwise.
  if (std::getenv("OMP_NUM_THREADS") == nullptr) ops::cpu::SetPagedAttentionThreads(1);

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
  llm::cpu::ReexecWithMatchingBlasKernels(argv);
  return llm::Run(argc, argv);
}
