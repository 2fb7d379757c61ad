// Tensor-core prefill attention over the paged KV cache (FlashAttention-2 style), for the rows
// of sequences with q_len > 1; the rows of sequences with q_len == 1 are left untouched.
//
// Grid (tiles, Hq), kThreads = 128 threads (4 warps). A CTA takes kTileRows = 64 consecutive
// query rows of one sequence (its tile) and one query head h (KV head kvh = h / (Hq / Hkv));
// warp w takes the tile's rows 16 w .. 16 w + 15. The tile -> sequence map: with
// metadata.query_start_loc_host the host lists the prefill sequences and their cumulative tile
// counts in the kernel parameters (up to kMaxListedSeqs of them) and the grid is exact; else
// each CTA walks query_start_loc on the device and the grid is ceil(T / kTileRows) + S, enough
// for any split of T rows (surplus CTAs exit).
//
// Row r of the tile (query row t = begin + j0 + r, chunk index j = j0 + r) sits at position
// p_r = seq_len - q_len + j and sees the keys at positions 0 .. p_r, or with a sliding window W
// p_r - W + 1 .. p_r. Per CTA, over key tiles of kTileKeys positions k0 .. k0 + 63 from row 0's
// first key (0, or p_0 - W + 1: the blocks before are not read) up to the tile's last position
// (a warp skips the key tiles wholly before its rows' windows):
//   1. one thread per key looks up its block (one block-table load and divide per key) and
//      writes the key's cache offset to shared memory; then all threads gather K and V of the
//      key tile into shared memory, 16 bytes per load (positions past the tile's last one are
//      zeros; a bad block id fills NaN);
//   2. each warp (unless all its rows end before k0): S = Q K^T by mma.sync m16n8k16 (Q as A
//      fragments in registers, loaded once; K as B fragments by ldmatrix), s = S scale log2(e)
//      (then with a softcap c: c2 tanh(s / c2), c2 = c log2(e), the cap in the log2 domain)
//      with the positions a row must not see selected to -inf (never computed with), then the
//      online softmax in base 2 on the C fragments:
//        m' = max(m, max_c s[c]);  P[c] = 2^(s[c] - m');  l = l 2^(m - m') + sum_c P[c];
//        O = O 2^(m - m') + P V
//      with P rounded to 16 bits as A fragments and V as B fragments by ldmatrix.trans;
//   3. out[t][h] = O / l, rounded to the dtype.
// A masked key's score is selected to -inf and its P is exactly 0, but P V sums over the masked
// keys of a tile too and 0 x NaN is NaN: so keys past the tile's last position are zeros, and in
// a diagonal key tile (one with a key that some row of the tile must not see) a V row that is
// not finite is stored as zeros and flags the rows that see its key, which come out NaN. A NaN
// in K or V at a masked or unused position never reaches an output (an infinite V that a row
// sees gives NaN where the CPU op may give an infinity).
// Bad metadata (q_len > seq_len, a context longer than the block table, a block id outside the
// cache, query_start_loc outside [0, T]) gives NaN rows; nothing outside the tensors is read.
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/paged_attention_params.h"
#include "kernels/cuda/paged_attention_prefill.h"
#include "kernels/op_check.h"

namespace llm::ops::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerWarp = 16;
constexpr int kTileRows = kWarps * kRowsPerWarp;  // 64
constexpr int kTileKeys = 64;
constexpr int kMaxListedSeqs = 64;
constexpr float kLog2E = 1.4426950408889634f;
constexpr int64_t kPastEnd = -1, kBadBlock = -2;  // Smem::offset's non-offsets

using cuda_internal::Vec16;

// query, out and the caches are T; q_stride is even (Q is read two elements a word).
struct Params : PagedAttentionParams {
  int64_t q_stride;  // elements between query rows
  int64_t num_tokens;
  float scale_log2;    // scale log2(e)
  float softcap_log2;  // softcap log2(e); 0 = none
  // > 0: the grid's tiles, listed on the host: listed_seq[i] has the tiles
  // listed_tile_end[i - 1] .. listed_tile_end[i] - 1 (0 before the first).
  int num_listed;
  int32_t listed_seq[kMaxListedSeqs];
  int32_t listed_tile_end[kMaxListedSeqs];
};

