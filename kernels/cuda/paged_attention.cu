// Paged attention on CUDA for a batch that mixes prefill chunks and decode tokens: the
// dispatcher (PagedAttention, at the end) and the fp32 path's kernels.
//
// 16-bit path (query, out and both caches bf16, or all f16): the rows of sequences with
// q_len == 1 go to the GQA-shared split-KV decode kernel (paged_attention_decode.cu, planned by
// PlanDecode), the rows of sequences with q_len > 1 to the tensor-core prefill
// (PrefillAttentionMma, paged_attention_prefill.cu), launched only when the batch has such rows
// (with query_start_loc_host absent: whenever T > S).
//
// fp32 path (f32 query and out; f32, f16 or bf16 caches): the kernels below.
//
// Query row t belongs to sequence s with query_start_loc[s] <= t < query_start_loc[s + 1], is
// its j-th query token, sits at position p = seq_lens[s] - q_len + j and attends to the
// ctx = p + 1 keys at positions first .. p: first = 0, or max(0, ctx - W) with a sliding window
// W (the options', in PagedAttentionParams). Every kernel starts at its (first) row's `first`,
// so the blocks before a window are not read. A softcap c > 0 caps each scaled score,
// c tanh(s / c), before the max and exp.
//
// The row kernels (v1, v2) take any row, each on its own (binary search of query_start_loc
// for its sequence): with kV1 / kV2 they take every row, prefill chunks included (each row
// then reads its causal prefix of the cache on its own). With kAuto they take the rows of
// sequences with q_len == 1 (decode) and PrefillAttentionKernel (below) the rows of sequences
// with q_len > 1, in tiles of 16 rows that share each K and V load; each skips the other's
// rows. The host launches only the kernels the batch has rows for when the caller passes the
// q_lens (metadata.query_start_loc_host), else both (paged_attention_plan.h).
//
// v1: one thread block per (row t, query head h) over positions first .. ctx - 1.
// v2 (split-K): one thread block per (row, head, partition z) over positions
//     first + z * kPartitionSize .. min(ctx, first + (z + 1) * kPartitionSize) - 1, writing its
//     running max,
//     sum and unnormalized output; then a reduction kernel per (row, head) rescales and sums
//     the partitions:  M = max_z m_z,  L = sum_z l_z e^(m_z - M),
//     out[t][h][d] = sum_z acc_z[d] e^(m_z - M) / L.
//
// Inside a thread block (kThreads = 128, 4 warps) the positions go in chunks of kChunk = 512:
//   1. scores: warp w takes positions w, w + 4, ...; lane l holds q[l + 32 i] (pre-scaled)
//      and reads key_cache[block][slot][kvh][l + 32 i] (coalesced), then a warp sum:
//        logits[i] = scale * q[t][h][:] . key_cache[table[pos / bs]][pos % bs][kvh][:]
//   2. chunk max (block reduction), m_new = max(m, chunk max), c = e^(m - m_new),
//      logits[i] = e^(logits[i] - m_new), l = l c + sum_i logits[i]
//   3. values: warp w again takes positions w, w + 4, ...; lane l accumulates dims l + 32 i:
//        acc[d] = acc[d] c + sum_i logits[i] value_cache[table[pos / bs]][pos % bs][kvh][d]
// and at the end the 4 warps' acc are summed through shared memory.
//
// The query and the output are f32, f16 or bf16 (QT; a 16-bit query takes a cache of its own
// dtype), the caches f32, f16 or bf16 (converted to f32 as they are read); scores, softmax and
// sums are f32 and the output is rounded to QT once. Head sizes 16, 32, 64 and 128: below 32
// lanes l >= kHeadSize of each warp hold no dim and add 0 to every warp sum. Bad metadata (a block
// id outside the cache, a context longer than the block table or than max_seq_len's partitions,
// q_len > seq_len) gives NaN rows; nothing outside the tensors is read. The query may be
// token-strided (kernels/ops.h): row t's heads start at query + t * q_stride, in every path.
#include <cmath>
#include <string>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/paged_attention_decode.h"
#include "kernels/cuda/paged_attention_params.h"
#include "kernels/cuda/paged_attention_prefill.h"
#include "kernels/cuda/paged_attention_simt.h"
#include "kernels/op_check.h"

namespace llm::ops::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = kPartitionSize;

