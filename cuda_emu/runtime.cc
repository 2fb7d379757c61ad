// Emulated CUDA runtime (runtime.h): devices with guarded arenas, lazy streams, events,
// errors with a GPU's stickiness, and kernel launches handed to block_runner.
#include "cuda_emu/runtime.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda_emu/block_runner.h"
#include "cuda_emu/device.h"

struct Stream;

// A queued piece of work and the (stream, count) pairs that must have run before it.
struct Task {
  std::function<cudaError_t()> run;
  std::vector<std::pair<CUstream_st*, uint64_t>> deps;
  std::shared_ptr<llm::cuda_emu::StreamGate> gate;  // null: runs once its deps have
};

// A captured operation: what it is, and the work it queues when the graph is launched.
struct CUgraphNode_st {
  cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
  std::function<cudaError_t()> run;
};

struct CUgraph_st {
  int device = 0;
  std::vector<std::unique_ptr<CUgraphNode_st>> nodes;  // in capture order
};

struct CUgraphExec_st {
  int device = 0;
  std::vector<CUgraphNode_st> nodes;  // a copy: the graph may be destroyed before a launch
};

struct CUstream_st {
  int device = 0;
  CUgraph_st* capture = nullptr;  // capturing into it (cudaStreamBeginCapture)
  bool capture_invalidated = false;
  bool blocking = true;  // synchronizes with the legacy default stream
  bool legacy = false;
  bool destroyed = false;
  std::deque<Task> queue;
  uint64_t enqueued = 0;  // tasks ever queued
  uint64_t done = 0;      // tasks run (or dropped after a fault)
};

struct EventRecord {
  CUstream_st* stream = nullptr;
  uint64_t seq = 0;  // complete when stream->done >= seq
  double ms = 0;     // host time when the marker ran
};

struct CUevent_st {
  unsigned flags = 0;
  std::shared_ptr<EventRecord> record;  // null: never recorded
};

namespace llm::cuda_emu {
namespace {

constexpr size_t kAlign = 256;
constexpr size_t kDefaultMemory = size_t{80} << 30;

struct Device {
  int ordinal = 0;
  char* base = nullptr;
  size_t size = 0;        // the arena: the device's whole memory
  size_t high_water = 0;  // bytes of the arena ever handed out (what mprotect covers)
  size_t used = 0;
  std::map<size_t, size_t> free_ranges;  // offset -> bytes
  std::map<uintptr_t, size_t> allocations;
  CUstream_st* legacy = nullptr;
  std::vector<CUstream_st*> streams;  // every live stream but the legacy one
  cudaError_t sticky = cudaSuccess;
  // cudaFuncAttributeMaxDynamicSharedMemorySize per kernel; kDefaultDynamicSharedBytes if unset.
  std::map<const void*, size_t> max_dynamic_shared;
};

std::recursive_mutex g_mu;  // every runtime call
std::vector<Device>* g_devices = nullptr;
std::string* g_fault = nullptr;  // the last kernel fault's message
uint64_t g_launches = 0;
std::map<uintptr_t, size_t>* g_pinned = nullptr;
thread_local int t_device = 0;
thread_local int t_lock_depth = 0;  // how many times this thread holds g_mu

// Holds g_mu and counts it, so that a wait at a closed gate can release it (Force).
class Locked {
 public:
  Locked() {
    g_mu.lock();
    ++t_lock_depth;
  }
  ~Locked() {
    --t_lock_depth;
    g_mu.unlock();
  }
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;
};
thread_local cudaError_t t_last_error = cudaSuccess;

std::mutex g_prot_mu;  // the arenas' protection
int g_prot_count = 0;

size_t EnvSize(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::strtoull(v, nullptr, 0) : fallback;
}

void SegvHandler(int sig, siginfo_t* info, void*) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  if (IsDynamicSharedGuard(info->si_addr)) {
    char msg[160];
    const int len = std::snprintf(msg, sizeof(msg),
                                  "a kernel accessed %p, past the end of its dynamic shared "
                                  "memory (emulated CUDA)\n",
                                  info->si_addr);
    (void)!write(STDERR_FILENO, msg, len);
    std::abort();
  }
  if (g_devices != nullptr) {
    for (const Device& d : *g_devices) {
      const uintptr_t base = reinterpret_cast<uintptr_t>(d.base);
      if (addr >= base && addr < base + d.size) {
        char msg[160];
        const int len = std::snprintf(msg, sizeof(msg),
                                      "host code dereferenced device pointer %p of cuda:%d "
                                      "(emulated CUDA)\n",
                                      info->si_addr, d.ordinal);
        (void)!write(STDERR_FILENO, msg, len);
        std::abort();
      }
    }
  }
  signal(sig, SIG_DFL);  // not ours: fault again, the default way
}

void InitLocked() {
  if (g_devices != nullptr) return;
  const int count = static_cast<int>(EnvSize("LLM_CUDA_EMU_DEVICES", 2));
  const size_t memory = EnvSize("LLM_CUDA_EMU_MEMORY_BYTES", kDefaultMemory) / kAlign * kAlign;
  auto* devices = new std::vector<Device>(count);
  for (int i = 0; i < count; ++i) {
    Device& d = (*devices)[i];
    d.ordinal = i;
    d.size = memory;
    void* p = mmap(nullptr, memory, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "emulated CUDA: cannot reserve %zu bytes for cuda:%d\n", memory, i);
      std::abort();
    }
    d.base = static_cast<char*>(p);
    d.free_ranges[0] = memory;
    d.legacy = new CUstream_st();
    d.legacy->device = i;
    d.legacy->legacy = true;
  }
  g_fault = new std::string();
  g_pinned = new std::map<uintptr_t, size_t>();
  struct sigaction sa {};
  sa.sa_sigaction = SegvHandler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, nullptr);
  g_devices = devices;
}