// This CTA's tile: sequence, first query row, q_len and tile index, or seq = -1 when none.
struct Tile {
  int seq = -1;
  int64_t begin = 0;
  int64_t q_len = 0;
  int index = 0;
};

__device__ __forceinline__ Tile FindTile(const Params& p, int block) {
  Tile tile;
  if (p.num_listed > 0) {
    int lo = 0, hi = p.num_listed;  // the first i with listed_tile_end[i] > block
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (p.listed_tile_end[mid] > block) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    if (lo == p.num_listed) return tile;
    tile.seq = p.listed_seq[lo];
    tile.index = block - (lo > 0 ? p.listed_tile_end[lo - 1] : 0);
    tile.begin = p.query_start_loc[tile.seq];
    tile.q_len = static_cast<int64_t>(p.query_start_loc[tile.seq + 1]) - tile.begin;
    return tile;
  }
  int remaining = block;
  for (int s = 0; s < p.num_seqs; ++s) {
    const int64_t b = p.query_start_loc[s], n = p.query_start_loc[s + 1] - b;
    if (n <= 1) continue;  // decode rows (and bad lengths) are not this kernel's
    const int64_t tiles = (n + kTileRows - 1) / kTileRows;
    if (remaining < tiles) {
      tile.seq = s;
      tile.begin = b;
      tile.q_len = n;
      tile.index = remaining;
      return tile;
    }
    remaining -= static_cast<int>(tiles);
  }
  return tile;
}

// Whether all 8 16-bit T of v are finite (exponent bits not all ones).
template <typename T>
__device__ __forceinline__ bool IsFinite(const Vec16& v) {
  constexpr uint32_t kExp = std::is_same_v<T, __half> ? 0x7c00u : 0x7f80u;
  auto finite2 = [](uint32_t w) { return (w & kExp) != kExp && (w >> 16 & kExp) != kExp; };
  return finite2(v.x) && finite2(v.y) && finite2(v.z) && finite2(v.w);
}

// Step 1b: K and V of the key tile into shared memory, piece e (of all threads) being key
// e / (D / 8), 16 bytes e % (D / 8). kCheckV: a V row that is not finite is stored as zeros
// and flagged in v_bad.
template <typename T, int kHeadSize, bool kCheckV>
__device__ __forceinline__ void GatherKeyTile(const Params& p, const int64_t* offset,
                                              uint16_t (*k)[kHeadSize + 8],
                                              uint16_t (*v)[kHeadSize + 8], int32_t* v_bad) {
  constexpr int kVecsPerRow = kHeadSize / 8;
#pragma unroll
  for (int e = threadIdx.x; e < kTileKeys * kVecsPerRow; e += kThreads) {
    const int c = e / kVecsPerRow, part = e % kVecsPerRow;
    const int64_t off = offset[c];
    Vec16 kv{0u, 0u, 0u, 0u}, vv{0u, 0u, 0u, 0u};
    if (off >= 0) {
      kv = *reinterpret_cast<const Vec16*>(static_cast<const T*>(p.key_cache) + off + part * 8);
      vv = *reinterpret_cast<const Vec16*>(static_cast<const T*>(p.value_cache) + off + part * 8);
    } else if (off == kBadBlock) {
      kv = vv = Vec16{~0u, ~0u, ~0u, ~0u};  // NaN in bf16 and f16
    }
    if (kCheckV && !IsFinite<T>(vv)) {
      vv = Vec16{0u, 0u, 0u, 0u};
      v_bad[c] = 1;
    }
    *reinterpret_cast<Vec16*>(&k[c][part * 8]) = kv;
    *reinterpret_cast<Vec16*>(&v[c][part * 8]) = vv;
  }
}

