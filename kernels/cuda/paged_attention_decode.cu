// The 16-bit decode kernel: the rows of sequences with q_len == 1 (bf16 or f16 query, output
// and caches; fp32 accumulation), GQA-shared and split over the context (split-KV).
//
// Grid (S, Hkv x head_chunks, num_splits), kDecodeThreads = 128 threads: the CTA of
// (sequence s, KV head kvh, head chunk c, split z) serves the query heads
// kvh x G + c x kGroup .. + kGroup - 1 (G = Hq / Hkv query heads share KV head kvh; kGroup =
// min(G, kDecodeMaxGroup) rounded up to 1, 2, 4 or 8) over the positions
// base + z x split_keys .. min(ctx, base + (z + 1) x split_keys) - 1 (all of base .. ctx - 1
// with one split). base = 0 without a sliding window; with a window W, DecodeWindowStart
// (paged_attention_plan.h): the window's first position ctx - W rounded down to a multiple of
// 64 (the splits stay aligned); the first split then skips the warp tiles wholly before
// ctx - W and masks the one that straddles it, like the last, partial tile (the K and V of
// masked positions are not loaded). Soft-capping is a template parameter (kSoftcap): the
// kernels without a cap carry none of its code.
// Sequences with q_len != 1 exit at once (their rows are PrefillAttentionMma's).
//
// Inside the CTA a "key group" of kLanes = D / 8 lanes reads one key (or value) row with one
// 16-byte load per lane (LDG.E.128: 8 bf16 of dims lane x 8 .. + 7); a warp holds 32 / kLanes
// key groups, the CTA kKeyGroups = 128 / kLanes. The positions go in warp tiles of
// kKeys x (32 / kLanes) consecutive positions, warp w taking tiles w, w + 4, ...; key group g
// of the warp takes kKeys consecutive positions of it. Per tile, each lane
//   1. looks up the block table once for its kKeys positions (a power-of-two block size of at
//      least kKeys, so that they lie in one page; else once per position: a second copy of
//      the loop),
//   2. loads the kKeys K row slices and computes, for each of the kGroup query heads, its part
//      of q . k (8 FMAs per key and head; q pre-scaled by scale x log2(e)), summed over the key
//      group's lanes by xor shuffles: the log2-domain scores s[j][h] (with a softcap c:
//      c2 tanh(s / c2), c2 = c log2(e), the cap in the log2 domain),
//   3. updates its running max m[h] and sum l[h] (exp2: log2(e) is in the scale) and rescales
//      its output slice acc[h][8],
//   4. loads the kKeys V row slices and accumulates acc[h][:] += p[j][h] v[j][:].
// Every K and V byte is loaded once per CTA and used by all kGroup query heads. Each key
// group keeps its own (m, l, acc); at the end the key groups of a warp merge by shuffles and
// the warps through shared memory:  M = max_i m_i,  L = sum_i l_i 2^(m_i - M),
// O = sum_i acc_i 2^(m_i - M). One split: out = O / L, rounded to the 16-bit dtype. Several:
// (M, L, O) go to the workspace (paged_attention_plan.h) and DecodeReduceKernel, one CTA per
// (sequence, query head), merges the ceil(ctx / split_keys) splits the same way.
//
// Bad metadata gives NaN rows, never a read outside the tensors: a context <= 0, longer than
// the block table or than num_splits x split_keys (a max_seq_len below the truth), or a cache
// of no blocks: the whole row; a block id outside the cache: that key's score is NaN (its
// slot is not read). Positions at or past the context end are never read, so NaN in unused
// cache slots does not reach the output.
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/paged_attention_decode.h"
#include "kernels/cuda/paged_attention_params.h"
#include "kernels/op_check.h"