// query and out are QT, the caches f32, f16 or bf16. At most 128 bytes, q_stride an int
// (paged_attention_params.h says why).
struct Params : PagedAttentionParams {
  float* tmp_out;      // v2: [T, Hq, max_partitions, D]
  float* ml;           // v2: [T, Hq, max_partitions, 2]: running max, then sum
  int max_partitions;  // v2
  bool prefill_tiled;  // rows of sequences with q_len > 1 are the tiled prefill kernel's
  float scale;
  int q_stride;  // elements between query rows (token-strided: >= Hq * D)
};
static_assert(sizeof(Params) <= 128, "paged_attention_params.h: the SIMT kernels' 128 bytes");

// The first position a row with ctx keys sees (the window's first, or 0).
__device__ __forceinline__ int FirstKey(const Params& p, int ctx) {
  return p.sliding_window > 0 ? max(0, ctx - p.sliding_window) : 0;
}

// A score (scale applied) after the softcap, when there is one.
__device__ __forceinline__ float SoftCap(const Params& p, float s) {
  return p.softcap > 0.0f ? p.softcap * tanhf(s / p.softcap) : s;
}

// Where query row t reads from: its sequence and its number of keys; ctx = -1 when the
// metadata cannot hold (then the row's output is NaN).
struct Row {
  int seq;
  int ctx;
  bool multi;  // the sequence has more than one query row this step (a prefill chunk)
};

