// Emulated CUDA (LLM_CUDA_EMU): the device side of the CUDA sources, compiled by the host
// compiler.
//
// Execution model (block_runner.cc): each thread block runs on one OS thread, its threads as
// fibers in warps of 32; a fiber runs until a barrier, a warp collective or its end, and the
// order in which the runnable fibers go next is shuffled at every such point (seeded by
// LLM_CUDA_EMU_SEED: unset = seed 1, "0" = no shuffling). Blocks of a grid run on up to 4 OS
// threads at once, so races between blocks are real. `__shared__` is `static thread_local`:
// the fibers of a block share it, blocks on other OS threads have their own; it is filled
// with 0x7f bytes at every block start (shared.ld), so a read before a write sees poison.
// Dynamic shared memory (kernels/cuda/shared_memory.cuh) is a buffer of the launch's
// shared_bytes per OS thread, poisoned the same way at every block start and followed by a
// PROT_NONE page. cp.async (kernels/cuda/async_copy.cuh) is queued per thread and performed by
// that thread's waits.
//
// Faults, reported as a sticky launch error naming the kernel's launch site and the source
// line (and printed to stderr): a __syncthreads that only part of the block reaches (others
// exited or wait at another barrier), a warp collective whose mask names an exited lane or a
// lane that is not in the block, lanes of one mask at different collectives.
#ifndef LLM_CUDA_EMU_DEVICE_H_
#define LLM_CUDA_EMU_DEVICE_H_

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <functional>
#include <source_location>
#include <type_traits>

#include "cuda_emu/runtime.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define __constant__ static

struct uint3 {
  unsigned x, y, z;
};

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

inline constexpr int warpSize = 32;

