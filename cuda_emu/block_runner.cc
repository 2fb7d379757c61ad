// Emulated CUDA: the fibers of a thread block (Boost.Context fcontext), its barriers and warp
// collectives, and the OS threads that run a grid's blocks.
#include "cuda_emu/block_runner.h"

#include <link.h>
#include <sys/mman.h>

#include <algorithm>
#include <boost/context/detail/fcontext.hpp>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

// The bounds of the kernels' __shared__ section (shared.ld), and its anchor: initialized TLS,
// so that the section is a TLS one even in an executable without kernels.
extern "C" char __llm_cuda_shared_begin[] __attribute__((weak));
extern "C" char __llm_cuda_shared_end[] __attribute__((weak));
__attribute__((section("llm_cuda_shared_anchor"), used)) static thread_local char g_shared_anchor =
    1;

namespace llm::cuda_emu {
namespace {

namespace bctx = boost::context::detail;

constexpr size_t kStackBytes = 256 * 1024;  // per fiber; mapped lazily
constexpr size_t kGuardBytes = 4096;

enum class FiberState { kRunnable, kBarrier, kWarp, kExited, kFaulted };

// A cp.async issued and not yet performed: the source bytes as read at the issue (zero-filled
// past src_bytes), written to dst by a wait.
struct PendingCopy {
  void* dst;
  int bytes;
  unsigned char data[16];
};

struct Fiber {
  bctx::fcontext_t ctx = nullptr;
  FiberState state = FiberState::kRunnable;
  ThreadState thread{};
  int warp = 0;
  int lane = 0;
  uint64_t result = 0;
  std::vector<PendingCopy> copies;  // in issue order
  std::vector<size_t> group_ends;   // committed groups, oldest first: ends in `copies`
};

// A warp collective some lanes of `mask` have reached.
struct PendingCollective {
  WarpOp op;
  unsigned mask;
  unsigned arrived = 0;
  int width = 32;
  std::source_location where;
  uint64_t value[32];
  int arg[32];
};

struct Block {
  const GridLaunch* launch = nullptr;
  std::vector<Fiber>* fibers = nullptr;
  int num_threads = 0;
  std::vector<std::vector<PendingCollective>> pending;  // per warp
  std::vector<unsigned> exited_lanes;                   // per warp
  std::vector<unsigned> valid_lanes;                    // per warp
  int exited = 0;
  int at_barrier = 0;
  std::source_location barrier_where;
  std::string error;
  bctx::fcontext_t scheduler = nullptr;
};

thread_local Block* t_run = nullptr;
thread_local Fiber* t_fiber = nullptr;

// Fiber stacks of this OS thread, reused by every block it runs.
class StackPool {
 public:
  ~StackPool() {
    for (char* s : stacks_) munmap(s, kStackBytes + kGuardBytes);
  }
  // The top (highest address) of stack i.
  char* Top(size_t i) {
    while (stacks_.size() <= i) {
      void* p = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) {
        std::fprintf(stderr, "emulated CUDA: cannot map a fiber stack\n");
        std::abort();
      }
      mprotect(p, kGuardBytes, PROT_NONE);  // overflow faults instead of corrupting
      stacks_.push_back(static_cast<char*>(p));
    }
    return stacks_[i] + kGuardBytes + kStackBytes;
  }