__device__ __forceinline__ Row FindRow(const Params& p, int64_t t) {
  const int32_t* qsl = p.query_start_loc;
  int lo = 0, hi = p.num_seqs - 1;  // the last s with qsl[s] <= t
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (qsl[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int64_t begin = qsl[lo], end = qsl[lo + 1];
  if (t < begin || t >= end) return {lo, -1, false};
  const int64_t q_len = end - begin;
  const bool multi = q_len > 1;
  const int64_t ctx = p.seq_lens[lo] - q_len + (t - begin) + 1;
  if (ctx <= 0 || ctx > INT32_MAX || ctx > static_cast<int64_t>(p.max_blocks) * p.block_size) {
    return {lo, -1, multi};
  }
  return {lo, static_cast<int>(ctx), multi};
}

// The cache offset of (pos, kvh) for sequence table `table`, or -1 when the block id is bad.
template <int kHeadSize>
__device__ __forceinline__ int64_t CacheOffset(const Params& p, const int32_t* table, int pos,
                                               int kvh) {
  const int32_t block = table[pos / p.block_size];
  if (block < 0 || block >= p.num_blocks) return -1;
  // cache[block][pos % bs][kvh][0]
  return ((static_cast<int64_t>(block) * p.block_size + pos % p.block_size) * p.num_kv_heads +
          kvh) *
         kHeadSize;
}

// Lane l of a warp holds dims l + 32 i, i < kPerLane; below 32 only lanes l < kHeadSize hold
// one (the others hold 0 and idle, but take part in every shuffle).
template <int kHeadSize>
constexpr int kPerLaneFor = kHeadSize < 32 ? 1 : kHeadSize / 32;

// kPartitioned = false: v1, grid (T, Hq, 1). true: v2, grid (T, Hq, max_partitions).
template <typename QT, typename CacheT, int kHeadSize, bool kPartitioned>
__global__ void __launch_bounds__(kThreads) PagedAttentionKernel(Params p) {
  static_assert(kHeadSize == 16 || kHeadSize == 32 || kHeadSize == 64 || kHeadSize == 128);
  constexpr int kPerLane = kPerLaneFor<kHeadSize>;
  QT* const out = static_cast<QT*>(p.out);
  const CacheT* key_cache = static_cast<const CacheT*>(p.key_cache);
  const CacheT* value_cache = static_cast<const CacheT*>(p.value_cache);
  __shared__ float logits[kChunk];
  __shared__ float scratch[32];
  __shared__ float warp_acc[kWarps][kHeadSize];

  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const bool lane_on = kHeadSize >= 32 || lane < kHeadSize;  // lane holds dims
  const Row row = FindRow(p, t);
  if (p.prefill_tiled && row.multi) return;      // PrefillAttentionKernel's row
  const int64_t head_row = t * p.num_heads + h;  // index of (t, h)

  int start = FirstKey(p, row.ctx), end = row.ctx;
  if constexpr (kPartitioned) {
    const int z = blockIdx.z;
    const int64_t part = head_row * p.max_partitions + z;  // index of (t, h, z)
    if (row.ctx < 0) return;                               // the reduction writes NaN
    start += z * kChunk;
    end =
        static_cast<int>(min(static_cast<int64_t>(row.ctx), static_cast<int64_t>(start) + kChunk));
    if (start >= end) {  // past this row's context: an empty partition
      if (threadIdx.x == 0) {
        p.ml[2 * part] = -INFINITY;
        p.ml[2 * part + 1] = 0.0f;
      }
      if (threadIdx.x < kHeadSize) p.tmp_out[part * kHeadSize + threadIdx.x] = 0.0f;
      return;
    }
  } else if (row.ctx < 0) {
    if (threadIdx.x < kHeadSize) {
      out[head_row * kHeadSize + threadIdx.x] = cuda_internal::FromFloat<QT>(NAN);
    }
    return;
  }

  const int kvh = h / (p.num_heads / p.num_kv_heads);
  const int32_t* table = p.block_tables + static_cast<int64_t>(row.seq) * p.max_blocks;
  const QT* q_ptr = static_cast<const QT*>(p.query) + t * p.q_stride + h * kHeadSize;  // q[t][h]
  float q[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    q[i] = lane_on ? cuda_internal::ToFloat(q_ptr[lane + 32 * i]) * p.scale : 0.0f;
  }

  float m = -INFINITY, l = 0.0f;  // running max and sum, the same in every thread
  float acc[kPerLane];            // this warp's output dims lane + 32 i
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0.0f;

  for (int chunk = start; chunk < end; chunk += kChunk) {
    const int n = min(kChunk, end - chunk);
    // 1. scores
    for (int i = warp; i < n; i += kWarps) {
      const int64_t off = CacheOffset<kHeadSize>(p, table, chunk + i, kvh);
      float dot = 0.0f;
      if (off >= 0 && lane_on) {
        const CacheT* k = key_cache + off;
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) dot += q[j] * cuda_internal::ToFloat(k[lane + 32 * j]);
      }
      dot = cuda_internal::WarpSum(dot);
      if (lane == 0) logits[i] = off >= 0 ? SoftCap(p, dot) : NAN;
    }
    __syncthreads();
    // 2. softmax of the chunk against the running max
    float local_max = -INFINITY;
    for (int i = threadIdx.x; i < n; i += kThreads) local_max = fmaxf(local_max, logits[i]);
    const float m_new = fmaxf(m, cuda_internal::BlockMax(local_max, scratch));
    const float correction = expf(m - m_new);  // 0 on the first chunk (m = -inf)
    float local_sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const float e = expf(logits[i] - m_new);  // NaN stays NaN
      logits[i] = e;
      local_sum += e;
    }
    l = l * correction + cuda_internal::BlockSum(local_sum, scratch);  // syncs logits too
    m = m_new;
    // 3. values
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) acc[j] *= correction;
    for (int i = warp; i < n; i += kWarps) {
      const int64_t off = CacheOffset<kHeadSize>(p, table, chunk + i, kvh);
      const float e = logits[i];
      if (off < 0) {
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) acc[j] = NAN;
      } else if (lane_on) {
        const CacheT* v = value_cache + off;
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) acc[j] += e * cuda_internal::ToFloat(v[lane + 32 * j]);
      }
    }
    __syncthreads();  // logits is rewritten by the next chunk
  }

  // Sum the warps' partial outputs.
  if (lane_on) {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) warp_acc[warp][lane + 32 * j] = acc[j];
  }
  __syncthreads();
  if (threadIdx.x >= kHeadSize) return;
  const int d = threadIdx.x;
  float sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) sum += warp_acc[w][d];
  if constexpr (kPartitioned) {
    const int64_t part = head_row * p.max_partitions + blockIdx.z;
    p.tmp_out[part * kHeadSize + d] = sum;  // tmp_out[t][h][z][d], unnormalized
    if (d == 0) {
      p.ml[2 * part] = m;
      p.ml[2 * part + 1] = l;
    }
  } else {
    out[head_row * kHeadSize + d] = cuda_internal::FromFloat<QT>(sum / l);  // out[t][h][d]
  }
}

