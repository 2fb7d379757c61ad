// Emulated CUDA (LLM_CUDA_EMU): the runtime API without the device side.
#ifndef LLM_CUDA_EMU_INCLUDE_CUDA_RUNTIME_API_H_
#define LLM_CUDA_EMU_INCLUDE_CUDA_RUNTIME_API_H_

#include "cuda_emu/runtime.h"

#endif  // LLM_CUDA_EMU_INCLUDE_CUDA_RUNTIME_API_H_
