#include "kernels/cpu/thread_pool.h"

#include <cblas.h>
#include <omp.h>
#include <sched.h>

#include <atomic>

namespace llm::cpu {
namespace {

std::atomic<int> g_pool_size{0};  // 0 = the cpuset's size

thread_local int t_entered_size = 0;
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

void SetThreadPoolSize(int n) { g_pool_size.store(n > 0 ? n : 0); }

int ThreadPoolSize() {
  const int n = g_pool_size.load();
  if (n > 0) return n;
  return static_cast<int>(g_process_cpus.size());
}

void EnterThreadPool() {
  const int n = ThreadPoolSize();
  if (t_entered_size == n) return;
  t_entered_size = n;
  omp_set_dynamic(0);
  omp_set_num_threads(n);
  openblas_set_num_threads(1);
  const std::vector<int>& cpus = g_process_cpus;
  t_pinned = n == static_cast<int>(cpus.size()) && n > 1;
  if (!t_pinned) return;
#pragma omp parallel num_threads(n)
  {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[omp_get_thread_num() % cpus.size()], &one);
    sched_setaffinity(0, sizeof(one), &one);
  }
}

bool ThreadPoolPinned() { return t_pinned; }

}  // namespace llm::cpu