// v2's reduction, grid (T, Hq), kThreads threads (>= kHeadSize): combines the row's
// ceil((ctx - first) / kChunk) partitions.
template <typename QT, int kHeadSize>
__global__ void __launch_bounds__(kThreads) PagedAttentionReduceKernel(Params p) {
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const int d = threadIdx.x;
  if (d >= kHeadSize) return;
  const int64_t head_row = t * p.num_heads + h;
  QT* o = static_cast<QT*>(p.out) + head_row * kHeadSize;  // out[t][h][:]
  const Row row = FindRow(p, t);
  if (p.prefill_tiled && row.multi) return;  // PrefillAttentionKernel's row
  const int num_parts = row.ctx < 0 ? -1 : (row.ctx - FirstKey(p, row.ctx) + kChunk - 1) / kChunk;
  if (num_parts <= 0 || num_parts > p.max_partitions) {
    o[d] = cuda_internal::FromFloat<QT>(NAN);
    return;
  }
  const int64_t base = head_row * p.max_partitions;  // (t, h, 0)
  float max_all = -INFINITY;
  for (int z = 0; z < num_parts; ++z) max_all = fmaxf(max_all, p.ml[2 * (base + z)]);
  float sum = 0.0f, acc = 0.0f;
  for (int z = 0; z < num_parts; ++z) {
    const float w = expf(p.ml[2 * (base + z)] - max_all);
    sum += p.ml[2 * (base + z) + 1] * w;
    acc += p.tmp_out[(base + z) * kHeadSize + d] * w;
  }
  o[d] = cuda_internal::FromFloat<QT>(acc / sum);
}

// The tiled prefill kernel (kAuto): the rows of sequences with q_len > 1, one thread block per
// (tile of kTileQ consecutive query rows of one sequence, query head), grid (tiles, Hq):
// sum_s ceil(q_len_s / kTileQ) over q_len > 1 when the host knows the q_lens, else
// ceil(T / kTileQ) + S, enough for any split of the T rows into sequences (surplus blocks exit).
// Flash-attention style: the tile's queries stay in shared memory while K and V come through the
// block table kTileK positions at a time (from the window's first position of row 0), with an
// online softmax per row and the causal mask key position <= p_r = seq_len - q_len + j0 + r
// (and with a window W, > p_r - W):
//   s[r][c] = cap(scale q[t0 + r][h][:] . K[k0 + c][kvh][:])   (-inf where masked)
//   m'[r] = max(m[r], max_c s[r][c]);  P[r][c] = e^(s[r][c] - m'[r]);
//   l[r] = l[r] e^(m[r] - m'[r]) + sum_c P[r][c];  O[r][:] = O[r][:] e^(m[r] - m'[r]) + P[r] V
// and out[t0 + r][h][:] = O[r][:] / l[r]. Each K and V is read once per kTileQ rows instead of
// once per row.
constexpr int kTileQ = kPrefillTileRows, kTileK = 32;