namespace llm::ops::cuda {
namespace {

constexpr int kThreads = kDecodeThreads;
constexpr int kWarps = kThreads / 32;
constexpr int kVec = 8;  // 16-bit elements per 16-byte load

using Pack16 = cuda_internal::Vec16;

// query, out and the caches are 16-bit; q_stride is a multiple of 8 (16-byte query loads).
struct DecodeParams : PagedAttentionParams {
  int64_t q_stride;  // elements between query rows
  float* part_out;   // num_splits > 1: [S, Hq, num_splits, D]
  float* part_ml;    // num_splits > 1: [S, Hq, num_splits, 2]
  int group;         // Hq / Hkv
  int head_chunks;   // ceil(group / kDecodeMaxGroup)
  int num_splits;
  int split_keys;  // num_splits > 1
  float scale_log2;
  float softcap_log2;  // softcap x log2(e); 0 = none
};

// The 8 values of a 16-byte load of bf16 or f16, as f32.
__device__ __forceinline__ float Lo(uint32_t w, __nv_bfloat16) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float Hi(uint32_t w, __nv_bfloat16) {
  return __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ float Lo(uint32_t w, __half) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
}
__device__ __forceinline__ float Hi(uint32_t w, __half) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
}
template <typename T>
__device__ __forceinline__ void Unpack(const Pack16& p, float (&f)[kVec]) {
  f[0] = Lo(p.x, T{});
  f[1] = Hi(p.x, T{});
  f[2] = Lo(p.y, T{});
  f[3] = Hi(p.y, T{});
  f[4] = Lo(p.z, T{});
  f[5] = Hi(p.z, T{});
  f[6] = Lo(p.w, T{});
  f[7] = Hi(p.w, T{});
}

// 2^x: one MUFU.EX2 on the device (ex2.approx.ftz: relative error 2^-22, results below 2^-126
// flushed to 0, which a softmax weight may lose); the host's exp2 under the emulation.
__device__ __forceinline__ float Exp2(float x) {
#ifdef LLM_CUDA_EMU
  return std::exp2(x);
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}

__device__ __forceinline__ Pack16 Load16(const void* p) {
  return __ldg(static_cast<const Pack16*>(p));
}

// The first position the CTAs of a context of ctx keys read: DecodeWindowStart
// (paged_attention_plan.h), 0 without a window.
__device__ __forceinline__ int64_t WindowBase(const DecodeParams& p, int64_t ctx) {
  return p.sliding_window > 0 && ctx > p.sliding_window
             ? (ctx - p.sliding_window) / kDecodeSplitAlign * kDecodeSplitAlign
             : 0;
}

// Whether sequence s's decode row is unusable (see the file comment); ctx = seq_lens[s].
__device__ __forceinline__ bool BadContext(const DecodeParams& p, int64_t ctx) {
  return ctx <= 0 || ctx > static_cast<int64_t>(p.max_blocks) * p.block_size ||
         (p.num_splits > 1 &&
          ctx - WindowBase(p, ctx) > static_cast<int64_t>(p.num_splits) * p.split_keys) ||
         p.num_blocks <= 0;
}

// The per-lane state of one key group: running max and sum per query head (log2 domain) and
// the unnormalized output dims lane x 8 .. + 7.
template <int kGroup>
struct State {
  float m[kGroup];
  float l[kGroup];
  float acc[kGroup][kVec];
};

// One tile of kKeys positions pos0 .. pos0 + kKeys - 1 of one key group (see the file
// comment). kMasked: positions before `begin` (the window's first) or at or past `end` are
// skipped (the first tiles of a windowed range, the last tile of a CTA's range); else all are
// in [begin, end).
// kSoftcap: the scores are soft-capped (p.softcap_log2 > 0), a template parameter so that the
// kernel without a cap carries none of its code.
template <typename T, int kHeadSize, int kGroup, int kKeys, bool kOnePage, bool kMasked,
          bool kSoftcap>
__device__ __forceinline__ void Tile(const DecodeParams& p, const int32_t* table, int64_t kv_base,
                                     int pos0, int begin, int end, const float (&q)[kGroup][kVec],
                                     State<kGroup>& st) {
  constexpr int kLanes = kHeadSize / kVec;
  const int64_t pos_stride = static_cast<int64_t>(p.num_kv_heads) * kHeadSize;  // one slot
  // 1. Where the kKeys K and V row slices are; a bad block id reads slot 0 and poisons the
  //    score.
  int64_t off[kKeys];
  bool bad[kKeys];
  if constexpr (kOnePage) {  // a power-of-two block size >= kKeys: the tile lies in one page
    const bool any = !kMasked || (pos0 < end && pos0 + kKeys > begin);
    const int32_t block = any ? __ldg(table + (pos0 >> p.block_shift)) : 0;
    const bool ok = block >= 0 && block < p.num_blocks;
    const int64_t first =
        ok ? ((static_cast<int64_t>(block) << p.block_shift) + (pos0 & (p.block_size - 1))) *
                     pos_stride +
                 kv_base
           : kv_base;
#pragma unroll
    for (int j = 0; j < kKeys; ++j) {
      off[j] = ok ? first + j * pos_stride : kv_base;
      bad[j] = !ok;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kKeys; ++j) {
      const int pos = pos0 + j;
      const bool live = !kMasked || (pos >= begin && pos < end);
      const int32_t block = live ? __ldg(table + pos / p.block_size) : 0;
      const bool ok = block >= 0 && block < p.num_blocks;
      off[j] = ok ? (static_cast<int64_t>(block) * p.block_size + pos % p.block_size) * pos_stride +
                        kv_base
                  : kv_base;
      bad[j] = !ok;
    }
  }
  const T* key_cache = static_cast<const T*>(p.key_cache);
  const T* value_cache = static_cast<const T*>(p.value_cache);
  // 2. Scores.
  float s[kKeys][kGroup];
#pragma unroll
  for (int j = 0; j < kKeys; ++j) {
    const bool live = !kMasked || (pos0 + j >= begin && pos0 + j < end);
    Pack16 raw{};
    if (live) raw = Load16(key_cache + off[j]);
    float k[kVec];
    Unpack<T>(raw, k);
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      float dot = q[h][0] * k[0];
#pragma unroll
      for (int d = 1; d < kVec; ++d) dot = fmaf(q[h][d], k[d], dot);
      s[j][h] = dot;
    }
  }
#pragma unroll
  for (int off_lane = kLanes / 2; off_lane > 0; off_lane >>= 1) {
#pragma unroll
    for (int j = 0; j < kKeys; ++j) {
#pragma unroll
      for (int h = 0; h < kGroup; ++h) s[j][h] += __shfl_xor_sync(0xffffffffu, s[j][h], off_lane);
    }
  }
  if constexpr (kSoftcap) {
#pragma unroll
    for (int j = 0; j < kKeys; ++j) {
#pragma unroll
      for (int h = 0; h < kGroup; ++h) {
        s[j][h] = p.softcap_log2 * tanhf(s[j][h] / p.softcap_log2);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kKeys; ++j) {
    const bool live = !kMasked || (pos0 + j >= begin && pos0 + j < end);
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      s[j][h] = !live ? -INFINITY : (bad[j] ? NAN : s[j][h]);
    }
  }
  // 3. Online softmax (exp2; a NaN score makes l and acc NaN).
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    float m_new = st.m[h];
#pragma unroll
    for (int j = 0; j < kKeys; ++j) m_new = fmaxf(m_new, s[j][h]);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // nothing seen yet: all 0
    const float corr = Exp2(st.m[h] - m_use);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kKeys; ++j) {
      s[j][h] = Exp2(s[j][h] - m_use);
      sum += s[j][h];
    }
    st.l[h] = st.l[h] * corr + sum;
    st.m[h] = m_new;
#pragma unroll
    for (int d = 0; d < kVec; ++d) st.acc[h][d] *= corr;
  }
  // 4. Values. A masked position's V is not read (0), and its p is 0.
