// Emulated CUDA (LLM_CUDA_EMU): runs one kernel launch's grid on the CPU (device.h has the
// execution model). Internal to cuda_emu.
#ifndef LLM_CUDA_EMU_BLOCK_RUNNER_H_
#define LLM_CUDA_EMU_BLOCK_RUNNER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "cuda_emu/device.h"

namespace llm::cuda_emu {

// Dynamic shared memory per block: the most a launch gets without
// cudaFuncAttributeMaxDynamicSharedMemorySize, and the most that attribute allows (an H100's
// sharedMemPerBlockOptin).
inline constexpr size_t kDefaultDynamicSharedBytes = 48 * 1024;
inline constexpr size_t kMaxDynamicSharedBytes = 227 * 1024;

struct GridLaunch {
  std::string kernel;  // name and launch site, for fault messages
  dim3 grid;
  dim3 block;
  size_t shared_bytes;         // dynamic shared memory, at most kMaxDynamicSharedBytes
  std::function<void()> body;  // one CUDA thread
  uint64_t launch_id;          // seeds the schedule, with LLM_CUDA_EMU_SEED
};

// Runs every block of the grid (on up to 4 OS threads, the caller's included) and returns ""
// or the first fault's message; after a fault the blocks not started yet are skipped.
// Not reentrant: one grid at a time (the runtime's lock).
std::string RunGrid(const GridLaunch& launch);

// Whether `addr` is in the PROT_NONE page after this OS thread's dynamic shared memory (for
// the SIGSEGV handler: a kernel accessed past its dynamic shared memory). Async-signal-safe.
bool IsDynamicSharedGuard(const void* addr);

// The schedule seed (LLM_CUDA_EMU_SEED; 1 when unset; 0: fibers run in thread order).
uint64_t ScheduleSeed();

}  // namespace llm::cuda_emu

#endif  // LLM_CUDA_EMU_BLOCK_RUNNER_H_