std::vector<Device>& Devices() {
  InitLocked();
  return *g_devices;
}

cudaError_t Fail(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

// A call a capture cannot record: the capture is invalidated (EndCapture then fails).
cudaError_t InvalidateCapture(CUstream_st* s) {
  s->capture_invalidated = true;
  return Fail(cudaErrorStreamCaptureUnsupported);
}

Device& Current() { return Devices()[t_device]; }

// While one of these lives, host code may touch every arena (a kernel or a copy runs).
class DeviceAccess {
 public:
  DeviceAccess() { Protect(+1); }
  ~DeviceAccess() { Protect(-1); }
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;

 private:
  static void Protect(int delta) {
    std::lock_guard<std::mutex> lock(g_prot_mu);
    const bool was_open = g_prot_count > 0;
    g_prot_count += delta;
    if (was_open == (g_prot_count > 0)) return;
    const int prot = g_prot_count > 0 ? PROT_READ | PROT_WRITE : PROT_NONE;
    for (const Device& d : *g_devices) {
      if (d.high_water > 0) mprotect(d.base, d.high_water, prot);
    }
  }
};

// The device whose arena holds [p, p + n) inside one live allocation, or null.
Device* DeviceOf(const void* p, size_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (Device& d : Devices()) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(d.base);
    if (a < base || a >= base + d.size) continue;
    auto it = d.allocations.upper_bound(a);
    if (it == d.allocations.begin()) return nullptr;
    --it;
    if (a + n > it->first + it->second) return nullptr;
    return &d;
  }
  return nullptr;
}

bool InArena(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (const Device& d : Devices()) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(d.base);
    if (a >= base && a < base + d.size) return true;
  }
  return false;
}

bool IsPinned(const void* p, size_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = g_pinned->upper_bound(a);
  if (it == g_pinned->begin()) return false;
  --it;
  return a + n <= it->first + it->second;
}

void* Allocate(Device& d, size_t size) {
  const size_t bytes = (size + kAlign - 1) / kAlign * kAlign;
  for (auto it = d.free_ranges.begin(); it != d.free_ranges.end(); ++it) {  // first fit
    if (it->second < bytes) continue;
    const size_t off = it->first, left = it->second - bytes;
    d.free_ranges.erase(it);
    if (left > 0) d.free_ranges[off + bytes] = left;
    char* p = d.base + off;
    d.allocations[reinterpret_cast<uintptr_t>(p)] = bytes;
    d.used += bytes;
    if (off + bytes > d.high_water) {
      std::lock_guard<std::mutex> lock(g_prot_mu);
      const size_t old = d.high_water;
      d.high_water = off + bytes;
      if (g_prot_count > 0) mprotect(d.base + old, d.high_water - old, PROT_READ | PROT_WRITE);
    }
    return p;
  }
  return nullptr;
}