namespace llm::cuda_emu {

// The calling fiber's CUDA thread, and its block. Valid only inside a kernel.
struct ThreadState {
  uint3 thread_idx;
};
struct BlockState {
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
  unsigned char* dynamic_shared;  // the launch's shared_bytes, 16-byte aligned
};
inline thread_local ThreadState* t_thread = nullptr;
inline thread_local BlockState t_block{};

void SyncThreads(const std::source_location& where);
// Warp collectives. kind: what the lanes exchange; arg: the source lane, delta or lane mask.
enum class WarpOp { kSync, kShfl, kShflUp, kShflDown, kShflXor, kBallot };
uint64_t WarpCollective(WarpOp op, unsigned mask, uint64_t value, int arg, int width,
                        const std::source_location& where);

// cp.async of the calling thread: AsyncCopy reads `src_bytes` of `src` now (and zero-fills
// the rest of `bytes`) but writes `dst` only when a wait performs it; AsyncCommitGroup closes a
// group of the copies issued since the last one; AsyncWaitGroup(n) performs every committed
// group but the newest n (n < 0: every copy, committed or not). A copy the thread never waits
// for is never performed.
void AsyncCopy(void* dst, const void* src, int bytes, int src_bytes,
               const std::source_location& where);
void AsyncCommitGroup();
void AsyncWaitGroup(int n);

template <typename T>
uint64_t ToBits(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffle of a wide type");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}
template <typename T>
T FromBits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

// Kernel launches (kernels/cuda/launch.cuh). The grid argument carries the launch site.
struct GridArg {
  dim3 dim;
  std::source_location site;
  GridArg(dim3 d, std::source_location s = std::source_location::current()) : dim(d), site(s) {}
  GridArg(uint3 d, std::source_location s = std::source_location::current()) : dim(d), site(s) {}
  template <std::integral I>
  GridArg(I n, std::source_location s = std::source_location::current())
      : dim(static_cast<unsigned>(n)), site(s) {}
};

// Checks the configuration (a bad one is the launch's error, for cudaGetLastError) and
// queues `body` on `stream`, to run once per CUDA thread of the grid.
void EnqueueKernel(const void* kernel, const GridArg& grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, std::function<void()> body);

// The message of the last kernel fault on any device ("" when none), for tests.
const char* LastFaultMessage();

}  // namespace llm::cuda_emu

#define threadIdx (::llm::cuda_emu::t_thread->thread_idx)
#define blockIdx (::llm::cuda_emu::t_block.block_idx)
#define blockDim (::llm::cuda_emu::t_block.block_dim)
#define gridDim (::llm::cuda_emu::t_block.grid_dim)

inline void __syncthreads(std::source_location where = std::source_location::current()) {
  ::llm::cuda_emu::SyncThreads(where);
}
inline void __syncwarp(unsigned mask = 0xffffffffu,
                       std::source_location where = std::source_location::current()) {
  ::llm::cuda_emu::WarpCollective(::llm::cuda_emu::WarpOp::kSync, mask, 0, 0, 32, where);
}

#define LLM_CUDA_EMU_SHUFFLE(name, op, argtype)                                                 \
  template <typename T>                                                                         \
  T name(unsigned mask, T var, argtype arg, int width = warpSize,                               \
         std::source_location where = std::source_location::current()) {                        \
    return ::llm::cuda_emu::FromBits<T>(::llm::cuda_emu::WarpCollective(                        \
        ::llm::cuda_emu::WarpOp::op, mask, ::llm::cuda_emu::ToBits(var), static_cast<int>(arg), \
        width, where));                                                                         \
  }
LLM_CUDA_EMU_SHUFFLE(__shfl_sync, kShfl, int)
LLM_CUDA_EMU_SHUFFLE(__shfl_up_sync, kShflUp, unsigned)
LLM_CUDA_EMU_SHUFFLE(__shfl_down_sync, kShflDown, unsigned)
LLM_CUDA_EMU_SHUFFLE(__shfl_xor_sync, kShflXor, int)
#undef LLM_CUDA_EMU_SHUFFLE

inline unsigned __ballot_sync(unsigned mask, int predicate,
                              std::source_location where = std::source_location::current()) {
  return static_cast<unsigned>(::llm::cuda_emu::WarpCollective(::llm::cuda_emu::WarpOp::kBallot,
                                                               mask, predicate != 0, 0, 32, where));
}
inline int __any_sync(unsigned mask, int predicate,
                      std::source_location where = std::source_location::current()) {
  return __ballot_sync(mask, predicate, where) != 0;
}
inline int __all_sync(unsigned mask, int predicate,
                      std::source_location where = std::source_location::current()) {
  return __ballot_sync(mask, predicate, where) == mask;
}

// Atomics: real ones, since blocks run on several OS threads at once. They work on shared
// memory too (the fibers of a block are on one OS thread, so they never interleave inside one).
template <typename T>
T atomicAdd(T* address, T val) {
  return std::atomic_ref<T>(*address).fetch_add(val);
}
template <typename T>
T atomicSub(T* address, T val) {
  return std::atomic_ref<T>(*address).fetch_sub(val);
}
template <typename T>
T atomicExch(T* address, T val) {
  return std::atomic_ref<T>(*address).exchange(val);
}
template <typename T>
T atomicCAS(T* address, T compare, T val) {
  std::atomic_ref<T>(*address).compare_exchange_strong(compare, val);
  return compare;
}
template <typename T>
T atomicMax(T* address, T val) {
  std::atomic_ref<T> a(*address);
  T old = a.load();
  while (old < val && !a.compare_exchange_weak(old, val)) {
  }
  return old;
}
template <typename T>
T atomicMin(T* address, T val) {
  std::atomic_ref<T> a(*address);
  T old = a.load();
  while (val < old && !a.compare_exchange_weak(old, val)) {
  }
  return old;
}
template <typename T>
T atomicAnd(T* address, T val) {
  return std::atomic_ref<T>(*address).fetch_and(val);
}
template <typename T>
T atomicOr(T* address, T val) {
  return std::atomic_ref<T>(*address).fetch_or(val);
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }

template <typename T>
T __ldg(const T* p) {
  return *p;
}

// Math: the host libm (within the device's ulp bounds for the functions used here; not bit
// exact with the device's approximations).
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }

// CUDA's global min / max overloads.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }

#endif  // LLM_CUDA_EMU_DEVICE_H_
