// Emulated CUDA (LLM_CUDA_EMU): runs one kernel launch's grid on the CPU (device.h has the
// execution model). Internal to kernels/cuda/emu.
#ifndef LLM_KERNELS_CUDA_EMU_BLOCK_RUNNER_H_
#define LLM_KERNELS_CUDA_EMU_BLOCK_RUNNER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "kernels/cuda/emu/device.h"

namespace llm::cuda_emu {

struct GridLaunch {
  std::string kernel;  // name and launch site, for fault messages
  dim3 grid;
  dim3 block;
  std::function<void()> body;  // one CUDA thread
  uint64_t launch_id;          // seeds the schedule, with LLM_CUDA_EMU_SEED
};

// Runs every block of the grid (on up to 4 OS threads, the caller's included) and returns ""
// or the first fault's message; after a fault the blocks not started yet are skipped.
// Not reentrant: one grid at a time (the runtime's lock).
std::string RunGrid(const GridLaunch& launch);

// The schedule seed (LLM_CUDA_EMU_SEED; 1 when unset; 0: fibers run in thread order).
uint64_t ScheduleSeed();

}  // namespace llm::cuda_emu

#endif  // LLM_KERNELS_CUDA_EMU_BLOCK_RUNNER_H_