void Release(Device& d, uintptr_t p, size_t bytes) {
  d.allocations.erase(p);
  d.used -= bytes;
  size_t off = p - reinterpret_cast<uintptr_t>(d.base);
  size_t len = bytes;
  auto next = d.free_ranges.lower_bound(off);
  if (next != d.free_ranges.end() && next->first == off + len) {
    len += next->second;
    next = d.free_ranges.erase(next);
  }
  if (next != d.free_ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      d.free_ranges.erase(prev);
    }
  }
  d.free_ranges[off] = len;
}

// The stream a handle names (null and cudaStreamLegacy: the current device's legacy stream).
CUstream_st* Resolve(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy) return Current().legacy;
  return s;
}

// Runs the tasks of `s` up to its `upto`th, in order, and returns true; at a closed gate
// (EnqueueHostWork) it returns false if !wait, and otherwise waits for the gate with g_mu
// released (so that the thread that opens it can run the runtime), which lets other threads
// run and queue work meanwhile: hence every step re-reads the queue.
bool Force(CUstream_st* s, uint64_t upto, bool wait = true) {
  Device& d = (*g_devices)[s->device];
  while (s->done < upto) {
    const std::vector<std::pair<CUstream_st*, uint64_t>> deps = s->queue.front().deps;
    for (const auto& [dep, seq] : deps) {
      if (!Force(dep, seq, wait)) return false;
    }
    if (s->done >= upto) break;
    Task& head = s->queue.front();
    bool deps_done = true;
    for (const auto& [dep, seq] : head.deps) deps_done = deps_done && dep->done >= seq;
    if (!deps_done) continue;
    if (head.gate != nullptr && !head.gate->Open()) {
      if (!wait) return false;
      const std::shared_ptr<StreamGate> gate = head.gate;
      const int depth = t_lock_depth;
      for (int i = 0; i < depth; ++i) g_mu.unlock();
      gate->Wait();
      for (int i = 0; i < depth; ++i) g_mu.lock();
      continue;
    }
    Task task = std::move(head);
    s->queue.pop_front();
    if (d.sticky == cudaSuccess) {
      const cudaError_t e = task.run();
      if (e != cudaSuccess) d.sticky = e;
    }
    ++s->done;
  }
  return true;
}

// Runs every task of `s` queued so far.
void Drain(CUstream_st* s) { Force(s, s->enqueued); }

void DrainDevice(Device& d) {
  Drain(d.legacy);
  const std::vector<CUstream_st*> streams = d.streams;  // Force may let others create streams
  for (CUstream_st* s : streams) Drain(s);
}

// Queues `run` on `s` with the legacy default stream's implicit ordering; on a capturing stream,
// records it as a node of type `type` instead.
void Enqueue(CUstream_st* s, std::function<cudaError_t()> run,
             cudaGraphNodeType type = cudaGraphNodeTypeEmpty,
             std::shared_ptr<StreamGate> gate = nullptr) {
  if (s->capture != nullptr) {
    s->capture->nodes.push_back(
        std::make_unique<CUgraphNode_st>(CUgraphNode_st{type, std::move(run)}));
    return;
  }
  Device& d = (*g_devices)[s->device];
  Task task{std::move(run), {}, std::move(gate)};
  if (s->legacy) {
    for (CUstream_st* other : d.streams) {
      if (other->blocking) task.deps.emplace_back(other, other->enqueued);
    }
  } else if (s->blocking) {
    task.deps.emplace_back(d.legacy, d.legacy->enqueued);
  }
  s->queue.push_back(std::move(task));
  ++s->enqueued;
}

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string KernelName(const void* kernel, const GridArg& grid) {
  std::string name;
  Dl_info info{};
  if (dladdr(kernel, &info) != 0 && info.dli_sname != nullptr && info.dli_saddr == kernel) {
    int status = 0;
    char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    name = status == 0 ? demangled : info.dli_sname;
    std::free(demangled);
  } else {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%p", kernel);
    name = buf;
  }
  const char* file = grid.site.file_name();
  const char* slash = std::strrchr(file, '/');
  return "kernel " + name + " launched at " + (slash != nullptr ? slash + 1 : file) + ":" +
         std::to_string(grid.site.line()) + " (in " + grid.site.function_name() + ")";
}

