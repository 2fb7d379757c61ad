// OpenBLAS kernel selection for the CPU backend.
//
// Debian's OpenBLAS is built for every x86 core (DYNAMIC_ARCH) and picks its kernels from the
// CPU model when the library is loaded. Virtual machines often report a generic model
// ("Intel(R) Xeon(R) Processor"); OpenBLAS then falls back to its Prescott (SSE3) kernels even
// when the CPU has AVX-512 or AVX2, and a batch-1 decode, which should stream its weights at
// the memory bandwidth, falls well short of it (docs/performance/results.md, "CPU kernels").
// The choice is made before main() runs, so the only fix from inside the program is to set
// OPENBLAS_CORETYPE and start again.
#ifndef LLM_KERNELS_CPU_BLAS_SETUP_H_
#define LLM_KERNELS_CPU_BLAS_SETUP_H_

#include <string>

namespace llm::cpu {

// The core OpenBLAS uses ("Haswell", "SkylakeX", "Prescott", ...).
std::string BlasCoreName();

// Call first thing in main(). When OPENBLAS_CORETYPE is unset, OpenBLAS chose Prescott and
// the CPU supports AVX-512 (SkylakeX kernels) or AVX2 with FMA (Haswell kernels): sets
// OPENBLAS_CORETYPE and re-executes this program with the same arguments. Returns (doing
// nothing) otherwise, or when the re-execution fails. Never loops: the second run has
// OPENBLAS_CORETYPE set.
void ReexecWithMatchingBlasKernels(char** argv);

}  // namespace llm::cpu

#endif  // LLM_KERNELS_CPU_BLAS_SETUP_H_
