// Asynchronous copies from global to shared memory (cp.async, sm_80+), in groups:
//
//   CpAsync<16>(&tile[i], &src[i]);   // issue: the copy runs beside the thread
//   CpAsyncCommitGroup();              // the copies issued since the last commit form a group
//   CpAsyncWaitGroup<1>();             // wait until at most the newest 1 group is in flight
//   __syncthreads();                   // then the other threads' copies are visible too
//
// CpAsync<kBytes>(dst, src, src_bytes) copies kBytes (4, 8 or 16; dst and src aligned to it)
// of which only the first src_bytes are read from src, the rest zero-filled (src_bytes = 0
// zero-fills a tile's out-of-range rows without a branch around the copy). A wait covers the
// calling thread's own copies only: another thread sees them after the wait and a barrier.
//
// Under nvcc: cp.async.cg.shared.global for 16 bytes (cached in L2 only), .ca for 4 and 8;
// cp.async.commit_group, cp.async.wait_group N, cp.async.wait_all. Under the CUDA emulation
// (LLM_CUDA_EMU) the copy is queued on the emulated thread (its source read at the issue) and
// written to shared memory only by the wait that covers its group, so a read of the destination
// before that wait sees the old (poisoned) bytes, and a missing wait or barrier fails a test
// instead of passing by luck. A copy never waited for is never written.
#ifndef LLM_KERNELS_CUDA_ASYNC_COPY_CUH_
#define LLM_KERNELS_CUDA_ASYNC_COPY_CUH_

#include <cuda_runtime.h>

#ifdef LLM_CUDA_EMU
#include <source_location>
#endif

namespace llm::cuda {

#ifdef LLM_CUDA_EMU
template <int kBytes>
void CpAsync(void* smem_dst, const void* gmem_src, int src_bytes = kBytes,
             std::source_location where = std::source_location::current()) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  ::llm::cuda_emu::AsyncCopy(smem_dst, gmem_src, kBytes, src_bytes, where);
}
inline void CpAsyncCommitGroup() { ::llm::cuda_emu::AsyncCommitGroup(); }
template <int kPending>
void CpAsyncWaitGroup() {
  static_assert(kPending >= 0, "the number of groups left in flight");
  ::llm::cuda_emu::AsyncWaitGroup(kPending);
}
inline void CpAsyncWaitAll() { ::llm::cuda_emu::AsyncWaitGroup(-1); }
// The 16-byte copy, the common case (one vector of 8 bf16 / 4 floats per thread).
inline void CpAsync16(void* smem_dst, const void* gmem_src,
                      std::source_location where = std::source_location::current()) {
  CpAsync<16>(smem_dst, gmem_src, 16, where);
}
#else
template <int kBytes>
__device__ __forceinline__ void CpAsync(void* smem_dst, const void* gmem_src,
                                        int src_bytes = kBytes) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
                 "r"(src_bytes)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(gmem_src),
                 "n"(kBytes), "r"(src_bytes)
                 : "memory");
  }
}
__device__ __forceinline__ void CpAsyncCommitGroup() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void CpAsyncWaitGroup() {
  static_assert(kPending >= 0, "the number of groups left in flight");
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void CpAsyncWaitAll() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}
__device__ __forceinline__ void CpAsync16(void* smem_dst, const void* gmem_src) {
  CpAsync<16>(smem_dst, gmem_src);
}
#endif

}  // namespace llm::cuda

#endif  // LLM_KERNELS_CUDA_ASYNC_COPY_CUH_