// kSoftcap: the scores are soft-capped (p.softcap_log2 > 0); a template parameter so that the
// kernel without a cap carries none of its code or registers.
template <typename T, int kHeadSize, bool kSoftcap>
__global__ void __launch_bounds__(kThreads) PrefillAttentionMmaKernel(const Params p) {
  constexpr int kStride = kHeadSize + 8;     // shared row, 16-bit elements: +16 bytes
  constexpr int kDimSteps = kHeadSize / 16;  // k-steps of S = Q K^T
  constexpr int kKeyTiles8 = kTileKeys / 8;  // n-tiles of S
  constexpr int kKeySteps = kTileKeys / 16;  // k-steps of O += P V
  constexpr int kDimTiles8 = kHeadSize / 8;  // n-tiles of O
  struct alignas(16) Smem {
    uint16_t k[kTileKeys][kStride];
    uint16_t v[kTileKeys][kStride];
    int64_t offset[kTileKeys];  // per key of the tile: its cache offset, kPastEnd or kBadBlock
    // Per key of a diagonal key tile: its V row held a NaN or an infinity, replaced by zeros
    // (P V sums over masked keys too, with P = 0, and 0 x NaN is NaN): the rows that see the
    // key come out NaN instead.
    int32_t v_bad[kTileKeys];
  };
  __shared__ Smem smem;

  const Tile tile = FindTile(p, static_cast<int>(blockIdx.x));
  if (tile.seq < 0) return;  // a surplus CTA
  const int h = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, tq = lane & 3;
  const int64_t j0 = static_cast<int64_t>(tile.index) * kTileRows;
  if (tile.q_len <= 1 || j0 >= tile.q_len) return;  // the host's list disagrees with the device
  const int rows = static_cast<int>(min(static_cast<int64_t>(kTileRows), tile.q_len - j0));
  T* const out = static_cast<T*>(p.out);
  const int64_t seq_len = p.seq_lens[tile.seq];
  const int64_t first_pos = seq_len - tile.q_len + j0;  // p of the tile's row 0
  const int64_t last_pos = first_pos + rows - 1;
  const int64_t first_row = tile.begin + j0;  // t of the tile's row 0
  if (tile.begin < 0 || tile.begin + tile.q_len > p.num_tokens || first_pos < 0 ||
      last_pos >= static_cast<int64_t>(p.max_blocks) * p.block_size) {
    // Bad metadata: NaN rows (those inside [0, T)).
    const T nan = cuda_internal::FromFloat<T>(NAN);
    for (int e = threadIdx.x; e < rows * kHeadSize; e += kThreads) {
      const int64_t t = first_row + e / kHeadSize;
      if (t >= 0 && t < p.num_tokens) out[(t * p.num_heads + h) * kHeadSize + e % kHeadSize] = nan;
    }
    return;
  }
  const int kvh = h / (p.num_heads / p.num_kv_heads);
  const int32_t* table = p.block_tables + static_cast<int64_t>(tile.seq) * p.max_blocks;
  const int64_t kv_slot_stride = static_cast<int64_t>(p.num_kv_heads) * kHeadSize;

  // This warp's rows: 16 warp + g (fragment elements 0, 1) and 16 warp + g + 8 (2, 3).
  const int wrow0 = warp * kRowsPerWarp;
  const bool warp_active = wrow0 < rows;
  const int64_t warp_last_pos = first_pos + min(rows, wrow0 + kRowsPerWarp) - 1;
  const int64_t pos_row[2] = {first_pos + wrow0 + g, first_pos + wrow0 + g + 8};
  // The window (0: none): row 0's first key, and the first key of the warp's first row.
  const int64_t window = p.sliding_window;
  const int64_t key_first = window > 0 ? max(first_pos - window + 1, int64_t{0}) : 0;
  const int64_t warp_key_first = window > 0 ? first_pos + wrow0 - window + 1 : 0;

  // Q as A fragments: qa[kk] covers dims 16 kk .. 16 kk + 15. Padding rows are zeros.
  uint32_t qa[kDimSteps][4];
  {
    const uint32_t* q32 = static_cast<const uint32_t*>(p.query);
#pragma unroll
    for (int kk = 0; kk < kDimSteps; ++kk) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = wrow0 + g + 8 * (i & 1), d = 16 * kk + 2 * tq + 8 * (i >> 1);
        qa[kk][i] = r < rows ? q32[((first_row + r) * p.q_stride + h * kHeadSize + d) / 2] : 0u;
      }
    }
  }

  float o[kDimTiles8][4];