 private:
  std::vector<char*> stacks_;
};
thread_local StackPool t_stacks;

std::string Site(const std::source_location& where) {
  const char* file = where.file_name();
  const char* slash = std::strrchr(file, '/');
  std::string s = slash != nullptr ? slash + 1 : file;
  return s + ":" + std::to_string(where.line());
}

bool SameSite(const std::source_location& a, const std::source_location& b) {
  return a.line() == b.line() &&
         (a.file_name() == b.file_name() || std::strcmp(a.file_name(), b.file_name()) == 0);
}

const char* OpName(WarpOp op) {
  switch (op) {
    case WarpOp::kSync:
      return "__syncwarp";
    case WarpOp::kShfl:
      return "__shfl_sync";
    case WarpOp::kShflUp:
      return "__shfl_up_sync";
    case WarpOp::kShflDown:
      return "__shfl_down_sync";
    case WarpOp::kShflXor:
      return "__shfl_xor_sync";
    case WarpOp::kBallot:
      return "__ballot_sync";
  }
  return "?";
}

std::string Hex(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

std::string ThreadName(const Fiber& f) {
  const uint3& t = f.thread.thread_idx;
  const uint3& b = t_block.block_idx;
  return "thread (" + std::to_string(t.x) + "," + std::to_string(t.y) + "," + std::to_string(t.z) +
         ") of block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," +
         std::to_string(b.z) + ")";
}

void Yield() {
  bctx::transfer_t t = bctx::jump_fcontext(t_run->scheduler, nullptr);
  t_run->scheduler = t.fctx;
}

// Records the fault and leaves the fiber for good (the scheduler never resumes it).
[[noreturn]] void Fault(const std::string& what) {
  Block* b = t_run;
  if (b->error.empty()) b->error = b->launch->kernel + ": " + ThreadName(*t_fiber) + ": " + what;
  t_fiber->state = FiberState::kFaulted;
  Yield();
  std::abort();  // unreachable: a faulted fiber is never resumed
}

Block* CurrentBlock(const char* what) {
  if (t_run == nullptr || t_fiber == nullptr) {
    std::fprintf(stderr, "emulated CUDA: %s called outside a kernel\n", what);
    std::abort();
  }
  return t_run;
}

void FiberMain(bctx::transfer_t t) {
  t_run->scheduler = t.fctx;
  t_run->launch->body();
  Block* b = t_run;
  Fiber* f = t_fiber;
  f->state = FiberState::kExited;
  ++b->exited;
  b->exited_lanes[f->warp] |= 1u << f->lane;
  for (const PendingCollective& p : b->pending[f->warp]) {
    if (p.mask & (1u << f->lane)) {
      Fault("exited while " + std::string(OpName(p.op)) + " at " + Site(p.where) +
            " waits for it (mask " + Hex(p.mask) + ")");
    }
  }
  Yield();
  std::abort();  // unreachable: an exited fiber is never resumed
}

// The lane each lane of `p` reads, or -1 when it reads its own value.
int SourceLane(const PendingCollective& p, int lane) {
  const int width = p.width, base = lane & ~(width - 1), arg = p.arg[lane];
  int src = lane;
  switch (p.op) {
    case WarpOp::kShfl:
      src = base + ((arg % width) + width) % width;
      break;
    case WarpOp::kShflUp:
      src = lane - arg;
      if (src < base) src = lane;
      break;
    case WarpOp::kShflDown:
      src = lane + arg;
      if (src >= base + width) src = lane;
      break;
    case WarpOp::kShflXor:
      src = lane ^ arg;
      if (src >= base + width || src < 0) src = lane;
      break;
    default:
      break;
  }
  return src;
}

// Every lane of `p` has arrived: hands each its result and makes it runnable.
void Complete(Block* b, int warp, const PendingCollective& p) {
  std::vector<Fiber>& fibers = *b->fibers;
  unsigned ballot = 0;
  if (p.op == WarpOp::kBallot) {
    for (int l = 0; l < 32; ++l) {
      if ((p.mask >> l & 1u) && p.value[l] != 0) ballot |= 1u << l;
    }
  }
  for (int l = 0; l < 32; ++l) {
    if (!(p.mask >> l & 1u)) continue;
    Fiber& f = fibers[warp * 32 + l];
    if (p.op == WarpOp::kBallot) {
      f.result = ballot;
    } else if (p.op == WarpOp::kSync) {
      f.result = 0;
    } else {
      const int src = SourceLane(p, l);
      if (!(p.mask >> src & 1u)) {
        t_fiber = &f;  // name the reading lane
        Fault(std::string(OpName(p.op)) + " at " + Site(p.where) + ": lane " + std::to_string(l) +
              " reads lane " + std::to_string(src) + ", which is not in the mask " + Hex(p.mask));
      }
      f.result = p.value[src];
    }
    f.state = FiberState::kRunnable;
  }
}

std::string DescribeStuck(const Block& b) {
  const int waiting_warp = b.num_threads - b.exited - b.at_barrier;
  std::string s = b.launch->kernel + ": block (" + std::to_string(t_block.block_idx.x) + "," +
                  std::to_string(t_block.block_idx.y) + "," + std::to_string(t_block.block_idx.z) +
                  ") cannot go on: ";
  if (b.at_barrier > 0) {
    s += "__syncthreads at " + Site(b.barrier_where) + " reached by " +
         std::to_string(b.at_barrier) + " of " + std::to_string(b.num_threads) + " threads (" +
         std::to_string(b.exited) + " exited, " + std::to_string(waiting_warp) +
         " waiting in warp collectives)";
  } else {
    s += std::to_string(waiting_warp) + " threads wait in warp collectives whose lanes never come";
  }
  for (size_t w = 0; w < b.pending.size(); ++w) {
    for (const PendingCollective& p : b.pending[w]) {
      s += "; warp " + std::to_string(w) + ": " + OpName(p.op) + " at " + Site(p.where) + " mask " +
           Hex(p.mask) + " arrived " + Hex(p.arrived);
      return s;  // the first is enough
    }
  }
  return s;
}

uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The kernels' __shared__ variables: the TLS section llm_cuda_shared (shared.ld), this OS
// thread's copy of it, found through the PT_TLS segment that holds the section's link-time
// addresses. Empty when the executable links no kernel library.
struct SharedRegion {
  char* data = nullptr;
  size_t size = 0;
};

SharedRegion FindSharedRegion() {
  SharedRegion r;
  if (__llm_cuda_shared_begin == nullptr || __llm_cuda_shared_end <= __llm_cuda_shared_begin) {
    return r;
  }
  r.size = static_cast<size_t>(__llm_cuda_shared_end - __llm_cuda_shared_begin);
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* region = static_cast<SharedRegion*>(data);
        const auto begin = reinterpret_cast<uintptr_t>(__llm_cuda_shared_begin);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_TLS) continue;
          const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          if (begin < lo || begin + region->size > lo + ph.p_memsz) continue;
          if (info->dlpi_tls_data == nullptr) return 0;
          region->data = static_cast<char*>(info->dlpi_tls_data) + (begin - lo);
          return 1;
        }
        return 0;
      },
      &r);
  if (r.data == nullptr) {
    std::fprintf(stderr, "emulated CUDA: the __shared__ section is not in a TLS segment\n");
    std::abort();
  }
  return r;
}

