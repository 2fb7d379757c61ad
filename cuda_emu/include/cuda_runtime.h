// Emulated CUDA (LLM_CUDA_EMU): stands in for the toolkit's cuda_runtime.h. The runtime subset
// is cuda_emu/runtime.h, the device side (qualifiers, thread indices, barriers,
// shuffles, atomics, math) cuda_emu/device.h.
#ifndef LLM_CUDA_EMU_INCLUDE_CUDA_RUNTIME_H_
#define LLM_CUDA_EMU_INCLUDE_CUDA_RUNTIME_H_

#include "cuda_emu/device.h"
#include "cuda_emu/runtime.h"

#endif  // LLM_CUDA_EMU_INCLUDE_CUDA_RUNTIME_H_