cudaError_t CopyCheck(void* dst, const void* src, size_t n, cudaMemcpyKind* kind) {
  const bool dst_dev = InArena(dst), src_dev = InArena(src);
  if (n == 0) return cudaSuccess;
  if ((dst_dev && DeviceOf(dst, n) == nullptr) || (src_dev && DeviceOf(src, n) == nullptr)) {
    return cudaErrorInvalidValue;  // outside a live allocation
  }
  cudaMemcpyKind actual = dst_dev ? (src_dev ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                  : (src_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  if (*kind != cudaMemcpyDefault && *kind != actual) return cudaErrorInvalidMemcpyDirection;
  *kind = actual;
  return cudaSuccess;
}

// Queues a copy on `s`; `sync`: cudaMemcpy's blocking rules rather than cudaMemcpyAsync's.
cudaError_t Copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, CUstream_st* s,
                 bool sync) {
  if (cudaError_t e = CopyCheck(dst, src, n, &kind); e != cudaSuccess) return Fail(e);
  Device& d = (*g_devices)[s->device];
  if (d.sticky != cudaSuccess) return d.sticky;
  if (n == 0) return cudaSuccess;
  auto copy = [dst, src, n] {
    DeviceAccess access;
    std::memmove(dst, src, n);
    return cudaSuccess;
  };
  if (s->capture != nullptr) {
    // Only an asynchronous copy that needs no host staging can become a graph node.
    const bool async = !sync && kind != cudaMemcpyHostToHost &&
                       (kind != cudaMemcpyHostToDevice || IsPinned(src, n)) &&
                       (kind != cudaMemcpyDeviceToHost || IsPinned(dst, n));
    if (!async) return InvalidateCapture(s);
    Enqueue(s, copy, cudaGraphNodeTypeMemcpy);
    return cudaSuccess;
  }
  switch (kind) {
    case cudaMemcpyHostToDevice:
      if (IsPinned(src, n)) {
        Enqueue(s, copy);  // DMA from pinned memory: reads the source when it runs
        if (sync) Drain(s);
      } else {
        // Pageable: staged now (the caller may reuse its buffer at once), copied in order.
        if (sync) Drain(s);
        auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                          static_cast<const char*>(src) + n);
        Enqueue(s, [dst, staged] {
          DeviceAccess access;
          std::memcpy(dst, staged->data(), staged->size());
          return cudaSuccess;
        });
      }
      break;
    case cudaMemcpyDeviceToHost:
      Enqueue(s, copy);
      // To pageable memory the call returns when the copy is done; to pinned memory only
      // cudaMemcpy waits.
      if (sync || !IsPinned(dst, n)) Drain(s);
      break;
    case cudaMemcpyDeviceToDevice:
      Enqueue(s, copy);
      break;
    default:  // host to host: synchronous after the stream's work
      Drain(s);
      std::memmove(dst, src, n);
      break;
  }
  return sync ? d.sticky : cudaSuccess;
}

const char* ErrorText(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInitializationError:
      return "initialization error";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDeviceFunction:
      return "invalid device function";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorNotSupported:
      return "operation not supported";
    case cudaErrorIllegalState:
      return "operation not valid in the stream's capture state";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    default:
      return "unknown error";
  }
}

}  // namespace

void EnqueueKernel(const void* kernel, const GridArg& grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, std::function<void()> body) {
  Locked lock;
  CUstream_st* s = Resolve(stream);
  if (s->destroyed || s->device != t_device) {
    Fail(cudaErrorInvalidResourceHandle);
    return;
  }
  const dim3 g = grid.dim;
  const uint64_t threads = static_cast<uint64_t>(block.x) * block.y * block.z;
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 2147483647u || g.y > 65535 || g.z > 65535 ||
      threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64) {
    Fail(cudaErrorInvalidConfiguration);
    return;
  }
  // Only the dynamic part is checked: the static __shared__ variables of all kernels share one
  // section (shared.ld), so a kernel's own static size is unknown here.
  const std::map<const void*, size_t>& limits = Devices()[s->device].max_dynamic_shared;
  const auto limit = limits.find(kernel);
  if (shared_bytes > (limit != limits.end() ? limit->second : kDefaultDynamicSharedBytes)) {
    Fail(cudaErrorInvalidValue);
    return;
  }
  auto launch = std::make_shared<GridLaunch>(
      GridLaunch{KernelName(kernel, grid), g, block, shared_bytes, std::move(body), ++g_launches});
  const int device = s->device;
  Enqueue(
      s,
      [launch, device] {
        std::string fault;
        {
          DeviceAccess access;
          fault = RunGrid(*launch);
        }
        if (fault.empty()) return cudaSuccess;
        const std::string message =
            "unspecified launch failure (emulated CUDA, cuda:" + std::to_string(device) +
            ", schedule seed " + std::to_string(ScheduleSeed()) + "): " + fault;
        std::fprintf(stderr, "%s\n", message.c_str());
        *g_fault = message;
        return cudaErrorLaunchFailure;
      },
      cudaGraphNodeTypeKernel);
}

