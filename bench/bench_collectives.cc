// bench_collectives: one tensor-parallel collective between 2 ranks on this host, over one
// shared-memory segment (ShmCommunicator) and over Gloo's loopback TCP (GlooCommunicator, the
// baseline), run in this process.
//
//   BM_AllReduce<impl>/N   an all-reduce of N floats: 512 (a decode's hidden state of the
//                          demo model), 8,192 and 262,144 (1 MiB, a long prefill chunk)
//   BM_AllGather<impl>/N   an all-gather of N floats per rank (the logits of a sharded vocab)
//
// The second rank is a thread of this process doing the same number of collectives (the
// iteration counts are fixed). Wall time: waiting for the peer is what is measured. The
// summary prints both figures and the ratio Gloo / shm.
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/summary_reporter.h"
#include "benchmark/benchmark.h"
#include "gloo/rendezvous/hash_store.h"
#include "worker_service/parallel/gloo_communicator.h"
#include "worker_service/parallel/shm_communicator.h"

namespace llm {
namespace {

constexpr int kWarmup = 20;

// Both ranks' communicators, made concurrently (the rendezvous needs both).
std::vector<std::unique_ptr<Communicator>> MakeGroup(bool shm) {
  gloo::rendezvous::HashStore store;
  std::vector<std::unique_ptr<Communicator>> comms(2);
  auto make = [&](int rank) {
    absl::StatusOr<std::unique_ptr<Communicator>> c;
    if (shm) {
      c = ShmCommunicator::Create(store, rank, 2);
    } else {
      c = GlooCommunicator::Create(store, rank, 2);
    }
    if (!c.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, c.status().ToString().c_str());
      std::abort();
    }
    comms[rank] = std::move(*c);
  };
  std::thread peer(make, 1);
  make(0);
  peer.join();
  return comms;
}

// op(comm, in, out) runs one collective; rank 0 is timed, rank 1 keeps pace on a thread.
template <typename Op>
void Run(benchmark::State& state, bool shm, size_t out_floats, Op op) {
  const size_t count = static_cast<size_t>(state.range(0));
  std::vector<std::unique_ptr<Communicator>> comms = MakeGroup(shm);
  const int64_t n = state.max_iterations + kWarmup;
  std::thread peer([&] {
    std::vector<float> in(count, 0.0f), out(out_floats, 0.0f);
    for (int64_t i = 0; i < n; ++i) op(*comms[1], in.data(), out.data(), count);
  });
  std::vector<float> in(count, 0.0f), out(out_floats, 0.0f);
  for (int i = 0; i < kWarmup; ++i) op(*comms[0], in.data(), out.data(), count);
  for (auto _ : state) op(*comms[0], in.data(), out.data(), count);
  peer.join();
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(count * sizeof(float)));
}

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    std::abort();
  }
}

template <bool kShm>
void BM_AllReduce(benchmark::State& state) {
  Run(state, kShm, 0,
      [](Communicator& c, float* in, float*, size_t count) { Check(c.AllReduceSum(in, count)); });
}

template <bool kShm>
void BM_AllGather(benchmark::State& state) {
  Run(state, kShm, 2 * static_cast<size_t>(state.range(0)),
      [](Communicator& c, float* in, float* out, size_t count) {
        Check(c.AllGather(in, count, out));
      });
}

int64_t Iterations(bool shm, int64_t count) {
  if (count > 8192) return shm ? 2000 : 200;
  return shm ? 20000 : 1000;
}

#define LLM_COLLECTIVE_BENCH(fn, shm)                                                       \
  BENCHMARK_TEMPLATE(fn, shm)->Arg(512)->Iterations(Iterations(shm, 512))->UseRealTime();   \
  BENCHMARK_TEMPLATE(fn, shm)->Arg(8192)->Iterations(Iterations(shm, 8192))->UseRealTime(); \
  BENCHMARK_TEMPLATE(fn, shm)->Arg(262144)->Iterations(Iterations(shm, 262144))->UseRealTime()

LLM_COLLECTIVE_BENCH(BM_AllReduce, true);
LLM_COLLECTIVE_BENCH(BM_AllReduce, false);
LLM_COLLECTIVE_BENCH(BM_AllGather, true);
LLM_COLLECTIVE_BENCH(BM_AllGather, false);

void PrintSummary(const SummaryReporter& r) {
  std::printf(
      "\nSummary: one collective between 2 ranks of this host, wall time, best of the "
      "repetitions (ratio = Gloo / shm)\n");
  std::printf("%-28s %12s %12s %9s\n", "collective", "shm", "gloo (TCP)", "ratio");
  for (const char* op : {"AllReduce", "AllGather"}) {
    for (int n : {512, 8192, 262144}) {
      const std::string shm = std::string("BM_") + op + "<true>/" + std::to_string(n);
      const std::string gloo = std::string("BM_") + op + "<false>/" + std::to_string(n);
      const double s = r.ns(shm), g = r.ns(gloo);
      std::printf("%-28s %9.1f us %9.1f us %8.1fx\n",
                  (std::string(op) + ", " + std::to_string(n) + " floats").c_str(), s / 1e3,
                  g / 1e3, s > 0 ? g / s : 0.0);
    }
  }
}

}  // namespace
}  // namespace llm

int main(int argc, char** argv) {
  llm::SummaryReporter reporter(llm::SummaryReporter::Clock::kReal);
  return llm::RunBenchmarksWithSummary(argc, argv, reporter, llm::PrintSummary);
}
