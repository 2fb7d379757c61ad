// What every CUDA paged-attention kernel is told about the batch: the tensors and their sizes
// (kernels/ops.h's PagedAttention arguments as device pointers and ints) and the options'
// sliding window and softcap (the scale each launcher folds in its own way), filled by
// FillPagedAttentionParams. Each launcher's parameter struct derives from PagedAttentionParams
// and adds only what is its own: the query's row stride, at the width its kernels' code is tuned
// for (below), and the SIMT kernels' split-K workspace and scale (paged_attention.cu), the decode
// kernel's split and GQA grouping (paged_attention_decode.cu), the prefill kernel's tile list
// (paged_attention_prefill.cu). Kernels read the fields as p.num_heads whichever struct p is.
//
// Host-only header (no CUDA headers). Internal to kernels/cuda.
#ifndef LLM_KERNELS_CUDA_PAGED_ATTENTION_PARAMS_H_
#define LLM_KERNELS_CUDA_PAGED_ATTENTION_PARAMS_H_

#include <cstdint>

#include "kernels/op_check.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace llm::ops::cuda {

// Passed by value as a kernel parameter: plain data, no owning members. The ints are the
// int32 narrowings of sizes that the launchers check (or plan) to fit. The query's row stride is
// not here: each launcher adds it at the width its kernels' code is tuned for (the SIMT kernels
// take an int, at the end of a struct that stays within 128 bytes, past which ptxas allocates
// their registers differently and spills).
struct PagedAttentionParams {
  void* out;                       // [T, Hq, D], the query's dtype
  const void* query;               // [T, Hq, D], q[t][h][d] at t * q_stride + h * D + d (below)
  const void* key_cache;           // [num_blocks, block_size, Hkv, D]
  const void* value_cache;         // the same
  const int32_t* block_tables;     // [S, max_blocks]
  const int32_t* seq_lens;         // [S]
  const int32_t* query_start_loc;  // [S + 1]
  int num_seqs;                    // S
  int max_blocks;
  int num_heads;     // Hq
  int num_kv_heads;  // Hkv
  int block_size;
  int block_shift;  // log2(block_size) when a power of two, else -1 (the decode page lookup)
  // AttentionOptions::sliding_window W: the row at position p sees max(0, p - W + 1) .. p;
  // 0 = none (0 .. p).
  int sliding_window;
  float softcap;  // AttentionOptions::softcap; 0 = none
  int64_t num_blocks;
};

// The fields of *params from the op's arguments; the launcher's own fields are left as they
// are.
inline void FillPagedAttentionParams(const TensorView& out, const TensorView& query,
                                     const TensorView& key_cache, const TensorView& value_cache,
                                     const AttentionMetadata& metadata,
                                     const AttentionOptions& options,
                                     PagedAttentionParams* params) {
  params->out = out.data;
  params->query = query.data;
  params->key_cache = key_cache.data;
  params->value_cache = value_cache.data;
  params->block_tables = metadata.block_tables.data_as<const int32_t>();
  params->seq_lens = metadata.seq_lens.data_as<const int32_t>();
  params->query_start_loc = metadata.query_start_loc.data_as<const int32_t>();
  params->num_blocks = key_cache.shape[0];
  params->num_seqs = static_cast<int>(metadata.seq_lens.shape[0]);
  params->max_blocks = static_cast<int>(metadata.block_tables.shape[1]);
  params->num_heads = static_cast<int>(query.shape[1]);
  params->num_kv_heads = static_cast<int>(key_cache.shape[2]);
  params->block_size = static_cast<int>(key_cache.shape[1]);
  params->sliding_window = options.sliding_window;
  params->softcap = options.softcap;
  params->block_shift = -1;
  for (int b = 0; b < 31; ++b) {
    if ((int64_t{1} << b) == key_cache.shape[1]) params->block_shift = b;
  }
}

}  // namespace llm::ops::cuda

#endif  // LLM_KERNELS_CUDA_PAGED_ATTENTION_PARAMS_H_