#pragma unroll
  for (int j = 0; j < kKeys; ++j) {
    const bool live = !kMasked || (pos0 + j >= begin && pos0 + j < end);
    Pack16 raw{};
    if (live) raw = Load16(value_cache + off[j]);
    float v[kVec];
    Unpack<T>(raw, v);
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
#pragma unroll
      for (int d = 0; d < kVec; ++d) st.acc[h][d] = fmaf(s[j][h], v[d], st.acc[h][d]);
    }
  }
}

// m and l of two states merged into (m, l); returns the weights of each (0 for an empty one).
__device__ __forceinline__ void MergeWeights(float m_a, float m_b, float* m, float* w_a,
                                             float* w_b) {
  *m = fmaxf(m_a, m_b);
  const float m_use = *m == -INFINITY ? 0.0f : *m;
  *w_a = Exp2(m_a - m_use);
  *w_b = Exp2(m_b - m_use);
}

template <typename T, int kHeadSize, int kGroup, bool kSoftcap>
__global__ void __launch_bounds__(kThreads) DecodeAttentionKernel(DecodeParams p) {
  constexpr int kLanes = kHeadSize / kVec;           // lanes per key row
  constexpr int kGroupsPerWarp = 32 / kLanes;        // key groups per warp
  constexpr int kKeys = kGroup >= 8 ? 2 : 4;         // positions per key group per tile
  constexpr int kWarpTile = kKeys * kGroupsPerWarp;  // positions per warp per tile
  __shared__ float m_s[kWarps][kGroup], l_s[kWarps][kGroup];
  __shared__ float acc_s[kWarps][kGroup][kHeadSize];

  const int s = blockIdx.x;
  const int kvh = blockIdx.y / p.head_chunks, chunk = blockIdx.y % p.head_chunks;
  const int z = blockIdx.z;
  const int64_t t = p.query_start_loc[s];
  if (p.query_start_loc[s + 1] - t != 1) return;  // a prefill chunk (or no row)
  const int head0 = kvh * p.group + chunk * kDecodeMaxGroup;
  const int heads = min(kGroup, p.group - chunk * kDecodeMaxGroup);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int klane = lane % kLanes;  // this lane's dims: klane x 8 .. + 7
  const int64_t ctx = p.seq_lens[s];
  T* out = static_cast<T*>(p.out) + (t * p.num_heads + head0) * kHeadSize;  // out[t][head0]
  if (BadContext(p, ctx)) {
    if (p.num_splits == 1) {  // else the reduction writes the NaN row
      for (int e = tid; e < heads * kHeadSize; e += kThreads) {
        out[e] = cuda_internal::FromFloat<T>(NAN);
      }
    }
    return;
  }
  const int64_t base = WindowBase(p, ctx);  // 0 without a window
  const int begin = static_cast<int>(p.sliding_window > 0 && ctx > p.sliding_window
                                         ? ctx - p.sliding_window
                                         : 0);  // the window's first position
  const int start = static_cast<int>(base) + (p.num_splits > 1 ? z * p.split_keys : 0);
  const int end = p.num_splits > 1
                      ? static_cast<int>(min(ctx, static_cast<int64_t>(start) + p.split_keys))
                      : static_cast<int>(ctx);
  if (start >= end) return;  // past this sequence's context; the reduction skips it

  // This lane's query slices, pre-scaled into the log2 domain; heads past `heads` are 0.
  float q[kGroup][kVec];
  const T* query = static_cast<const T*>(p.query) + t * p.q_stride + head0 * kHeadSize;
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    Pack16 raw{};
    if (h < heads) raw = Load16(query + h * kHeadSize + klane * kVec);
    Unpack<T>(raw, q[h]);
#pragma unroll
    for (int d = 0; d < kVec; ++d) q[h][d] *= p.scale_log2;
  }
  State<kGroup> st;
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    st.m[h] = -INFINITY;
    st.l[h] = 0.0f;
