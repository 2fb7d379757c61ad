// Emulated CUDA (LLM_CUDA_EMU): stands in for the toolkit's cuda_runtime.h. The runtime subset
// is kernels/cuda/emu/runtime.h, the device side (qualifiers, thread indices, barriers,
// shuffles, atomics, math) kernels/cuda/emu/device.h.
#ifndef LLM_KERNELS_CUDA_EMU_INCLUDE_CUDA_RUNTIME_H_
#define LLM_KERNELS_CUDA_EMU_INCLUDE_CUDA_RUNTIME_H_

#include "kernels/cuda/emu/device.h"
#include "kernels/cuda/emu/runtime.h"

#endif  // LLM_KERNELS_CUDA_EMU_INCLUDE_CUDA_RUNTIME_H_