#pragma unroll
  for (int n = 0; n < kDimTiles8; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) o[n][i] = 0.0f;
  }
  float m[2] = {-INFINITY, -INFINITY};  // running max (base 2) of rows g, g + 8
  float l[2] = {0.0f, 0.0f};            // this lane's part of the running sums
  bool row_nan[2] = {false, false};     // the row sees a non-finite V (v_bad)

  for (int64_t k0 = key_first; k0 <= last_pos; k0 += kTileKeys) {
    __syncthreads();  // the previous key tile's reads of smem are done
    // 1a. One block-table lookup per key: the element offset of (pos, kvh) in the caches,
    // kPastEnd past the tile's last position, kBadBlock for a block id outside the cache.
    if (threadIdx.x < kTileKeys) {
      const int64_t pos = k0 + threadIdx.x;
      int64_t off = kPastEnd;
      if (pos <= last_pos) {
        const int32_t block = table[pos / p.block_size];
        off = block >= 0 && block < p.num_blocks
                  ? (static_cast<int64_t>(block) * p.block_size + pos % p.block_size) *
                            kv_slot_stride +
                        static_cast<int64_t>(kvh) * kHeadSize
                  : kBadBlock;
      }
      smem.offset[threadIdx.x] = off;
      smem.v_bad[threadIdx.x] = 0;
    }
    __syncthreads();
    // Whether some row of the tile does not see some key of this key tile (CTA-uniform): a
    // key after row 0's position, or one before the last row's window.
    const bool diagonal =
        k0 + kTileKeys - 1 > first_pos || (window > 0 && k0 < last_pos - window + 1);
    // 1b. Gather K and V; only a diagonal key tile checks V (a loop of its own, so that the
    // others' stays short).
    if (diagonal) {
      GatherKeyTile<T, kHeadSize, true>(p, smem.offset, smem.k, smem.v, smem.v_bad);
    } else {
      GatherKeyTile<T, kHeadSize, false>(p, smem.offset, smem.k, smem.v, smem.v_bad);
    }
    __syncthreads();
    // Warp-uniform: the key tile is wholly after the warp's rows or before their windows.
    if (!warp_active || k0 > warp_last_pos || k0 + kTileKeys - 1 < warp_key_first) continue;

    // 2a. S = Q K^T: s[n] is keys k0 + 8 n .. + 7. The x4 ldmatrix over keys 8 n .. 8 n + 7
    // and dims 32 kp .. 32 kp + 31 gives the B fragments of k-steps 2 kp and 2 kp + 1.
    float s[kKeyTiles8][4];
#pragma unroll
    for (int n = 0; n < kKeyTiles8; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) s[n][i] = 0.0f;
#pragma unroll
      for (int kp = 0; kp < kDimSteps / 2; ++kp) {
        uint32_t kb[4];
        cuda_mma::LdMatrixX4(kb, &smem.k[8 * n + lane % 8][32 * kp + 8 * (lane / 8)]);
        const uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
        cuda_mma::MmaM16N8K16<T>(s[n], qa[2 * kp], b0, s[n]);
        cuda_mma::MmaM16N8K16<T>(s[n], qa[2 * kp + 1], b1, s[n]);
      }
    }
    if (diagonal) {
      // The rows that see a key whose V was not finite (v_bad) are NaN at the end.
      const uint64_t bad = __ballot_sync(0xffffffffu, smem.v_bad[lane]) |
                           static_cast<uint64_t>(__ballot_sync(0xffffffffu, smem.v_bad[lane + 32]))
                               << 32;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t last_c = pos_row[r] - k0;  // the row sees key columns first_c .. last_c
        const int64_t first_c = window > 0 ? last_c - window + 1 : 0;
        uint64_t seen = last_c < 0 ? 0ull : last_c >= kTileKeys - 1 ? ~0ull : (2ull << last_c) - 1;
        if (first_c >= kTileKeys) {
          seen = 0;
        } else if (first_c > 0) {
          seen &= ~((1ull << first_c) - 1);
        }
        row_nan[r] = row_nan[r] || (bad & seen) != 0;
      }
    }
    // 2b. Scale, cap, mask (select, never compute with a masked score) and the row maxima.
    // Key column c of the tile is visible to a row at position q when c <= q - k0 (and with a
    // window c >= q - W + 1 - k0); only the key tiles that reach past the warp's first row or
    // before its last row's window need the compare (warp-uniform).
    if constexpr (kSoftcap) {
#pragma unroll
      for (int n = 0; n < kKeyTiles8; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[n][i] = p.softcap_log2 * tanhf(s[n][i] * p.scale_log2 / p.softcap_log2);
        }
      }
    }
    const float score_scale = kSoftcap ? 1.0f : p.scale_log2;
    float tile_max[2] = {-INFINITY, -INFINITY};
    if (k0 + kTileKeys - 1 > first_pos + wrow0 || (window > 0 && k0 < warp_last_pos - window + 1)) {
      // Columns lower[r] .. limit[r] (clamped to the tile: -1 .. kTileKeys).
      int limit[2], lower[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t last_c = pos_row[r] - k0;
        limit[r] = static_cast<int>(min(last_c, static_cast<int64_t>(kTileKeys)));
        lower[r] =
            window > 0
                ? static_cast<int>(
                      max(min(last_c - window + 1, static_cast<int64_t>(kTileKeys)), int64_t{-1}))
                : -1;
      }
#pragma unroll
      for (int n = 0; n < kKeyTiles8; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int c = 8 * n + 2 * tq + (i & 1);
          const float v =
              c <= limit[i >> 1] && c >= lower[i >> 1] ? s[n][i] * score_scale : -INFINITY;
          s[n][i] = v;
          tile_max[i >> 1] = fmaxf(tile_max[i >> 1], v);
        }
      }
    } else {
#pragma unroll
      for (int n = 0; n < kKeyTiles8; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[n][i] *= score_scale;
          tile_max[i >> 1] = fmaxf(tile_max[i >> 1], s[n][i]);
        }
      }
    }
    float corr[2], m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);
      // Without a window a row sees position 0 in the first key tile, so m_new is finite from
      // then on (NaN scores, from bad block ids, are ignored by fmaxf and make the row NaN
      // below); with one, a row whose window starts past this key tile has seen no key yet:
      // m_new = -inf, taken as 0, so that its P and corr are 0 (not NaN).
      m_use[r] = m_new == -INFINITY ? 0.0f : m_new;
      corr[r] = exp2f(m[r] - m_use[r]);  // 0 on the row's first key tile
      m[r] = m_new;
      l[r] *= corr[r];
    }