template <typename QT, typename CacheT, int kHeadSize>
__global__ void __launch_bounds__(kThreads) PrefillAttentionKernel(Params p) {
  constexpr int kOutPerThread = kTileQ * kHeadSize / kThreads;  // O[r][d], e = tid + i kThreads
  static_assert(kOutPerThread * kThreads == kTileQ * kHeadSize);
  __shared__ float q_s[kTileQ][kHeadSize];
  __shared__ float k_s[kTileK][kHeadSize + 1];  // +1: the score loop reads k_s[c][d], c = lane
  __shared__ float v_s[kTileK][kHeadSize];
  __shared__ float s_s[kTileQ][kTileK + 1];
  __shared__ float m_s[kTileQ], l_s[kTileQ], corr_s[kTileQ];
  const CacheT* key_cache = static_cast<const CacheT*>(p.key_cache);
  const CacheT* value_cache = static_cast<const CacheT*>(p.value_cache);

  // This block's tile: the blockIdx.x-th over the sequences with q_len > 1, in order.
  int tile = blockIdx.x, seq = -1, q_len = 0;
  int64_t begin = 0;
  for (int s = 0; s < p.num_seqs; ++s) {
    const int64_t b = p.query_start_loc[s], n = p.query_start_loc[s + 1] - b;
    if (n <= 1) continue;  // decode rows (and bad lengths) are the row kernel's
    const int64_t tiles = (n + kTileQ - 1) / kTileQ;
    if (tile < tiles) {
      seq = s;
      begin = b;
      q_len = static_cast<int>(n);
      break;
    }
    tile -= static_cast<int>(tiles);
  }
  if (seq < 0) return;
  const int h = blockIdx.y;
  const int j0 = tile * kTileQ;
  const int rows = min(kTileQ, q_len - j0);
  const int64_t first_pos = static_cast<int64_t>(p.seq_lens[seq]) - q_len + j0;  // p of row 0
  const int64_t last_pos = first_pos + rows - 1;
  QT* out = static_cast<QT*>(p.out) + ((begin + j0) * p.num_heads + h) * kHeadSize;  // out[t0]
  const int64_t out_row = static_cast<int64_t>(p.num_heads) * kHeadSize;
  if (first_pos < 0 || last_pos >= INT32_MAX ||
      last_pos >= static_cast<int64_t>(p.max_blocks) * p.block_size) {
    for (int e = threadIdx.x; e < rows * kHeadSize; e += kThreads) {
      out[(e / kHeadSize) * out_row + e % kHeadSize] = cuda_internal::FromFloat<QT>(NAN);
    }
    return;
  }
  const int kvh = h / (p.num_heads / p.num_kv_heads);
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks;
  const QT* q = static_cast<const QT*>(p.query) + (begin + j0) * p.q_stride + h * kHeadSize;
  for (int e = threadIdx.x; e < kTileQ * kHeadSize; e += kThreads) {
    const int r = e / kHeadSize, d = e % kHeadSize;
    q_s[r][d] = r < rows
                    ? cuda_internal::ToFloat(q[static_cast<int64_t>(r) * p.q_stride + d]) * p.scale
                    : 0.0f;
  }
  if (threadIdx.x < kTileQ) {
    m_s[threadIdx.x] = -INFINITY;
    l_s[threadIdx.x] = 0.0f;
  }
  float o[kOutPerThread];
#pragma unroll
  for (int i = 0; i < kOutPerThread; ++i) o[i] = 0.0f;

  const int window = p.sliding_window;
  const int64_t first_key = window > 0 ? max(static_cast<int64_t>(0), first_pos - window + 1) : 0;
  for (int64_t k0 = first_key; k0 <= last_pos; k0 += kTileK) {
    __syncthreads();  // the previous tile's reads of k_s, v_s, s_s and corr_s are done
    for (int e = threadIdx.x; e < kTileK * kHeadSize; e += kThreads) {
      const int c = e / kHeadSize, d = e % kHeadSize;
      const int64_t pos = k0 + c;
      float kv = 0.0f, vv = 0.0f;
      if (pos <= last_pos) {
        const int64_t off = CacheOffset<kHeadSize>(p, table, static_cast<int>(pos), kvh);
        kv = off >= 0 ? cuda_internal::ToFloat(key_cache[off + d]) : NAN;
        vv = off >= 0 ? cuda_internal::ToFloat(value_cache[off + d]) : NAN;
      }
      k_s[c][d] = kv;
      v_s[c][d] = vv;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < kTileQ * kTileK; e += kThreads) {
      const int r = e / kTileK, c = e % kTileK;
      float score = -INFINITY;
      if (r < rows && k0 + c <= first_pos + r &&
          (window == 0 || first_pos + r - (k0 + c) < window)) {
        score = 0.0f;
#pragma unroll 8
        for (int d = 0; d < kHeadSize; ++d) score += q_s[r][d] * k_s[c][d];
        score = SoftCap(p, score);
      }
      s_s[r][c] = score;
    }
    __syncthreads();
    if (threadIdx.x < kTileQ) {
      const int r = threadIdx.x;
      float m_new = m_s[r];
      for (int c = 0; c < kTileK; ++c) m_new = fmaxf(m_new, s_s[r][c]);
      // A row with no key yet (padding rows r >= rows, and rows whose window starts past this
      // tile) keeps m = -inf and P = 0.
      const bool none = m_new == -INFINITY;
      const float corr = none ? 1.0f : expf(m_s[r] - m_new);  // 0 on the first tile
      float sum = 0.0f;
      for (int c = 0; c < kTileK; ++c) {
        const float e = none ? 0.0f : expf(s_s[r][c] - m_new);  // masked: e^-inf = 0
        s_s[r][c] = e;
        sum += e;
      }
      l_s[r] = l_s[r] * corr + sum;
      m_s[r] = m_new;
      corr_s[r] = corr;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kOutPerThread; ++i) {
      const int e = threadIdx.x + i * kThreads;
      const int r = e / kHeadSize, d = e % kHeadSize;
      // Row r sees columns first_c <= c <= last_c only. A masked column's P is 0, but its V (a
      // slot this row must not read: unwritten, poisoned, a later token's) may be NaN and
      // 0 x NaN = NaN, so masked columns are selected away, never multiplied.
      const int64_t last_c = first_pos + r - k0;
      const int64_t first_c = window > 0 ? last_c - window + 1 : INT64_MIN;
      float acc = o[i] * corr_s[r];
#pragma unroll 8
      for (int c = 0; c < kTileK; ++c) {
        acc += c <= last_c && c >= first_c ? s_s[r][c] * v_s[c][d] : 0.0f;
      }
      o[i] = acc;
    }
  }
#pragma unroll
  for (int i = 0; i < kOutPerThread; ++i) {
    const int e = threadIdx.x + i * kThreads;
    const int r = e / kHeadSize, d = e % kHeadSize;
    if (r < rows) out[r * out_row + d] = cuda_internal::FromFloat<QT>(o[i] / l_s[r]);
  }
}