cudaError_t EnqueueHostWork(int device, cudaStream_t stream, std::function<cudaError_t()> run,
                            std::shared_ptr<StreamGate> gate) {
  Locked lock;
  InitLocked();
  if (device < 0 || device >= static_cast<int>(Devices().size())) {
    return Fail(cudaErrorInvalidDevice);
  }
  CUstream_st* s =
      stream == nullptr || stream == cudaStreamLegacy ? Devices()[device].legacy : stream;
  if (s->destroyed || s->device != device) return Fail(cudaErrorInvalidResourceHandle);
  if (s->capture != nullptr) return InvalidateCapture(s);
  Device& d = Devices()[device];
  if (d.sticky != cudaSuccess) return d.sticky;
  Enqueue(
      s,
      [run = std::move(run)] {
        DeviceAccess access;
        return run();
      },
      cudaGraphNodeTypeHost, std::move(gate));
  return cudaSuccess;
}

const char* LastFaultMessage() {
  Locked lock;
  InitLocked();
  return g_fault->c_str();
}

}  // namespace llm::cuda_emu

using namespace llm::cuda_emu;  // NOLINT: the C API below is global, as CUDA's

#define EMU_LOCK \
  Locked lock;   \
  InitLocked()

cudaError_t cudaGetDeviceCount(int* count) {
  EMU_LOCK;
  *count = static_cast<int>(Devices().size());
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  EMU_LOCK;
  if (device < 0 || device >= static_cast<int>(Devices().size())) {
    return Fail(cudaErrorInvalidDevice);
  }
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  EMU_LOCK;
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  EMU_LOCK;
  if (device < 0 || device >= static_cast<int>(Devices().size())) {
    return Fail(cudaErrorInvalidDevice);
  }
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof(prop->name), "NVIDIA H100 80GB HBM3 (emulated CUDA)");
  prop->totalGlobalMem = Devices()[device].size;
  prop->sharedMemPerBlock = kDefaultDynamicSharedBytes;
  prop->sharedMemPerBlockOptin = kMaxDynamicSharedBytes;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->sharedMemPerMultiprocessor = 228 * 1024;
  prop->memoryBusWidth = 5120;
  prop->l2CacheSize = 50 * 1024 * 1024;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  EMU_LOCK;
  if (device < 0 || device >= static_cast<int>(Devices().size())) {
    return Fail(cudaErrorInvalidDevice);
  }
  if (value == nullptr) return Fail(cudaErrorInvalidValue);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = 132;  // as cudaGetDeviceProperties' multiProcessorCount
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = static_cast<int>(kDefaultDynamicSharedBytes);
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(kMaxDynamicSharedBytes);
      return cudaSuccess;
  }
  return Fail(cudaErrorInvalidValue);
}

cudaError_t cudaDeviceSynchronize() {
  EMU_LOCK;
  DrainDevice(Current());
  return Current().sticky;
}

