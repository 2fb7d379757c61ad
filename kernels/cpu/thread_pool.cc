#include "kernels/cpu/thread_pool.h"

#include <cblas.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "common/reexec.h"

namespace llm::cpu {
namespace {

std::atomic<int> g_pool_size{0};  // 0 = the cpuset's size
std::atomic<bool> g_pin{false};
std::atomic<int> g_generation{1};  // bumped by every setting: threads apply it again

// ReexecWithOpenMpSettings: spins before a waiting thread sleeps (libgomp counts about 100,000
// per millisecond).
constexpr char kSpinCount[] = "20000";

thread_local int t_entered_generation = 0;
thread_local bool t_pinned = false;

std::vector<int> ReadAffinity() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

// Read when the library loads, before any thread is pinned (a pinned thread's mask is one CPU).
const std::vector<int> g_process_cpus = ReadAffinity();

}  // namespace

std::vector<int> AffinityCpus() { return g_process_cpus; }

void SetThreadPoolSize(int n) {
  g_pool_size.store(n > 0 ? n : 0);
  g_generation.fetch_add(1);
}

void SetThreadPoolPinning(bool pin) {
  g_pin.store(pin);
  g_generation.fetch_add(1);
}

int ThreadPoolSize() {
  const int n = g_pool_size.load();
  if (n > 0) return n;
#if defined(__SANITIZE_THREAD__)
  // ThreadSanitizer cannot see libgomp's barriers (Debian's libgomp is not built with it), so
  // every hand-off between a parallel region's threads would be reported: the TSan build (make
  // test-tsan) runs the pool with one thread unless a size is set.
  return 1;
#endif
  return static_cast<int>(g_process_cpus.size());
}

void EnterThreadPool() {
  const int generation = g_generation.load();
  if (t_entered_generation == generation) return;
  t_entered_generation = generation;
  const int n = ThreadPoolSize();
  omp_set_dynamic(0);
  omp_set_num_threads(n);
  openblas_set_num_threads(1);
  const std::vector<int>& cpus = g_process_cpus;
  const bool pin = g_pin.load() && n == static_cast<int>(cpus.size()) && n > 1;
  if (!pin && !t_pinned) return;
    // Pin thread i to the i-th CPU, or (unpinning) give every thread the whole cpuset back.
#pragma omp parallel num_threads(n)
  {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    if (pin) {
      CPU_SET(cpus[omp_get_thread_num() % cpus.size()], &mask);
    } else {
      for (int c : cpus) CPU_SET(c, &mask);
    }
    sched_setaffinity(0, sizeof(mask), &mask);
  }
  t_pinned = pin;
}

bool ThreadPoolPinned() { return t_pinned; }

void ReexecWithOpenMpSettings(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) {
    return;
  }
  setenv("GOMP_SPINCOUNT", kSpinCount, /*overwrite=*/1);
  ReexecSelf(argv);
  // Still here: exec failed; run on with the runtime's default waits.
  std::fprintf(stderr, "note: restarting with GOMP_SPINCOUNT=%s failed\n", kSpinCount);
}

ComputeThread::ComputeThread() : thread_([this] { Loop(); }) {}

ComputeThread::~ComputeThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ComputeThread::Run(const std::function<void()>& fn) {
  if (std::this_thread::get_id() == thread_.get_id()) {
    fn();
    return;
  }
  std::lock_guard<std::mutex> turn(turn_);  // one caller at a time
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &fn;
  done_ = false;
  cv_.notify_all();
  cv_.wait(lock, [this] { return done_; });
}

void ComputeThread::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return job_ != nullptr || stop_; });
    if (job_ == nullptr) return;  // stopping, nothing pending
    const std::function<void()>* job = job_;
    lock.unlock();
    (*job)();
    lock.lock();
    job_ = nullptr;
    done_ = true;
    cv_.notify_all();
  }
}

}  // namespace llm::cpu
