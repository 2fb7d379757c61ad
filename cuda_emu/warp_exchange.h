// Emulated CUDA (LLM_CUDA_EMU): a warp-wide all-to-all exchange, for the emulation of the
// warp-level matrix instructions (kernels/cuda/mma.cuh: mma.sync, ldmatrix), where every lane
// needs registers of many other lanes and one shuffle per value would cost a fiber switch each.
//
// WarpExchange(words): every lane of the calling warp (all 32 lanes, which must exist in the
// block and not have exited) publishes kWords 32-bit words and gets back a view of all 32 lanes'
// words, [lane][word]. It is one __syncwarp: the lanes write into a per-warp slot, meet, and
// read. The view stays valid until the calling lane's next-but-one WarpExchange: the slots
// alternate (double buffering), and a lane can only write the slot again after every lane has
// passed the next exchange, so after every lane has finished reading this one.
//
// The slots are per OS thread (one block runs on one OS thread at a time, its fibers share
// them) and per warp; each lane keeps its own parity. All lanes of a warp do the same number of
// exchanges (the instructions built on it are .aligned: the whole warp executes them), so the
// lanes of a warp always agree on the slot, also across the blocks that run on the thread.
#ifndef LLM_CUDA_EMU_WARP_EXCHANGE_H_
#define LLM_CUDA_EMU_WARP_EXCHANGE_H_

#include <cstdint>
#include <source_location>

#include "cuda_emu/device.h"

namespace llm::cuda_emu {

inline constexpr int kWarpExchangeMaxWords = 8;

struct WarpExchangeSlots {
  static constexpr int kMaxWarps = 32;  // 1024 threads
  uint32_t words[kMaxWarps][2][32][kWarpExchangeMaxWords];
  uint8_t parity[kMaxWarps][32];
};

// A namespace-scope variable, not a function-local static: shared.ld gathers the kernels'
// function-local thread_locals (their __shared__) and poisons them at every block start, which
// these 66 KiB need not be.
inline thread_local WarpExchangeSlots t_warp_exchange_slots{};

// The calling thread's linear index in its block (the emulator's lane order).
inline int LinearThreadIndex() {
  return static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

template <int kWords>
const uint32_t (*WarpExchange(
    const uint32_t (&mine)[kWords],
    std::source_location where = std::source_location::current()))[kWarpExchangeMaxWords] {
  static_assert(kWords >= 1 && kWords <= kWarpExchangeMaxWords, "too many words per lane");
  WarpExchangeSlots& s = t_warp_exchange_slots;
  const int linear = LinearThreadIndex();
  const int warp = linear / 32, lane = linear % 32;
  uint8_t& parity = s.parity[warp][lane];
  parity = (parity + 1) & 1;
  uint32_t(*slot)[kWarpExchangeMaxWords] = s.words[warp][parity];
  for (int i = 0; i < kWords; ++i) slot[lane][i] = mine[i];
  __syncwarp(0xffffffffu, where);  // faults when a lane is missing
  return slot;
}

}  // namespace llm::cuda_emu

#endif  // LLM_CUDA_EMU_WARP_EXCHANGE_H_