// Fills this OS thread's __shared__ variables with 0x7f bytes, so that a read before any
// thread of the block wrote is visible: as float 3.39e38 (finite, so fmaxf takes it; a sum or
// a softmax with it goes to inf, 0 or NaN), as half NaN, as int 2139062143.
void PoisonShared() {
  thread_local const SharedRegion region = FindSharedRegion();
  if (region.size != 0) std::memset(region.data, 0x7f, region.size);
}

// This OS thread's dynamic shared memory: the block's shared_bytes (rounded up to 16) end at a
// PROT_NONE page, so that an access past them faults (SegvHandler in runtime.cc names it)
// instead of reading another buffer.
thread_local char* t_dynamic_guard = nullptr;

class DynamicSharedBuffer {
 public:
  ~DynamicSharedBuffer() {
    if (mapping_ != nullptr) munmap(mapping_, kMapBytes + kGuardBytes);
  }
  // The buffer for a block of `bytes`, filled with 0x7f bytes as the static __shared__ section.
  unsigned char* Poisoned(size_t bytes) {
    if (mapping_ == nullptr) Map();
    const size_t rounded = (bytes + 15) / 16 * 16;
    char* begin = t_dynamic_guard - rounded;
    std::memset(begin, 0x7f, rounded);
    return reinterpret_cast<unsigned char*>(begin);
  }

 private:
  static constexpr size_t kMapBytes = (kMaxDynamicSharedBytes + 4095) / 4096 * 4096;

  void Map() {
    void* p = mmap(nullptr, kMapBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "emulated CUDA: cannot map dynamic shared memory\n");
      std::abort();
    }
    mapping_ = static_cast<char*>(p);
    t_dynamic_guard = mapping_ + kMapBytes;
    mprotect(t_dynamic_guard, kGuardBytes, PROT_NONE);
  }

  char* mapping_ = nullptr;
};
thread_local DynamicSharedBuffer t_dynamic_shared;

