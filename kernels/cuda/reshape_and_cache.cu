// Writes this step's keys and values (f32, bf16 or f16) into the paged KV cache (f32, f16 or
// bf16, converted through fp32 and rounded to nearest even) on CUDA. One thread block per token; a
// slot is block_id * block_size + slot_in_block, so with the cache contiguous
//   key_cache[slot / block_size][slot % block_size][h][d] = key_cache_flat[slot][h][d].
// key and value may be token-strided (kernels/ops.h): token t's Hkv * D values start at
// data + t * k_stride (v_stride).
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/op_check.h"

namespace llm::ops::cuda {
namespace {

using cuda_internal::IndexPtr;

// slot_stride = Hkv * D. A negative slot (-1: padding) or one >= num_slots is skipped.
template <typename InT, typename CacheT>
__global__ void ReshapeAndCacheKernel(const InT* __restrict__ key, const InT* __restrict__ value,
                                      CacheT* __restrict__ key_cache,
                                      CacheT* __restrict__ value_cache, IndexPtr slot_mapping,
                                      int64_t num_slots, int64_t slot_stride, int64_t k_stride,
                                      int64_t v_stride) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_mapping[t];
  if (slot < 0 || slot >= num_slots) return;
  const InT* k = key + t * k_stride;  // key[t][:][:]
  const InT* v = value + t * v_stride;
  CacheT* kc = key_cache + slot * slot_stride;
  CacheT* vc = value_cache + slot * slot_stride;
  for (int64_t i = threadIdx.x; i < slot_stride; i += blockDim.x) {
    kc[i] = cuda_internal::FromFloat<CacheT>(cuda_internal::ToFloat(k[i]));
    vc[i] = cuda_internal::FromFloat<CacheT>(cuda_internal::ToFloat(v[i]));
  }
}

template <typename InT, typename CacheT>
void Launch(cudaStream_t stream, const TensorView& key, const TensorView& value,
            const TensorView& key_cache, const TensorView& value_cache,
            const TensorView& slot_mapping, int64_t num_slots, int64_t slot_stride) {
  const int threads = cuda_internal::RowThreads(slot_stride > 512 ? 512 : slot_stride);
  ::llm::cuda::Launch(
      ReshapeAndCacheKernel<InT, CacheT>, static_cast<unsigned>(slot_mapping.shape[0]), threads, 0,
      stream, key.data_as<const InT>(), value.data_as<const InT>(), key_cache.data_as<CacheT>(),
      value_cache.data_as<CacheT>(), cuda_internal::AsIndex(slot_mapping), num_slots, slot_stride,
      internal::TokenStride(key), internal::TokenStride(value));
}

}  // namespace

OpStatus ReshapeAndCache(void* stream, const TensorView& key, const TensorView& value,
                         const TensorView& key_cache, const TensorView& value_cache,
                         const TensorView& slot_mapping) {
  constexpr const char* kOp = "ReshapeAndCache";
  if (OpStatus st = cuda_internal::StartOp(kOp, key_cache.device); !st.ok()) return st;
  const int64_t num_tokens = slot_mapping.shape[0];
  const int64_t num_slots = key_cache.shape[0] * key_cache.shape[1];
  const int64_t slot_stride = key_cache.shape[2] * key_cache.shape[3];
  if (num_tokens == 0 || slot_stride == 0) return OpStatus::Ok();
  const cudaStream_t s = cuda_internal::AsStream(stream);
  // One instantiation per (key dtype, cache dtype): 3 x 3.
  bool known = false;
  cuda_internal::DispatchFloat(key.dtype, [&](auto in_tag) {
    using InT = decltype(in_tag);
    known = cuda_internal::DispatchFloat(key_cache.dtype, [&](auto cache_tag) {
      using CacheT = decltype(cache_tag);
      Launch<InT, CacheT>(s, key, value, key_cache, value_cache, slot_mapping, num_slots,
                          slot_stride);
    });
  });
  if (!known) return cuda_internal::Error(kOp, "key and key_cache: expected f32, f16 or bf16");
  LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  return OpStatus::Ok();
}

}  // namespace llm::ops::cuda