#pragma unroll
    for (int d = 0; d < kVec; ++d) st.acc[h][d] = 0.0f;
  }
  const int32_t* table = p.block_tables + static_cast<int64_t>(s) * p.max_blocks;
  const int64_t kv_base = static_cast<int64_t>(kvh) * kHeadSize + klane * kVec;
  const int sub = (lane / kLanes) * kKeys;  // this key group's first position in a warp tile
  // With a window, the warp tiles wholly before its first position `begin` are skipped (fewer
  // than 64 positions, in the first split only); the first tile left may still start before it
  // and is then masked, like the last, partial one.
  const int first = start + min(max(begin - start, 0), end - start) / kWarpTile * kWarpTile;
  const int len = end - first;
  const int full = len / kWarpTile;                     // warp tiles with every position < end
  const int tiles = (len + kWarpTile - 1) / kWarpTile;  // ... and the last, partial one
  const bool masked_first = begin > first;              // tile 0 (warp 0's), partly before it
  // Two copies of the loop, so that the hot one has only its own page lookup; each warp takes
  // its tiles in order: the masked first one, the full ones, the partial last one.
  if (p.block_shift >= 0 && p.block_size >= kKeys) {
    int tile = warp;
    if (masked_first && tile == 0) {
      Tile<T, kHeadSize, kGroup, kKeys, true, true, kSoftcap>(p, table, kv_base, first + sub, begin,
                                                              end, q, st);
      tile += kWarps;
    }
    for (; tile < full; tile += kWarps) {
      Tile<T, kHeadSize, kGroup, kKeys, true, false, kSoftcap>(
          p, table, kv_base, first + tile * kWarpTile + sub, begin, end, q, st);
    }
    if (tile < tiles) {  // the last, partial warp tile: one warp
      Tile<T, kHeadSize, kGroup, kKeys, true, true, kSoftcap>(
          p, table, kv_base, first + tile * kWarpTile + sub, begin, end, q, st);
    }
  } else {
    int tile = warp;
    if (masked_first && tile == 0) {
      Tile<T, kHeadSize, kGroup, kKeys, false, true, kSoftcap>(p, table, kv_base, first + sub,
                                                               begin, end, q, st);
      tile += kWarps;
    }
    for (; tile < full; tile += kWarps) {
      Tile<T, kHeadSize, kGroup, kKeys, false, false, kSoftcap>(
          p, table, kv_base, first + tile * kWarpTile + sub, begin, end, q, st);
    }
    if (tile < tiles) {
      Tile<T, kHeadSize, kGroup, kKeys, false, true, kSoftcap>(
          p, table, kv_base, first + tile * kWarpTile + sub, begin, end, q, st);
    }
  }

  // Merge the key groups of the warp (xor over the lanes above kLanes), then the warps.