// Runs block `index` (x fastest) of the launch on this OS thread: "" or the fault.
std::string RunBlock(const GridLaunch& launch, uint64_t index) {
  thread_local std::vector<Fiber> fibers;
  thread_local std::vector<int> order;
  const dim3 g = launch.grid, bd = launch.block;
  t_block.block_idx = {static_cast<unsigned>(index % g.x), static_cast<unsigned>(index / g.x % g.y),
                       static_cast<unsigned>(index / (static_cast<uint64_t>(g.x) * g.y))};
  t_block.block_dim = bd;
  t_block.grid_dim = g;
  PoisonShared();
  t_block.dynamic_shared = t_dynamic_shared.Poisoned(launch.shared_bytes);
  const int n = static_cast<int>(bd.x * bd.y * bd.z);
  const int num_warps = (n + 31) / 32;
  Block b;
  b.launch = &launch;
  b.fibers = &fibers;
  b.num_threads = n;
  b.pending.resize(num_warps);
  b.exited_lanes.assign(num_warps, 0);
  b.valid_lanes.assign(num_warps, 0xffffffffu);
  if (n % 32 != 0) b.valid_lanes.back() = (1u << (n % 32)) - 1;
  fibers.resize(n);
  order.resize(n);
  for (int i = 0; i < n; ++i) {
    Fiber& f = fibers[i];
    f.state = FiberState::kRunnable;
    f.thread.thread_idx = {static_cast<unsigned>(i % bd.x), static_cast<unsigned>(i / bd.x % bd.y),
                           static_cast<unsigned>(i / (bd.x * bd.y))};
    f.warp = i / 32;
    f.lane = i % 32;
    f.result = 0;
    f.copies.clear();  // an earlier block's copies never waited for are dropped
    f.group_ends.clear();
    f.ctx = bctx::make_fcontext(t_stacks.Top(i), kStackBytes, FiberMain);
    order[i] = i;
  }
  const uint64_t seed = ScheduleSeed();
  std::mt19937_64 rng(Mix(seed ^ Mix(launch.launch_id ^ Mix(index))));
  t_run = &b;
  std::string error;
  while (true) {
    if (seed != 0) std::shuffle(order.begin(), order.end(), rng);
    bool ran = false;
    for (const int i : order) {
      Fiber& f = fibers[i];
      if (f.state != FiberState::kRunnable) continue;
      ran = true;
      t_fiber = &f;
      t_thread = &f.thread;
      bctx::transfer_t t = bctx::jump_fcontext(f.ctx, nullptr);
      f.ctx = t.fctx;
      if (!b.error.empty()) break;
    }
    if (!b.error.empty()) {
      error = b.error;
      break;
    }
    if (ran) continue;
    if (b.exited == n) break;
    if (b.exited == 0 && b.at_barrier == n) {  // everyone at one barrier: release it
      for (Fiber& f : fibers) f.state = FiberState::kRunnable;
      b.at_barrier = 0;
      continue;
    }
    error = DescribeStuck(b);
    break;
  }
  t_run = nullptr;
  t_fiber = nullptr;
  t_thread = nullptr;
  return error;
}

// OS threads that run a grid's blocks beside the launching thread.
class Pool {
 public:
  static Pool& Get() {
    static Pool* pool = new Pool();  // never destroyed: its threads outlive static destructors
    return *pool;
  }

  std::string Run(const GridLaunch& launch) {
    const uint64_t total = static_cast<uint64_t>(launch.grid.x) * launch.grid.y * launch.grid.z;
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &launch;
      total_ = total;
      next_ = 0;
      failed_ = false;
      error_.clear();
      ++generation_;
    }
    if (total > 1) cv_.notify_all();
    Work(launch);
    std::unique_lock<std::mutex> lock(mu_);
    job_ = nullptr;  // no worker joins late
    done_cv_.wait(lock, [&] { return running_ == 0; });
    return error_;
  }

 private:
  Pool() {
    int n = static_cast<int>(std::thread::hardware_concurrency());
    if (const char* env = std::getenv("LLM_CUDA_EMU_THREADS")) n = std::atoi(env);
    n = std::clamp(n, 1, 4);
    for (int i = 0; i + 1 < n; ++i) std::thread([this] { Loop(); }).detach();
  }

  void Loop() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return job_ != nullptr && generation_ != seen; });
      seen = generation_;
      const GridLaunch* job = job_;
      ++running_;
      lock.unlock();
      Work(*job);
      lock.lock();
      if (--running_ == 0) done_cv_.notify_all();
    }
  }

  void Work(const GridLaunch& launch) {
    while (!failed_.load()) {
      const uint64_t i = next_.fetch_add(1);
      if (i >= total_) break;
      std::string err = RunBlock(launch, i);
      if (!err.empty()) {
        std::lock_guard<std::mutex> lock(mu_);
        if (error_.empty()) error_ = std::move(err);
        failed_ = true;
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const GridLaunch* job_ = nullptr;
  uint64_t generation_ = 0;
  uint64_t total_ = 0;
  std::atomic<uint64_t> next_{0};
  std::atomic<bool> failed_{false};
  int running_ = 0;
  std::string error_;
};

}  // namespace

uint64_t ScheduleSeed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("LLM_CUDA_EMU_SEED");
    return env != nullptr ? std::strtoull(env, nullptr, 0) : 1ull;
  }();
  return seed;
}

void SyncThreads(const std::source_location& where) {
  Block* b = CurrentBlock("__syncthreads");
  if (b->at_barrier > 0 && !SameSite(b->barrier_where, where)) {
    Fault("__syncthreads at " + Site(where) + " while other threads wait at the one at " +
          Site(b->barrier_where));
  }
  if (b->at_barrier == 0) b->barrier_where = where;
  ++b->at_barrier;
  t_fiber->state = FiberState::kBarrier;
  Yield();
}