#pragma unroll
    for (int n = 0; n < kDimTiles8; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) o[n][i] *= corr[i >> 1];
    }
    // 2c. P = 2^(s - m), its row sums, and O += P V by k-steps of 16 keys.
#pragma unroll
    for (int n = 0; n < kKeyTiles8; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float e = exp2f(s[n][i] - m_use[i >> 1]);
        s[n][i] = e;
        l[i >> 1] += e;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kKeySteps; ++kk) {
      const uint32_t pa[4] = {cuda_mma::PackFloats<T>(s[2 * kk][0], s[2 * kk][1]),
                              cuda_mma::PackFloats<T>(s[2 * kk][2], s[2 * kk][3]),
                              cuda_mma::PackFloats<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              cuda_mma::PackFloats<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      // x4.trans over keys 16 kk .. 16 kk + 15 and dims 16 np .. 16 np + 15: matrix l / 8 is
      // keys + 8 ((l / 8) & 1), dims + 8 ((l / 8) >> 1): the B fragments of n-tiles 2 np and
      // 2 np + 1.
#pragma unroll
      for (int np = 0; np < kDimTiles8 / 2; ++np) {
        uint32_t vb[4];
        cuda_mma::LdMatrixX4Trans(
            vb, &smem.v[16 * kk + lane % 8 + 8 * ((lane / 8) & 1)][16 * np + 8 * (lane / 16)]);
        const uint32_t b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
        cuda_mma::MmaM16N8K16<T>(o[2 * np], pa, b0, o[2 * np]);
        cuda_mma::MmaM16N8K16<T>(o[2 * np + 1], pa, b1, o[2 * np + 1]);
      }
    }
  }
  if (!warp_active) return;

  // 3. out = O / l, l summed over the quad that shares the rows.
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = l[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    inv[r] = row_nan[r] ? NAN : 1.0f / sum;
  }
  uint32_t* out32 = static_cast<uint32_t*>(p.out);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = wrow0 + g + 8 * r;
    if (row >= rows) continue;
    uint32_t* dst = out32 + ((first_row + row) * p.num_heads + h) * kHeadSize / 2;
#pragma unroll
    for (int n = 0; n < kDimTiles8; ++n) {
      dst[4 * n + tq] = cuda_mma::PackFloats<T>(o[n][2 * r] * inv[r], o[n][2 * r + 1] * inv[r]);
    }
  }
}