cudaError_t cudaDeviceReset() {
  EMU_LOCK;
  Device& d = Current();
  for (CUstream_st* s : d.streams) s->destroyed = true;
  d.streams.clear();
  d.legacy = new CUstream_st();  // the old one's queue is dropped with it (leaked, as handles)
  d.legacy->device = d.ordinal;
  d.legacy->legacy = true;
  while (!d.allocations.empty()) {
    auto it = d.allocations.begin();
    Release(d, it->first, it->second);
  }
  d.max_dynamic_shared.clear();  // the context's function attributes go with it
  d.sticky = cudaSuccess;
  t_last_error = cudaSuccess;
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  EMU_LOCK;
  if (func == nullptr) return Fail(cudaErrorInvalidDeviceFunction);
  switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize:
      if (value < 0 || static_cast<size_t>(value) > kMaxDynamicSharedBytes) {
        return Fail(cudaErrorInvalidValue);
      }
      Current().max_dynamic_shared[func] = static_cast<size_t>(value);
      return cudaSuccess;
    case cudaFuncAttributePreferredSharedMemoryCarveout:  // a hint, without effect here
      return value >= -1 && value <= 100 ? cudaSuccess : Fail(cudaErrorInvalidValue);
  }
  return Fail(cudaErrorInvalidValue);
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  EMU_LOCK;
  const Device& d = Current();
  if (d.sticky != cudaSuccess) return d.sticky;
  *free = d.size - d.used;
  *total = d.size;
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  EMU_LOCK;
  const cudaError_t sticky = Current().sticky;
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return sticky != cudaSuccess ? sticky : e;
}

cudaError_t cudaPeekAtLastError() {
  EMU_LOCK;
  const cudaError_t sticky = Current().sticky;
  return sticky != cudaSuccess ? sticky : t_last_error;
}

const char* cudaGetErrorString(cudaError_t error) {
  EMU_LOCK;
  if (error == cudaErrorLaunchFailure && !g_fault->empty()) return g_fault->c_str();
  return ErrorText(error);
}

const char* cudaGetErrorName(cudaError_t error) { return ErrorText(error); }

cudaError_t cudaMalloc(void** ptr, size_t size) {
  EMU_LOCK;
  Device& d = Current();
  if (d.sticky != cudaSuccess) return d.sticky;
  if (ptr == nullptr) return Fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  void* p = Allocate(d, size);
  if (p == nullptr) return Fail(cudaErrorMemoryAllocation);
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  EMU_LOCK;
  if (ptr == nullptr) return cudaSuccess;
  Device* d = DeviceOf(ptr, 0);
  const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  if (d == nullptr || !d->allocations.contains(a)) return Fail(cudaErrorInvalidValue);
  DrainDevice(*d);  // cudaFree synchronizes the device
  Release(*d, a, d->allocations[a]);
  return d->sticky;
}

cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream) {
  EMU_LOCK;
  CUstream_st* s = Resolve(stream);
  if (s->destroyed) return Fail(cudaErrorInvalidResourceHandle);
  Device& d = (*g_devices)[s->device];
  if (d.sticky != cudaSuccess) return d.sticky;
  *ptr = size == 0 ? nullptr : Allocate(d, size);
  if (size != 0 && *ptr == nullptr) return Fail(cudaErrorMemoryAllocation);
  return cudaSuccess;
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  EMU_LOCK;
  CUstream_st* s = Resolve(stream);
  if (s->destroyed) return Fail(cudaErrorInvalidResourceHandle);
  if (ptr == nullptr) return cudaSuccess;
  if (s->capture != nullptr) return InvalidateCapture(s);
  Device* d = DeviceOf(ptr, 0);
  const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  if (d == nullptr || !d->allocations.contains(a)) return Fail(cudaErrorInvalidValue);
  Enqueue(s, [d, a] {
    auto it = d->allocations.find(a);
    if (it != d->allocations.end()) Release(*d, a, it->second);
    return cudaSuccess;
  });
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned) {
  EMU_LOCK;
  void* p = std::aligned_alloc(4096, (size + 4095) / 4096 * 4096 + 4096);
  if (p == nullptr) return Fail(cudaErrorMemoryAllocation);
  (*g_pinned)[reinterpret_cast<uintptr_t>(p)] = size;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaHostAlloc(ptr, size, 0); }