template <typename QT, typename CacheT, int kHeadSize>
OpStatus Launch(cudaStream_t stream, const Params& params, int64_t num_tokens,
                const PagedAttentionPlan& plan) {
  constexpr const char* kOp = "PagedAttention";
  const bool v2 = plan.v2;
  const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>(params.num_heads),
                  v2 ? static_cast<unsigned>(params.max_partitions) : 1u);
  if (!plan.rows) {
    // No decode rows (kAuto, q_lens known): nothing for the row kernels.
  } else if (!v2) {
    ::llm::cuda::Launch(PagedAttentionKernel<QT, CacheT, kHeadSize, false>, grid, kThreads, 0,
                        stream, params);
    LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  } else {
    ::llm::cuda::Launch(PagedAttentionKernel<QT, CacheT, kHeadSize, true>, grid, kThreads, 0,
                        stream, params);
    LLM_CUDA_OP_CHECK_LAUNCH(kOp);
    const dim3 reduce_grid(grid.x, grid.y);
    ::llm::cuda::Launch(PagedAttentionReduceKernel<QT, kHeadSize>, reduce_grid, kThreads, 0, stream,
                        params);
    LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  }
  if (plan.prefill_tiles > 0) {
    const int64_t tiles = plan.prefill_tiles;
    const dim3 tile_grid(static_cast<unsigned>(tiles), grid.y);
    ::llm::cuda::Launch(PrefillAttentionKernel<QT, CacheT, kHeadSize>, tile_grid, kThreads, 0,
                        stream, params);
    LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  }
  return OpStatus::Ok();
}

template <typename QT, typename CacheT>
OpStatus LaunchForHeadSize(cudaStream_t stream, const Params& params, int64_t num_tokens,
                           int64_t head_size, const PagedAttentionPlan& plan) {
  switch (head_size) {
    case 16:
      return Launch<QT, CacheT, 16>(stream, params, num_tokens, plan);
    case 32:
      return Launch<QT, CacheT, 32>(stream, params, num_tokens, plan);
    case 64:
      return Launch<QT, CacheT, 64>(stream, params, num_tokens, plan);
    default:
      return Launch<QT, CacheT, 128>(stream, params, num_tokens, plan);  // checked by the caller
  }
}

// The instantiations: (query, cache) dtypes (f32, f32), (f32, f16), (f32, bf16), (f16, f16),
// (bf16, bf16) x head size (16, 32, 64, 128) x (v1, v2, prefill), and the reduction per query
// dtype and head size. A 16-bit query with a cache of another dtype is refused: a model in f16
// or bf16 keeps its cache in its own dtype, and f32 caches for it would only double the bytes
// read.
OpStatus LaunchForDType(cudaStream_t stream, const Params& params, DType query_dtype,
                        DType cache_dtype, int64_t num_tokens, int64_t head_size,
                        const PagedAttentionPlan& plan) {
  constexpr const char* kOp = "PagedAttention";
  if (query_dtype == DType::kF32) {
    switch (cache_dtype) {
      case DType::kF32:
        return LaunchForHeadSize<float, float>(stream, params, num_tokens, head_size, plan);
      case DType::kF16:
        return LaunchForHeadSize<float, __half>(stream, params, num_tokens, head_size, plan);
      case DType::kBF16:
        return LaunchForHeadSize<float, __nv_bfloat16>(stream, params, num_tokens, head_size, plan);
      default:
        return cuda_internal::Error(kOp, "key_cache: expected f32, f16 or bf16");
    }
  }
  if (query_dtype != DType::kF16 && query_dtype != DType::kBF16) {
    return cuda_internal::Error(kOp, "query: expected f32, f16 or bf16");
  }
  if (cache_dtype != query_dtype) {
    return cuda_internal::Error(kOp, std::string("key_cache: a ") + DTypeName(query_dtype) +
                                         " query takes a " + DTypeName(query_dtype) +
                                         " cache, got " + DTypeName(cache_dtype));
  }
  if (query_dtype == DType::kF16) {
    return LaunchForHeadSize<__half, __half>(stream, params, num_tokens, head_size, plan);
  }
  return LaunchForHeadSize<__nv_bfloat16, __nv_bfloat16>(stream, params, num_tokens, head_size,
                                                         plan);
}