template <typename T, bool kSoftcap>
OpStatus LaunchForHeadSize(cudaStream_t stream, dim3 grid, const Params& params,
                           int64_t head_size) {
  if (head_size == 64) {
    ::llm::cuda::Launch(PrefillAttentionMmaKernel<T, 64, kSoftcap>, grid, kThreads, 0, stream,
                        params);
  } else {
    ::llm::cuda::Launch(PrefillAttentionMmaKernel<T, 128, kSoftcap>, grid, kThreads, 0, stream,
                        params);
  }
  LLM_CUDA_OP_CHECK_LAUNCH("PagedAttention");
  return OpStatus::Ok();
}

}  // namespace

OpStatus PrefillAttentionMma(const OpContext& ctx, const TensorView& out, const TensorView& query,
                             const TensorView& key_cache, const TensorView& value_cache,
                             const AttentionMetadata& metadata, const AttentionOptions& options) {
  constexpr const char* kOp = "PagedAttention";
  const int64_t num_tokens = query.shape[0], num_heads = query.shape[1];
  const int64_t head_size = query.shape[2];
  const int64_t num_seqs = metadata.seq_lens.shape[0];
  if (head_size != 64 && head_size != 128) {
    return cuda_internal::Error(kOp,
                                "the tensor-core prefill kernel takes head sizes 64 and 128, "
                                "got " +
                                    std::to_string(head_size));
  }
  if (query.dtype != DType::kBF16 && query.dtype != DType::kF16) {
    return cuda_internal::Error(kOp, "the tensor-core prefill kernel takes bf16 or f16 queries");
  }
  if (key_cache.dtype != query.dtype || value_cache.dtype != query.dtype ||
      out.dtype != query.dtype) {
    return cuda_internal::Error(kOp,
                                "the tensor-core prefill kernel takes out, key_cache and "
                                "value_cache of the query's dtype");
  }
  if (num_tokens == 0 || num_heads == 0 || num_seqs == 0) return OpStatus::Ok();
  if (num_heads > cuda_internal::kMaxGridYZ || num_seqs > INT32_MAX ||
      metadata.block_tables.shape[1] > INT32_MAX) {
    return cuda_internal::Error(kOp,
                                "too many heads, sequences or blocks per sequence for one "
                                "launch");
  }
  Params params{};
  FillPagedAttentionParams(out, query, key_cache, value_cache, metadata, options, &params);
  params.q_stride = internal::TokenStride(query);
  params.num_tokens = num_tokens;
  params.scale_log2 = options.scale * kLog2E;
  params.softcap_log2 = options.softcap * kLog2E;

  // The grid: exact from the host's q_lens when they fit the parameters, else an upper bound.
  int64_t tiles = 0;
  const std::span<const int32_t> qsl = metadata.query_start_loc_host;
  bool listed = qsl.size() == static_cast<size_t>(num_seqs) + 1;
  if (listed) {
    int n = 0;
    for (int64_t s = 0; s < num_seqs && listed; ++s) {
      const int64_t q_len = static_cast<int64_t>(qsl[s + 1]) - qsl[s];
      if (q_len <= 1) continue;
      if (n == kMaxListedSeqs) {
        listed = false;
        break;
      }
      tiles += (q_len + kTileRows - 1) / kTileRows;
      params.listed_seq[n] = static_cast<int32_t>(s);
      params.listed_tile_end[n] = static_cast<int32_t>(tiles);
      ++n;
    }
    params.num_listed = listed ? n : 0;
    if (listed && n == 0) return OpStatus::Ok();  // no prefill rows
  }
  if (!listed) {
    params.num_listed = 0;
    tiles = (num_tokens + kTileRows - 1) / kTileRows + num_seqs;
  }
  if (tiles > cuda_internal::kMaxGridX) {
    return cuda_internal::Error(kOp, "too many prefill tiles for one launch");
  }
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(num_heads));
  const cudaStream_t stream = cuda_internal::AsStream(ctx.stream);
  const bool softcap = params.softcap_log2 > 0.0f;
  if (query.dtype == DType::kBF16) {
    return softcap ? LaunchForHeadSize<__nv_bfloat16, true>(stream, grid, params, head_size)
                   : LaunchForHeadSize<__nv_bfloat16, false>(stream, grid, params, head_size);
  }
  return softcap ? LaunchForHeadSize<__half, true>(stream, grid, params, head_size)
                 : LaunchForHeadSize<__half, false>(stream, grid, params, head_size);
}

}  // namespace llm::ops::cuda
