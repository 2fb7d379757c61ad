// Kernels for shared_poison_test.cc, built into a library named like the kernel library
// (llm_kernels_cuda_emu_*) with -fdata-sections, so that shared.ld gathers their __shared__
// variables into the poisoned section as it does the real kernels'.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/launch.cuh"

namespace llm::cuda_emu::testing {
namespace {

// Reads its slot of shared memory before any thread wrote it, then writes it.
__global__ void ReadBeforeWriteKernel(float* out) {
  __shared__ float s[64];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s[threadIdx.x];
  s[threadIdx.x] = 1.0f;
}

// The same in a template (a comdat local static, as most of the real kernels' are), with a
// half and an int array beside the float one.
template <int kN>
__global__ void ReadBeforeWriteTemplateKernel(float* out, unsigned short* out_half, int* out_int) {
  __shared__ float s[kN];
  __shared__ __half h[kN];
  __shared__ int n[kN];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = s[threadIdx.x];
  out_half[i] = __half_as_ushort(h[threadIdx.x]);
  out_int[i] = n[threadIdx.x];
  s[threadIdx.x] = 1.0f;
  h[threadIdx.x] = __float2half(1.0f);
  n[threadIdx.x] = 1;
}

}  // namespace

void LaunchReadBeforeWrite(float* out, int blocks) {
  cuda::Launch(ReadBeforeWriteKernel, blocks, 64, 0, nullptr, out);
}

void LaunchReadBeforeWriteTemplate(float* out, unsigned short* out_half, int* out_int, int blocks) {
  cuda::Launch(ReadBeforeWriteTemplateKernel<32>, blocks, 32, 0, nullptr, out, out_half, out_int);
}

}  // namespace llm::cuda_emu::testing