cudaError_t cudaFreeHost(void* ptr) {
  EMU_LOCK;
  if (ptr == nullptr) return cudaSuccess;
  auto it = g_pinned->find(reinterpret_cast<uintptr_t>(ptr));
  if (it == g_pinned->end()) return Fail(cudaErrorInvalidValue);
  // Queued copies may still read it: run them first, as the device would finish them.
  for (Device& d : Devices()) DrainDevice(d);
  g_pinned->erase(it);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned) {
  EMU_LOCK;
  if (ptr == nullptr || size == 0 || InArena(ptr)) return Fail(cudaErrorInvalidValue);
  (*g_pinned)[reinterpret_cast<uintptr_t>(ptr)] = size;
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* ptr) {
  EMU_LOCK;
  auto it = g_pinned->find(reinterpret_cast<uintptr_t>(ptr));
  if (it == g_pinned->end()) return Fail(cudaErrorInvalidValue);
  for (Device& d : Devices()) DrainDevice(d);
  g_pinned->erase(it);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  EMU_LOCK;
  if (attributes == nullptr) return Fail(cudaErrorInvalidValue);
  *attributes = cudaPointerAttributes{};
  attributes->device = -2;
  if (InArena(ptr)) {
    Device* d = DeviceOf(ptr, 0);
    if (d == nullptr) return Fail(cudaErrorInvalidValue);  // arena, but no live allocation
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = d->ordinal;
    attributes->devicePointer = const_cast<void*>(ptr);
  } else if (ptr != nullptr && IsPinned(ptr, 0)) {
    attributes->type = cudaMemoryTypeHost;
    attributes->device = t_device;
    attributes->hostPointer = const_cast<void*>(ptr);
    attributes->devicePointer = const_cast<void*>(ptr);
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->hostPointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  EMU_LOCK;
  return Copy(dst, src, count, kind, Current().legacy, /*sync=*/true);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  EMU_LOCK;
  CUstream_st* s = Resolve(stream);
  if (s->destroyed) return Fail(cudaErrorInvalidResourceHandle);
  return Copy(dst, src, count, kind, s, /*sync=*/false);
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  EMU_LOCK;
  CUstream_st* s = Resolve(stream);
  if (s->destroyed) return Fail(cudaErrorInvalidResourceHandle);
  if (count == 0) return cudaSuccess;
  if (DeviceOf(ptr, count) == nullptr) return Fail(cudaErrorInvalidValue);
  if ((*g_devices)[s->device].sticky != cudaSuccess) return (*g_devices)[s->device].sticky;
  Enqueue(
      s,
      [ptr, value, count] {
        DeviceAccess access;
        std::memset(ptr, value, count);
        return cudaSuccess;
      },
      cudaGraphNodeTypeMemset);
  return cudaSuccess;
}

cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  return cudaMemsetAsync(ptr, value, count, nullptr);  // asynchronous for device memory
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  EMU_LOCK;
  auto* s = new CUstream_st();
  s->device = t_device;
  s->blocking = (flags & cudaStreamNonBlocking) == 0;
  Current().streams.push_back(s);
  *stream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  EMU_LOCK;
  if (stream == nullptr || stream == cudaStreamLegacy || stream->destroyed) {
    return Fail(cudaErrorInvalidResourceHandle);
  }
  Drain(stream);  // queued work still completes
  stream->destroyed = true;
  auto& streams = (*g_devices)[stream->device].streams;
  std::erase(streams, stream);
  return cudaSuccess;  // the handle is leaked: events may still name it
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  EMU_LOCK;
  CUstream_st* s = Resolve(stream);
  if (s->destroyed) return Fail(cudaErrorInvalidResourceHandle);
  if (s->capture != nullptr) return InvalidateCapture(s);
  Drain(s);
  return (*g_devices)[s->device].sticky;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  EMU_LOCK;
  CUstream_st* s = Resolve(stream);
  if (s->destroyed) return Fail(cudaErrorInvalidResourceHandle);
  if (s->capture != nullptr) return InvalidateCapture(s);
  // Runs what can run; work behind a closed gate (a collective waiting for its peers) is not
  // done yet.
  if (!Force(s, s->enqueued, /*wait=*/false)) return cudaErrorNotReady;
  return (*g_devices)[s->device].sticky;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  EMU_LOCK;
  CUstream_st* s = Resolve(stream);
  if (s->destroyed || event == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  if (s->capture != nullptr) return InvalidateCapture(s);
  if (event->record == nullptr) return cudaSuccess;  // never recorded: nothing to wait for
  std::shared_ptr<EventRecord> rec = event->record;
  Device& d = (*g_devices)[s->device];
  Task task{[] { return cudaSuccess; }, {{rec->stream, rec->seq}}};
  if (s->blocking && !s->legacy) task.deps.emplace_back(d.legacy, d.legacy->enqueued);
  s->queue.push_back(std::move(task));
  ++s->enqueued;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  EMU_LOCK;
  *event = new CUevent_st{flags, nullptr};
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  EMU_LOCK;
  if (event == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  EMU_LOCK;
  CUstream_st* s = Resolve(stream);
  if (s->destroyed || event == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  if (s->capture != nullptr) return InvalidateCapture(s);
  auto rec = std::make_shared<EventRecord>();
  rec->stream = s;
  Enqueue(s, [rec] {
    rec->ms = NowMs();
    return cudaSuccess;
  });
  rec->seq = s->enqueued;
  event->record = rec;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  EMU_LOCK;
  if (event == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  if (event->record == nullptr) return cudaSuccess;
  Force(event->record->stream, event->record->seq);
  return (*g_devices)[event->record->stream->device].sticky;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  EMU_LOCK;
  if (event == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  if (event->record == nullptr) return cudaSuccess;
  if (!Force(event->record->stream, event->record->seq, /*wait=*/false)) return cudaErrorNotReady;
  return (*g_devices)[event->record->stream->device].sticky;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  EMU_LOCK;
  if (start == nullptr || end == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  if ((start->flags | end->flags) & cudaEventDisableTiming) {
    return Fail(cudaErrorInvalidResourceHandle);
  }
  if (start->record == nullptr || end->record == nullptr)
    return Fail(cudaErrorInvalidResourceHandle);
  const EventRecord &a = *start->record, &b = *end->record;
  if (a.stream->done < a.seq || b.stream->done < b.seq) return Fail(cudaErrorNotReady);
  *ms = static_cast<float>(b.ms - a.ms);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  EMU_LOCK;
  // The legacy default stream cannot be captured (it synchronizes with every blocking stream).
  if (stream == nullptr || stream == cudaStreamLegacy) {
    return Fail(cudaErrorStreamCaptureUnsupported);
  }
  if (stream->destroyed) return Fail(cudaErrorInvalidResourceHandle);
  if (stream->capture != nullptr) return Fail(cudaErrorIllegalState);
  stream->capture = new CUgraph_st{stream->device, {}};
  stream->capture_invalidated = false;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  EMU_LOCK;
  if (stream == nullptr || stream == cudaStreamLegacy || stream->destroyed || graph == nullptr) {
    return Fail(cudaErrorInvalidValue);
  }
  if (stream->capture == nullptr) return Fail(cudaErrorIllegalState);
  std::unique_ptr<CUgraph_st> captured(stream->capture);
  stream->capture = nullptr;
  if (stream->capture_invalidated) {
    *graph = nullptr;
    return Fail(cudaErrorStreamCaptureInvalidated);
  }
  *graph = captured.release();
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  EMU_LOCK;
  if (status == nullptr) return Fail(cudaErrorInvalidValue);
  CUstream_st* s = Resolve(stream);
  *status = s->capture == nullptr    ? cudaStreamCaptureStatusNone
            : s->capture_invalidated ? cudaStreamCaptureStatusInvalidated
                                     : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* num_nodes) {
  EMU_LOCK;
  if (graph == nullptr || num_nodes == nullptr) return Fail(cudaErrorInvalidValue);
  if (nodes == nullptr) {
    *num_nodes = graph->nodes.size();
    return cudaSuccess;
  }
  const size_t n = std::min(*num_nodes, graph->nodes.size());
  for (size_t i = 0; i < n; ++i) nodes[i] = graph->nodes[i].get();
  *num_nodes = n;
  return cudaSuccess;
}

cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, cudaGraphNodeType* type) {
  EMU_LOCK;
  if (node == nullptr || type == nullptr) return Fail(cudaErrorInvalidValue);
  *type = node->type;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  EMU_LOCK;
  if (exec == nullptr || graph == nullptr) return Fail(cudaErrorInvalidValue);
  auto* e = new CUgraphExec_st{graph->device, {}};
  for (const auto& node : graph->nodes) e->nodes.push_back(*node);
  *exec = e;
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  EMU_LOCK;
  if (exec == nullptr) return Fail(cudaErrorInvalidValue);
  CUstream_st* s = Resolve(stream);
  if (s->destroyed || s->device != exec->device) return Fail(cudaErrorInvalidResourceHandle);
  Device& d = (*g_devices)[s->device];
  if (d.sticky != cudaSuccess) return d.sticky;
  for (const CUgraphNode_st& node : exec->nodes) Enqueue(s, node.run, node.type);
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  EMU_LOCK;
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  EMU_LOCK;
  delete graph;
  return cudaSuccess;
}