// The 16-bit path (see the file comment).
OpStatus PagedAttention16(const OpContext& ctx, const TensorView& out, const TensorView& query,
                          const TensorView& key_cache, const TensorView& value_cache,
                          const AttentionMetadata& metadata, const AttentionOptions& options,
                          PagedAttentionVersion version) {
  constexpr const char* kOp = "PagedAttention";
  if (version != PagedAttentionVersion::kAuto) {
    return cuda_internal::Error(kOp, "v1 and v2 take f32 queries, got " + query.ToString());
  }
  for (const TensorView* t : {&out, &query, &key_cache, &value_cache}) {
    if (reinterpret_cast<uintptr_t>(t->data) % 16 != 0) {
      return cuda_internal::Error(kOp,
                                  "16-bit tensors must be 16-byte aligned, got " + t->ToString());
    }
  }
  if (internal::TokenStride(query) * DTypeSize(query.dtype) % 16 != 0) {
    return cuda_internal::Error(kOp,
                                "16-bit query rows must be 16-byte aligned, got a token "
                                "stride of " +
                                    std::to_string(internal::TokenStride(query)) + " elements");
  }
  const int64_t num_tokens = query.shape[0], num_seqs = metadata.seq_lens.shape[0];
  int device = 0, num_sms = 0;
  LLM_CUDA_OP_RETURN_IF_ERROR(kOp, cudaGetDevice(&device));
  LLM_CUDA_OP_RETURN_IF_ERROR(
      kOp, cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  DecodePlanInput in;
  in.num_seqs = num_seqs;
  in.num_heads = query.shape[1];
  in.num_kv_heads = key_cache.shape[2];
  in.head_size = query.shape[2];
  in.num_sms = num_sms;
  in.max_seq_len = metadata.max_seq_len;
  in.query_start_loc_host = metadata.query_start_loc_host;
  in.seq_lens_host = metadata.seq_lens_host;
  in.workspace_bytes = ctx.workspace != nullptr ? ctx.workspace_bytes : 0;
  in.sliding_window = options.sliding_window;
  DecodePlan plan;
  if (std::string err = PlanDecode(in, &plan); !err.empty()) {
    return cuda_internal::Error(kOp, err);
  }
  if (OpStatus st =
          DecodeAttention(ctx, out, query, key_cache, value_cache, metadata, options, plan);
      !st.ok()) {
    return st;
  }
  // Prefill rows: some q_len > 1 (known); unknown, the prefill kernel looks (its CTAs of
  // decode-only sequences exit at once).
  bool prefill = num_tokens > 0;
  const std::span<const int32_t> qsl = metadata.query_start_loc_host;
  if (!qsl.empty()) {
    prefill = false;
    for (int64_t s = 0; s < num_seqs; ++s) prefill = prefill || qsl[s + 1] - qsl[s] > 1;
  }
  if (!prefill) return OpStatus::Ok();
  return PrefillAttentionMma(ctx, out, query, key_cache, value_cache, metadata, options);
}

}  // namespace

