// The CPU backend's one thread pool: OpenMP's. Debian's oneDNN runs its matmuls on the OpenMP
// runtime (libgomp), and the CPU attention's parallel loops use the same runtime, so a worker
// has one pool of N threads that both share instead of oversubscribing the cores.
//
// N is the process's setting (SetThreadPoolSize: llm-worker --threads), by default the number
// of CPUs in the process's affinity mask (its cpuset: sched_getaffinity). OpenMP keeps a pool per
// thread that starts parallel regions, so the thread that runs a model step calls
// EnterThreadPool() first: the first call on that thread sizes its OpenMP team to N
// (omp_set_num_threads, no dynamic adjustment). With pinning on (SetThreadPoolPinning, llm-worker
// --pin-threads) and N equal to the number of CPUs in the cpuset, thread i of the team is pinned
// to the i-th CPU of the cpuset (sched_setaffinity from inside a parallel region). Pinning is off
// by default: a pinned thread cannot leave a core that another process occupies, and every
// parallel region waits for it, so on cores shared with other processes pinned steps are several
// times slower (docs/performance/results.md, "One thread pool"). Pin on dedicated cores. With fewer
// threads than CPUs the threads are never pinned (several workers sharing a cpuset would pile onto
// its first CPUs).
//
// OpenBLAS (kernels/cpu/linear.cc, the fp32 reference ops::Linear) keeps its own pthreads; the
// model's GEMMs do not call it (kernels/cpu/packed_linear.h), and EnterThreadPool sets it to
// one thread so that a call made from inside or next to an OpenMP region cannot oversubscribe.
#ifndef LLM_KERNELS_CPU_THREAD_POOL_H_
#define LLM_KERNELS_CPU_THREAD_POOL_H_

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace llm::cpu {

// The CPUs this process may run on (sched_getaffinity when the library loaded), ascending;
// never empty.
std::vector<int> AffinityCpus();

// The pool size for every thread that calls EnterThreadPool from now on; n <= 0 restores the
// default (the size of AffinityCpus()).
void SetThreadPoolSize(int n);

// The pool size EnterThreadPool applies.
int ThreadPoolSize();

// Whether EnterThreadPool pins a team that fills the cpuset (default false: the threads are left
// to the OS scheduler, better on a machine whose cores other processes also load).
void SetThreadPoolPinning(bool pin);

// Sizes (and maybe pins) the calling thread's OpenMP team, once per thread and size; cheap
// afterwards (a thread-local check).
void EnterThreadPool();

// Call first thing in main() of programs that run the model. OpenMP reads its settings when the
// runtime loads, before main(): when neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set, sets
// GOMP_SPINCOUNT=20000 (a thread waiting at a barrier or for the next parallel region spins
// about 0.2 ms, then sleeps) and re-executes the program with the same arguments, once. A step
// runs hundreds of parallel regions a few microseconds apart: sleeping at once between them
// (OMP_WAIT_POLICY=passive) pays a wake-up for each and makes a decode step much slower
// (docs/performance/results.md, "One thread pool"), and libgomp's default spin (about 3 ms)
// keeps a core busy long after a step, while the scheduler process wants it. On dedicated cores
// OMP_WAIT_POLICY=active may do better; on cores that other processes load, passive.
void ReexecWithOpenMpSettings(char** argv);

// Whether EnterThreadPool pinned the calling thread's team.
bool ThreadPoolPinned();

// A thread that runs the work handed to it, one job at a time: Run(fn) returns when fn has
// run there (from the thread itself, at once). Callers on several threads take turns. Why: libgomp
// keeps a team of threads per thread that starts parallel regions, and once a process holds
// more OpenMP threads than CPUs it stops spinning at barriers (it "throttles" to sleeping at
// once), so that each of a step's hundreds of parallel regions pays a futex wake-up: a worker
// whose model loaded on one gRPC thread and whose steps ran on another would hold two teams and
// step slower (docs/performance/results.md, "One thread pool"). llm-worker's server owns one (one
// per rank: ranks that share a process, as in tests, must not wait on each other's steps).
class ComputeThread {
 public:
  ComputeThread();
  ~ComputeThread();  // joins; no Run may be in progress
  ComputeThread(const ComputeThread&) = delete;
  ComputeThread& operator=(const ComputeThread&) = delete;

  void Run(const std::function<void()>& fn);

 private:
  void Loop();

  std::mutex turn_, mu_;
  std::condition_variable cv_;
  const std::function<void()>* job_ = nullptr;  // guarded by mu_
  bool done_ = false, stop_ = false;            // guarded by mu_
  std::thread thread_;                          // last: starts once the members above exist
};

}  // namespace llm::cpu

#endif  // LLM_KERNELS_CPU_THREAD_POOL_H_