#pragma unroll
  for (int x = kLanes; x < 32; x <<= 1) {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      const float m_o = __shfl_xor_sync(0xffffffffu, st.m[h], x);
      const float l_o = __shfl_xor_sync(0xffffffffu, st.l[h], x);
      float m, w, w_o;
      MergeWeights(st.m[h], m_o, &m, &w, &w_o);
      st.m[h] = m;
      st.l[h] = st.l[h] * w + l_o * w_o;
#pragma unroll
      for (int d = 0; d < kVec; ++d) {
        st.acc[h][d] = st.acc[h][d] * w + __shfl_xor_sync(0xffffffffu, st.acc[h][d], x) * w_o;
      }
    }
  }
  if (lane < kLanes) {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
#pragma unroll
      for (int d = 0; d < kVec; ++d) acc_s[warp][h][klane * kVec + d] = st.acc[h][d];
      if (lane == 0) {
        m_s[warp][h] = st.m[h];
        l_s[warp][h] = st.l[h];
      }
    }
  }
  __syncthreads();
  for (int e = tid; e < heads * kHeadSize; e += kThreads) {
    const int h = e / kHeadSize, d = e % kHeadSize;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, m_s[w][h]);
    const float m_use = m == -INFINITY ? 0.0f : m;
    float l = 0.0f, o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float c = Exp2(m_s[w][h] - m_use);
      l += l_s[w][h] * c;
      o += acc_s[w][h][d] * c;
    }
    if (p.num_splits == 1) {
      out[e] = cuda_internal::FromFloat<T>(o / l);
    } else {
      const int64_t part = (static_cast<int64_t>(s) * p.num_heads + head0 + h) * p.num_splits + z;
      p.part_out[part * kHeadSize + d] = o;
      if (d == 0) {
        p.part_ml[2 * part] = m;
        p.part_ml[2 * part + 1] = l;
      }
    }
  }
}

// Grid (S, Hq), kThreads threads (>= kHeadSize): merges the splits of each decode row.
template <typename T, int kHeadSize>
__global__ void __launch_bounds__(kThreads) DecodeReduceKernel(DecodeParams p) {
  const int s = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  if (d >= kHeadSize) return;
  const int64_t t = p.query_start_loc[s];
  if (p.query_start_loc[s + 1] - t != 1) return;
  T* out = static_cast<T*>(p.out) + (t * p.num_heads + h) * kHeadSize;
  const int64_t ctx = p.seq_lens[s];
  if (BadContext(p, ctx)) {
    out[d] = cuda_internal::FromFloat<T>(NAN);
    return;
  }
  const int n = static_cast<int>((ctx - WindowBase(p, ctx) + p.split_keys - 1) / p.split_keys);
  const int64_t base = (static_cast<int64_t>(s) * p.num_heads + h) * p.num_splits;
  float m = -INFINITY;
  for (int z = 0; z < n; ++z) m = fmaxf(m, p.part_ml[2 * (base + z)]);
  const float m_use = m == -INFINITY ? 0.0f : m;
  float l = 0.0f, o = 0.0f;
  for (int z = 0; z < n; ++z) {
    const float c = Exp2(p.part_ml[2 * (base + z)] - m_use);
    l += p.part_ml[2 * (base + z) + 1] * c;
    o += p.part_out[(base + z) * kHeadSize + d] * c;
  }
  out[d] = cuda_internal::FromFloat<T>(o / l);
}