uint64_t WarpCollective(WarpOp op, unsigned mask, uint64_t value, int arg, int width,
                        const std::source_location& where) {
  Block* b = CurrentBlock(OpName(op));
  Fiber* f = t_fiber;
  // The message is built only on a fault: this is the hot path of every shuffle.
  auto what = [&] {
    return std::string(OpName(op)) + " at " + Site(where) + " (mask " + Hex(mask) + ", lane " +
           std::to_string(f->lane) + ")";
  };
  if (!(mask >> f->lane & 1u)) Fault(what() + ": the mask does not name the calling lane");
  if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
    Fault(what() + ": width " + std::to_string(width) + " is not a power of 2 in [1, 32]");
  }
  if (mask & ~b->valid_lanes[f->warp]) Fault(what() + ": the mask names lanes the block lacks");
  if (mask & b->exited_lanes[f->warp]) {
    Fault(what() + ": the mask names exited lanes " + Hex(mask & b->exited_lanes[f->warp]));
  }
  std::vector<PendingCollective>& pending = b->pending[f->warp];
  PendingCollective* p = nullptr;
  for (PendingCollective& q : pending) {
    if (q.mask == mask) {
      p = &q;
    } else if (q.mask & mask) {
      Fault(what() + ": overlaps " + OpName(q.op) + " at " + Site(q.where) + " with mask " +
            Hex(q.mask));
    }
  }
  if (p == nullptr) {
    pending.push_back(PendingCollective{op, mask, 0, width, where, {}, {}});
    p = &pending.back();
  } else if (p->op != op) {
    Fault(what() + ": other lanes of the mask wait in " + OpName(p->op) + " at " + Site(p->where));
  }
  p->value[f->lane] = value;
  p->arg[f->lane] = arg;
  p->arrived |= 1u << f->lane;
  if (p->arrived == p->mask) {
    const PendingCollective done = *p;
    pending.erase(pending.begin() + (p - pending.data()));
    Complete(b, f->warp, done);
  } else {
    f->state = FiberState::kWarp;
  }
  Yield();  // also after completing: the other runnable fibers may go first
  return f->result;
}

void AsyncCopy(void* dst, const void* src, int bytes, int src_bytes,
               const std::source_location& where) {
  CurrentBlock("cp.async");
  Fiber* f = t_fiber;
  auto what = [&] { return "cp.async of " + std::to_string(bytes) + " bytes at " + Site(where); };
  if (bytes != 4 && bytes != 8 && bytes != 16) Fault(what() + ": the size is not 4, 8 or 16");
  if (src_bytes < 0 || src_bytes > bytes) {
    Fault(what() + ": src-size " + std::to_string(src_bytes) + " is outside [0, cp-size]");
  }
  if (reinterpret_cast<uintptr_t>(dst) % bytes != 0 ||
      reinterpret_cast<uintptr_t>(src) % bytes != 0) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), ": misaligned (shared %p, global %p)", dst, src);
    Fault(what() + buf);
  }
  PendingCopy copy{dst, bytes, {}};
  std::memcpy(copy.data, src, static_cast<size_t>(src_bytes));
  f->copies.push_back(copy);
}

void AsyncCommitGroup() {
  CurrentBlock("cp.async.commit_group");
  t_fiber->group_ends.push_back(t_fiber->copies.size());
}

void AsyncWaitGroup(int n) {
  CurrentBlock("cp.async.wait_group");
  Fiber* f = t_fiber;
  if (n < 0) {  // wait_all: every copy, committed or not
    f->group_ends.assign(1, f->copies.size());
    n = 0;
  }
  const size_t groups = f->group_ends.size();
  if (groups <= static_cast<size_t>(n)) return;
  const size_t done_groups = groups - static_cast<size_t>(n);
  const size_t done = f->group_ends[done_groups - 1];
  for (size_t i = 0; i < done; ++i) {
    std::memcpy(f->copies[i].dst, f->copies[i].data, static_cast<size_t>(f->copies[i].bytes));
  }
  f->copies.erase(f->copies.begin(), f->copies.begin() + static_cast<std::ptrdiff_t>(done));
  f->group_ends.erase(f->group_ends.begin(),
                      f->group_ends.begin() + static_cast<std::ptrdiff_t>(done_groups));
  for (size_t& end : f->group_ends) end -= done;
}

bool IsDynamicSharedGuard(const void* addr) {
  const char* a = static_cast<const char*>(addr);
  return t_dynamic_guard != nullptr && a >= t_dynamic_guard && a < t_dynamic_guard + kGuardBytes;
}

std::string RunGrid(const GridLaunch& launch) { return Pool::Get().Run(launch); }

}  // namespace llm::cuda_emu