OpStatus PagedAttentionSimt(const OpContext& ctx, const TensorView& out, const TensorView& query,
                            const TensorView& key_cache, const TensorView& value_cache,
                            const AttentionMetadata& metadata, const AttentionOptions& options,
                            PagedAttentionVersion version) {
  constexpr const char* kOp = "PagedAttention";
  const int64_t num_tokens = query.shape[0], num_heads = query.shape[1];
  if (OpStatus st = cuda_internal::StartOp(kOp, query.device); !st.ok()) return st;
  const int64_t head_size = query.shape[2];
  const int64_t num_seqs = metadata.seq_lens.shape[0];
  const int64_t max_blocks = metadata.block_tables.shape[1];
  if (head_size != 16 && head_size != 32 && head_size != 64 && head_size != 128) {
    return cuda_internal::Error(kOp, "the CUDA kernels take head sizes 16, 32, 64 and 128, got " +
                                         std::to_string(head_size));
  }
  if (num_tokens == 0 || num_heads == 0) return OpStatus::Ok();
  if (num_seqs == 0) {
    return cuda_internal::Error(kOp, std::to_string(num_tokens) + " query tokens but no sequences");
  }
  if (num_tokens > cuda_internal::kMaxGridX - num_seqs - 1 ||
      num_heads > cuda_internal::kMaxGridYZ || num_seqs > INT32_MAX || max_blocks > INT32_MAX ||
      internal::TokenStride(query) > INT32_MAX) {
    return cuda_internal::Error(kOp,
                                "too many tokens, heads, sequences, blocks per sequence or "
                                "elements per query row for one launch");
  }
  PagedAttentionPlanInput in;
  in.num_tokens = num_tokens;
  in.num_heads = num_heads;
  in.head_size = head_size;
  in.num_seqs = num_seqs;
  in.max_seq_len = metadata.max_seq_len;
  in.sliding_window = options.sliding_window;
  in.version = version;
  in.query_start_loc_host = metadata.query_start_loc_host;
  in.workspace_bytes = ctx.workspace != nullptr ? ctx.workspace_bytes : 0;
  PagedAttentionPlan plan;
  if (std::string err = PlanPagedAttention(in, &plan); !err.empty()) {
    return cuda_internal::Error(kOp, err);
  }
  if (plan.max_partitions > cuda_internal::kMaxGridYZ) {
    return cuda_internal::Error(kOp, "metadata.max_seq_len " +
                                         std::to_string(metadata.max_seq_len) +
                                         " needs more partitions than one launch takes");
  }
  Params params{};
  FillPagedAttentionParams(out, query, key_cache, value_cache, metadata, options, &params);
  params.q_stride = static_cast<int>(internal::TokenStride(query));
  params.scale = options.scale;
  // kAuto: prefill chunks (q_len > 1) go to the tiled kernel, the other rows to v1 or v2.
  params.prefill_tiled = plan.prefill_tiled;
  if (plan.v2) {
    // The caller's workspace: tmp_out, then the (max, sum) pairs (stream-ordered on
    // ctx.stream, like every use of it).
    params.max_partitions = static_cast<int>(plan.max_partitions);
    const size_t parts = static_cast<size_t>(num_tokens * num_heads * plan.max_partitions);
    params.tmp_out = static_cast<float*>(ctx.workspace);
    params.ml = params.tmp_out + parts * head_size;
  }
  return LaunchForDType(cuda_internal::AsStream(ctx.stream), params, query.dtype, key_cache.dtype,
                        num_tokens, head_size, plan);
}

OpStatus PagedAttention(const OpContext& ctx, const TensorView& out, const TensorView& query,
                        const TensorView& key_cache, const TensorView& value_cache,
                        const AttentionMetadata& metadata, const AttentionOptions& options,
                        PagedAttentionVersion version) {
  // 16-bit queries at head sizes 64 and 128 (kAuto, 16-byte aligned): the GQA-shared decode
  // kernel and the tensor-core prefill kernel. Everything else (f32 queries, head sizes 16 and
  // 32, an explicit v1 / v2): the SIMT kernels.
  const int64_t head_size = query.shape[2];
  bool aligned = true;
  for (const TensorView* t : {&out, &query, &key_cache, &value_cache}) {
    aligned = aligned && reinterpret_cast<uintptr_t>(t->data) % 16 == 0;
  }
  aligned = aligned && internal::TokenStride(query) * DTypeSize(query.dtype) % 16 == 0;
  if (query.dtype != DType::kF32 && key_cache.dtype == query.dtype &&
      (head_size == 64 || head_size == 128) && version == PagedAttentionVersion::kAuto && aligned) {
    constexpr const char* kOp = "PagedAttention";
    if (OpStatus st = cuda_internal::StartOp(kOp, query.device); !st.ok()) return st;
    const int64_t num_tokens = query.shape[0], num_seqs = metadata.seq_lens.shape[0];
    if (num_tokens == 0 || query.shape[1] == 0) return OpStatus::Ok();
    if (num_seqs == 0) {
      return cuda_internal::Error(kOp,
                                  std::to_string(num_tokens) + " query tokens but no sequences");
    }
    return PagedAttention16(ctx, out, query, key_cache, value_cache, metadata, options, version);
  }
  return PagedAttentionSimt(ctx, out, query, key_cache, value_cache, metadata, options, version);
}

OpStatus PagedAttention(const OpContext& ctx, const TensorView& out, const TensorView& query,
                        const TensorView& key_cache, const TensorView& value_cache,
                        const AttentionMetadata& metadata, float scale,
                        PagedAttentionVersion version) {
  AttentionOptions options;
  options.scale = scale;
  return PagedAttention(ctx, out, query, key_cache, value_cache, metadata, options, version);
}

}  // namespace llm::ops::cuda