template <typename T, int kHeadSize, int kGroup>
OpStatus LaunchDecode(cudaStream_t stream, const DecodeParams& params, const DecodePlan& plan) {
  constexpr const char* kOp = "PagedAttention";
  const dim3 grid(static_cast<unsigned>(params.num_seqs),
                  static_cast<unsigned>(params.num_kv_heads * params.head_chunks),
                  static_cast<unsigned>(plan.num_splits));
  if (params.softcap_log2 > 0.0f) {
    ::llm::cuda::Launch(DecodeAttentionKernel<T, kHeadSize, kGroup, true>, grid, kThreads, 0,
                        stream, params);
  } else {
    ::llm::cuda::Launch(DecodeAttentionKernel<T, kHeadSize, kGroup, false>, grid, kThreads, 0,
                        stream, params);
  }
  LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  if (plan.num_splits > 1) {
    const dim3 reduce_grid(static_cast<unsigned>(params.num_seqs),
                           static_cast<unsigned>(params.num_heads));
    ::llm::cuda::Launch(DecodeReduceKernel<T, kHeadSize>, reduce_grid, kThreads, 0, stream, params);
    LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  }
  return OpStatus::Ok();
}

template <typename T, int kHeadSize>
OpStatus LaunchForGroup(cudaStream_t stream, const DecodeParams& params, const DecodePlan& plan) {
  switch (plan.heads_per_cta) {
    case 1:
      return LaunchDecode<T, kHeadSize, 1>(stream, params, plan);
    case 2:
      return LaunchDecode<T, kHeadSize, 2>(stream, params, plan);
    case 3:
    case 4:
      return LaunchDecode<T, kHeadSize, 4>(stream, params, plan);
    default:
      return LaunchDecode<T, kHeadSize, 8>(stream, params, plan);
  }
}

template <typename T>
OpStatus LaunchForHeadSize(cudaStream_t stream, const DecodeParams& params, int64_t head_size,
                           const DecodePlan& plan) {
  if (head_size == 64) return LaunchForGroup<T, 64>(stream, params, plan);
  return LaunchForGroup<T, 128>(stream, params, plan);
}

}  // namespace

OpStatus DecodeAttention(const OpContext& ctx, const TensorView& out, const TensorView& query,
                         const TensorView& key_cache, const TensorView& value_cache,
                         const AttentionMetadata& metadata, const AttentionOptions& options,
                         const DecodePlan& plan) {
  constexpr const char* kOp = "PagedAttention";
  if (!plan.launch) return OpStatus::Ok();
  const int64_t head_size = query.shape[2];
  if (plan.num_splits > 1 &&
      (ctx.workspace == nullptr || ctx.workspace_bytes < plan.workspace_bytes)) {
    return cuda_internal::Error(
        kOp, "the decode plan needs " + std::to_string(plan.workspace_bytes) +
                 " bytes of workspace, got " + std::to_string(ctx.workspace_bytes));
  }
  DecodeParams params{};
  FillPagedAttentionParams(out, query, key_cache, value_cache, metadata, options, &params);
  params.q_stride = internal::TokenStride(query);
  params.group = static_cast<int>(plan.group);
  params.head_chunks = static_cast<int>(plan.head_chunks);
  params.num_splits = static_cast<int>(plan.num_splits);
  params.split_keys = static_cast<int>(plan.split_keys);
  params.scale_log2 = options.scale * 1.4426950408889634f;  // log2(e)
  params.softcap_log2 = options.softcap * 1.4426950408889634f;
  if (plan.num_splits > 1) {
    const int64_t parts = metadata.seq_lens.shape[0] * query.shape[1] * plan.num_splits;
    params.part_out = static_cast<float*>(ctx.workspace);
    params.part_ml = params.part_out + parts * head_size;
  }
  const cudaStream_t stream = cuda_internal::AsStream(ctx.stream);
  if (query.dtype == DType::kBF16) {
    return LaunchForHeadSize<__nv_bfloat16>(stream, params, head_size, plan);
  }
  return LaunchForHeadSize<__half>(stream, params, head_size, plan);
}

}  // namespace llm::ops::cuda
