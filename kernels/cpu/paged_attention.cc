// Paged attention on the CPU for a batch that mixes prefill chunks and decode tokens.
//
// For each sequence s, query token j (position p = seq_lens[s] - q_len + j) and kv head kvh,
// the query heads of kvh's group (h / (Hq / Hkv) == kvh) make one pass together over s's
// blocks, so that each key and value is loaded once per group. Online softmax: per block, the
// scores of its keys at positions <= p; then the running max m, sum l and weighted value sum
// acc are rescaled by exp(m_old - m_new) and extended with the block's keys:
//   score[i] = scale * q[t][h][:] . key_cache[block][i][kvh][:]
//   acc[:]  = acc[:] * exp(m_old - m) + sum_i exp(score[i] - m) * value_cache[block][i][kvh][:]
//   out[t][h][:] = acc[:] / l
// The caches are f32 or bf16 (a bf16 model's). With f32 caches all arithmetic is f32. With bf16
// caches the products are bf16 x bf16 summed in f32, as vdpbf16ps computes them: the scaled
// query scale * q is rounded to bf16 (nearest even; the row kernel's vcvtneps2bf16 also takes a
// denormal for zero) before its dot products with the keys, and
// the tiled paths round the softmax weights exp(score - m) to bf16 before their products with the
// values (the sum l adds the f32 weights); the reference keeps its weights in f32, so that the
// tiled paths differ from it by at most 2^-9 max|v| (each weight's relative rounding error, at
// most 2^-9) beyond f32 rounding. As in a bf16 model on PyTorch, whose query and probabilities
// are bf16 tensors.
//
// Options (kernels/ops.h's AttentionOptions). A sliding window W: the row at position p sees
// the keys from WindowStart(p) = max(0, p - W + 1) on; every kernel starts its keys at its
// first row's window start (the blocks before it are never read) and masks, like the causal
// mask, the keys before a later row's. A softcap c: score = c tanh(score / c) on the scaled
// score, before the max and exp of the online softmax (the tiled paths' vector tanh:
// Tanh512). A row none of whose keys a tile shows (a window starting past the tile) keeps
// m = -inf, l = 0 and o = 0 through it.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "common/half.h"
#include "kernels/cpu/avx2_math.h"
#include "kernels/cpu/avx512_math.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/op_check.h"

namespace llm::ops::cpu {
namespace {

constexpr const char* kOp = "PagedAttention";

std::string Str(int64_t v) { return std::to_string(v); }

// What only the metadata's values can get wrong: lengths and block ids.
OpStatus CheckMetadata(const AttentionMetadata& md, int64_t num_tokens, int64_t num_blocks,
                       int64_t block_size) {
  const int64_t num_seqs = md.seq_lens.shape[0];
  const int64_t max_blocks = md.block_tables.shape[1];
  const int32_t* qsl = md.query_start_loc.data_as<const int32_t>();
  const int32_t* seq_lens = md.seq_lens.data_as<const int32_t>();
  const int32_t* tables = md.block_tables.data_as<const int32_t>();
  if (qsl[0] != 0 || qsl[num_seqs] != num_tokens) {
    return internal::Error(kOp, "metadata.query_start_loc must start at 0 and end at the " +
                                    Str(num_tokens) + " query tokens, got " + Str(qsl[0]) + " .. " +
                                    Str(qsl[num_seqs]));
  }
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = qsl[s + 1] - qsl[s];
    if (q_len < 0) {
      return internal::Error(kOp, "metadata.query_start_loc decreases at sequence " + Str(s) +
                                      ": " + Str(qsl[s]) + " then " + Str(qsl[s + 1]));
    }
    if (seq_lens[s] < q_len) {
      return internal::Error(kOp, "metadata.seq_lens[" + Str(s) + "] = " + Str(seq_lens[s]) +
                                      " is less than its " + Str(q_len) + " query tokens");
    }
    if (md.max_seq_len > 0 && seq_lens[s] > md.max_seq_len) {
      return internal::Error(kOp, "metadata.seq_lens[" + Str(s) + "] = " + Str(seq_lens[s]) +
                                      " exceeds metadata.max_seq_len " + Str(md.max_seq_len));
    }
    if (q_len == 0) continue;
    const int64_t used_blocks = (seq_lens[s] + block_size - 1) / block_size;
    if (used_blocks > max_blocks) {
      return internal::Error(kOp, "metadata.seq_lens[" + Str(s) + "] = " + Str(seq_lens[s]) +
                                      " needs " + Str(used_blocks) + " blocks of " +
                                      Str(block_size) + " but block_tables has " + Str(max_blocks) +
                                      " columns");
    }
    for (int64_t b = 0; b < used_blocks; ++b) {
      const int32_t id = tables[s * max_blocks + b];
      if (id < 0 || id >= num_blocks) {
        return internal::Error(kOp, "metadata.block_tables[" + Str(s) + "][" + Str(b) + "] = " +
                                        Str(id) + " is outside [0, " + Str(num_blocks) + ")");
      }
    }
  }
  return OpStatus::Ok();
}

// The first key position a query at position `pos` sees: 0, or with a sliding window W > 0
// the first of its last W positions.
inline int64_t WindowStart(int64_t pos, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
}

// A scaled score after the softcap c (> 0): c tanh(s / c).
inline float SoftCap(float s, float cap) { return cap * std::tanh(s / cap); }

// A cache element as a float: the caches are f32 (float) or bf16 (uint16_t, its bits).
inline float ToFloat(float x) { return x; }
inline float ToFloat(uint16_t x) { return Bf16ToFloat(x); }

// x as the product of a bf16 multiplicand with a cache of type T sees it: itself against f32
// caches, rounded to bf16 (nearest even) against bf16 caches.
template <typename T>
float AsMultiplicand(float x) {
  if constexpr (std::is_same_v<T, uint16_t>) return Bf16ToFloat(FloatToBf16(x));
  return x;
}

// a . b over n floats, in 8 independent lanes so that the compiler can vectorize it.
template <typename T>
float Dot(const float* a, const T* b, int64_t n) {
  float lanes[8] = {};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    for (int j = 0; j < 8; ++j) lanes[j] += a[d + j] * ToFloat(b[d + j]);
  }
  float sum = 0.0f;
  for (int j = 0; j < 8; ++j) sum += lanes[j];
  for (; d < n; ++d) sum += a[d] * ToFloat(b[d]);
  return sum;
}

}  // namespace

namespace {

template <typename T>
OpStatus Reference(const TensorView& out, const TensorView& query, const TensorView& key_cache,
                   const TensorView& value_cache, const AttentionMetadata& metadata,
                   const AttentionOptions& options) {
  const float scale = options.scale, cap = options.softcap;
  const int64_t num_tokens = query.shape[0], num_heads = query.shape[1];
  const int64_t head_size = query.shape[2];
  const int64_t num_blocks = key_cache.shape[0], block_size = key_cache.shape[1];
  const int64_t num_kv_heads = key_cache.shape[2];
  if (OpStatus s = CheckMetadata(metadata, num_tokens, num_blocks, block_size); !s.ok()) {
    return s;
  }
  const int64_t group = num_heads / num_kv_heads;
  const int64_t num_seqs = metadata.seq_lens.shape[0];
  const int64_t max_blocks = metadata.block_tables.shape[1];
  const int32_t* qsl = metadata.query_start_loc.data_as<const int32_t>();
  const int32_t* seq_lens = metadata.seq_lens.data_as<const int32_t>();
  const int32_t* tables = metadata.block_tables.data_as<const int32_t>();
  const T* kc = key_cache.data_as<const T>();
  const T* vc = value_cache.data_as<const T>();
  const int64_t slot_stride = num_kv_heads * head_size;   // cache[b][i][h][d]: one slot
  const int64_t block_stride = block_size * slot_stride;  // one block
  const int64_t q_stride = internal::TokenStride(query);  // q[t][h][d]: one query row

  // Per query head of one kv head's group: scores of one block, running max and sum, and
  // the unnormalized output.
  std::vector<float> scores(group * block_size);
  std::vector<float> m(group), l(group), acc(group * head_size);
  std::vector<float> q_bf16(std::is_same_v<T, uint16_t> ? group * head_size : 0);
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = qsl[s + 1] - qsl[s];
    const int32_t* table = tables + s * max_blocks;
    for (int64_t j = 0; j < q_len; ++j) {
      const int64_t t = qsl[s] + j;
      const int64_t num_keys = seq_lens[s] - q_len + j + 1;  // positions 0 .. p
      const int64_t first = WindowStart(num_keys - 1, options.sliding_window);
      for (int64_t kvh = 0; kvh < num_kv_heads; ++kvh) {
        // q[t][kvh * group + g][:] for the group's query heads, which share every key and value.
        const float* q = query.data_as<const float>() + t * q_stride + kvh * group * head_size;
        float q_scale = scale;  // bf16 caches: the scaled query rounded to bf16 instead
        if constexpr (std::is_same_v<T, uint16_t>) {
          for (int64_t i = 0; i < group * head_size; ++i) {
            q_bf16[i] = AsMultiplicand<T>(q[i] * scale);
          }
          q = q_bf16.data();
          q_scale = 1.0f;
        }
        std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
        std::fill(l.begin(), l.end(), 0.0f);
        std::fill(acc.begin(), acc.end(), 0.0f);
        // The blocks from the window's first: slots i0 .. n - 1 of each.
        for (int64_t b = first / block_size; b * block_size < num_keys; ++b) {
          const int64_t n = std::min(block_size, num_keys - b * block_size);
          const int64_t i0 = std::max<int64_t>(0, first - b * block_size);
          const T* kb = kc + table[b] * block_stride + kvh * head_size;
          const T* vb = vc + table[b] * block_stride + kvh * head_size;
          for (int64_t i = i0; i < n; ++i) {
            const T* k = kb + i * slot_stride;  // key_cache[table[b]][i][kvh][:]
            for (int64_t g = 0; g < group; ++g) {
              const float score = Dot(q + g * head_size, k, head_size) * q_scale;
              scores[g * block_size + i] = cap > 0.0f ? SoftCap(score, cap) : score;
            }
          }
          for (int64_t g = 0; g < group; ++g) {
            float* sc = scores.data() + g * block_size;
            float* a = acc.data() + g * head_size;
            const float m_new = std::max(m[g], *std::max_element(sc + i0, sc + n));
            const float correction = std::exp(m[g] - m_new);  // 0 on the first block
            l[g] *= correction;
            for (int64_t d = 0; d < head_size; ++d) a[d] *= correction;
            for (int64_t i = i0; i < n; ++i) {
              const float p = std::exp(sc[i] - m_new);
              l[g] += p;
              const T* v = vb + i * slot_stride;  // value_cache[table[b]][i][kvh][:]
              for (int64_t d = 0; d < head_size; ++d) a[d] += p * ToFloat(v[d]);
            }
            m[g] = m_new;
          }
        }
        for (int64_t g = 0; g < group; ++g) {
          float* o = out.data_as<float>() + (t * num_heads + kvh * group + g) * head_size;
          const float inv_l = 1.0f / l[g];
          for (int64_t d = 0; d < head_size; ++d) o[d] = acc[g * head_size + d] * inv_l;
        }
      }
    }
  }
  return OpStatus::Ok();
}

}  // namespace

OpStatus PagedAttentionReference(const TensorView& out, const TensorView& query,
                                 const TensorView& key_cache, const TensorView& value_cache,
                                 const AttentionMetadata& metadata,
                                 const AttentionOptions& options) {
  if (key_cache.dtype == DType::kBF16) {
    return Reference<uint16_t>(out, query, key_cache, value_cache, metadata, options);
  }
  return Reference<float>(out, query, key_cache, value_cache, metadata, options);
}

OpStatus PagedAttentionReference(const TensorView& out, const TensorView& query,
                                 const TensorView& key_cache, const TensorView& value_cache,
                                 const AttentionMetadata& metadata, float scale) {
  AttentionOptions options;
  options.scale = scale;
  return PagedAttentionReference(out, query, key_cache, value_cache, metadata, options);
}

// The production op: the same attention, blocked flash-style. A work item is one sequence's
// run of query rows (decode: its one row; prefill: a tile of rows) for one kv head; the rows of
// all G query heads of the group make R = rows * G score rows that share every K and V tile.
// Per tile of kKeyTile keys:
//   S[i][r] = (scale * q_r) . k_i             (q transposed once per item: qt[d][r])
//   S[i][r] = cap(S[i][r])                   (softcap c > 0: c tanh(S / c))
//   S[i][r] = -inf where key i is after row r's position (causal) or before its window
//   m_new[r] = max(m[r], max_i S[i][r]);  alpha[r] = exp(m[r] - m_new[r])
//   P[i][r] = exp(S[i][r] - m_new[r]);    l[r] = l[r] * alpha[r] + sum_i P[i][r]
//   O[r][:] = O[r][:] * alpha[r] + sum_i P[i][r] * v_i[:]
// and out = O / l at the end. Work items run on the OpenMP pool (schedule(dynamic), the
// costliest first); each thread's buffers are its own and are kept between calls, so a step
// allocates nothing once they have grown to the batch's shape.
namespace {

constexpr int64_t kKeyTile = 32;       // keys per tile
constexpr int64_t kMaxTileRows = 64;   // score rows (query rows x group) per prefill item, about
constexpr int64_t kMinSplitKeys = 64;  // keys per part, at least, of a split decode row
// Below this much work (score rows x keys x head size, about a quarter of the FLOPs: some
// 1.3 us on one core) a call runs on the calling thread: a parallel region on the spinning pool
// costs about 1 us (bench_cpu_attention's BM_EmptyParallelRegion). It was 2^19 while the pool
// slept between regions; at 2^15 SmolLM2's batch-1 decode (9 heads, a 512-key context) splits
// in four on two threads: 20-21 -> 12-14 us a layer.
constexpr int64_t kMinParallelWork = int64_t{1} << 15;

struct WorkItem {
  int32_t seq, kv_head;
  int32_t kv_count;        // kv heads kv_head .. kv_head + kv_count - 1 (RunRowAvx512: all)
  int32_t q_begin, q_end;  // the sequence's query rows q_begin .. q_end - 1
  int32_t k_begin, k_end;  // its keys k_begin .. k_end - 1 (k_end -1: up to the last query's)
  int32_t partial;         // -1: writes `out`; else writes partial `partial` (split decode)
  int64_t cost;            // score rows x keys
};

// A decode row whose keys were split over several items: partials first .. first + count - 1
// hold each part's running max, sum and unnormalized output, merged after the items.
struct Split {
  int32_t seq, kv_head, kv_count, first, count;
};

struct Problem {
  const float* query;    // q[t][h][d] at query + t * query_stride + h * head_size + d
  int64_t query_stride;  // floats between query rows (token-strided views: wider than Hq * D)
  float* out;
  const void* key_cache;  // f32 or bf16 (the item functions' T)
  const void* value_cache;
  const int32_t* query_start_loc;
  const int32_t* seq_lens;
  const int32_t* block_tables;
  int64_t num_heads, head_size, num_kv_heads, group, block_size, max_blocks;
  int64_t slot_stride, block_stride;  // cache elements between slots and between blocks
  float scale;
  int64_t window;   // AttentionOptions::sliding_window; 0 = none
  float softcap;    // AttentionOptions::softcap; 0 = none
  float* partials;  // split decode: per partial and its item's H = kv_count * group heads,
                    // m[H], l[H], o[H][head_size] (PartialFloats apart)
};

// Query head `head` of query row `token` (the group's heads follow it).
inline const float* QueryRow(const Problem& pb, int64_t token, int64_t head) {
  return pb.query + token * pb.query_stride + head * pb.head_size;
}

// One work item's geometry.
struct ItemView {
  int64_t first_token;         // query row of the item's first query in `query` / `out`
  int64_t num_queries;         // query rows in the item
  int64_t pos0;                // position of its first query
  int64_t num_keys;            // keys 0 .. pos of its last query
  int64_t rows;                // num_queries * group
  int64_t key_begin, key_end;  // the keys this item reads (from its first row's window start
                               // to num_keys unless split)
  const int32_t* table;
};

ItemView View(const Problem& pb, const WorkItem& it) {
  const int64_t q_len = pb.query_start_loc[it.seq + 1] - pb.query_start_loc[it.seq];
  const int64_t context = pb.seq_lens[it.seq] - q_len;
  ItemView v;
  v.first_token = pb.query_start_loc[it.seq] + it.q_begin;
  v.num_queries = it.q_end - it.q_begin;
  v.pos0 = context + it.q_begin;
  v.num_keys = context + it.q_end;
  v.rows = v.num_queries * pb.group;
  v.key_begin = std::max<int64_t>(it.k_begin, WindowStart(v.pos0, pb.window));
  v.key_end = it.k_end < 0 ? v.num_keys : it.k_end;
  v.table = pb.block_tables + it.seq * pb.max_blocks;
  return v;
}

// The cache rows of keys k0 .. k0 + n - 1 of one kv head.
template <typename T>
void TilePointers(const Problem& pb, const ItemView& v, int64_t kv_head, int64_t k0, int64_t n,
                  const T** keys, const T** values) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = k0 + i;
    const int64_t offset = v.table[p / pb.block_size] * pb.block_stride +
                           (p % pb.block_size) * pb.slot_stride + kv_head * pb.head_size;
    keys[i] = static_cast<const T*>(pb.key_cache) + offset;
    values[i] = static_cast<const T*>(pb.value_cache) + offset;
  }
}

// The score rows that see key position p: row r = j * group + g is query j's, at position
// pos0 + j, which sees p when p <= pos0 + j (causal) and, with a window W, pos0 + j - p < W.
// Rows [0, *lo) are before p and rows [*hi, rows) past its window.
void VisibleRows(const Problem& pb, const ItemView& v, int64_t p, int64_t* lo, int64_t* hi) {
  *lo = p <= v.pos0 ? 0 : std::min(v.rows, (p - v.pos0) * pb.group);
  *hi =
      pb.window > 0 ? std::clamp<int64_t>((p + pb.window - v.pos0) * pb.group, 0, v.rows) : v.rows;
}

// Key position p's scores s[r] (r < the item's rows) set to -inf in the rows that do not see
// it.
void MaskScores(const Problem& pb, const ItemView& v, int64_t p, float* s) {
  int64_t lo, hi;
  VisibleRows(pb, v, p, &lo, &hi);
  std::fill(s, s + lo, -std::numeric_limits<float>::infinity());
  std::fill(s + hi, s + v.rows, -std::numeric_limits<float>::infinity());  // hi >= lo
}

// q (scaled; rounded to bf16 for bf16 caches) transposed: qt[d * stride + r] for the item's
// rows, zero past them.
template <typename T>
void LoadQueries(const Problem& pb, const ItemView& v, int64_t kv_head, int64_t stride, float* qt) {
  const int64_t dim = pb.head_size;
  std::fill(qt, qt + dim * stride, 0.0f);
  for (int64_t j = 0; j < v.num_queries; ++j) {
    const float* q = QueryRow(pb, v.first_token + j, kv_head * pb.group);
    for (int64_t g = 0; g < pb.group; ++g) {
      const int64_t r = j * pb.group + g;
      for (int64_t d = 0; d < dim; ++d) {
        qt[d * stride + r] = AsMultiplicand<T>(q[g * dim + d] * pb.scale);
      }
    }
  }
}

void StoreOutput(const Problem& pb, const ItemView& v, int64_t kv_head, const float* o,
                 const float* l) {
  const int64_t dim = pb.head_size;
  for (int64_t j = 0; j < v.num_queries; ++j) {
    float* dst = pb.out + ((v.first_token + j) * pb.num_heads + kv_head * pb.group) * dim;
    for (int64_t g = 0; g < pb.group; ++g) {
      const int64_t r = j * pb.group + g;
      const float inv_l = 1.0f / l[r];
      for (int64_t d = 0; d < dim; ++d) dst[g * dim + d] = o[r * dim + d] * inv_l;
    }
  }
}

int64_t PartialFloats(const Problem& pb) { return pb.num_heads * (pb.head_size + 2); }

// The item's result: `out` = o / l, or its partial (m, l, o) of a split decode row.
void Finish(const Problem& pb, const ItemView& v, const WorkItem& it, const float* o,
            const float* l, const float* m) {
  const int64_t heads = it.kv_count * pb.group;
  if (it.partial < 0) {
    if (it.kv_count == 1) {
      StoreOutput(pb, v, it.kv_head, o, l);
      return;
    }
    // One query row: its heads are contiguous in `out`.
    float* dst = pb.out + (v.first_token * pb.num_heads + it.kv_head * pb.group) * pb.head_size;
    for (int64_t h = 0; h < heads; ++h) {
      const float inv_l = 1.0f / l[h];
      for (int64_t d = 0; d < pb.head_size; ++d) {
        dst[h * pb.head_size + d] = o[h * pb.head_size + d] * inv_l;
      }
    }
    return;
  }
  float* dst = pb.partials + it.partial * PartialFloats(pb);
  std::copy(m, m + heads, dst);
  std::copy(l, l + heads, dst + heads);
  std::copy(o, o + heads * pb.head_size, dst + 2 * heads);
}

// out of a split decode row from its partials: with M = max_i m_i and w_i = exp(m_i - M),
// out = sum_i w_i o_i / sum_i w_i l_i.
void MergeSplit(const Problem& pb, const Split& sp) {
  const int64_t dim = pb.head_size, stride = PartialFloats(pb);
  const float* first = pb.partials + sp.first * stride;
  const int64_t token = pb.query_start_loc[sp.seq];  // a decode row: the sequence's only query
  const int64_t heads = sp.kv_count * pb.group;
  for (int64_t g = 0; g < heads; ++g) {
    float m_max = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < sp.count; ++i) m_max = std::max(m_max, first[i * stride + g]);
    float* dst = pb.out + (token * pb.num_heads + sp.kv_head * pb.group + g) * dim;
    std::fill(dst, dst + dim, 0.0f);
    float l = 0.0f;
    for (int64_t i = 0; i < sp.count; ++i) {
      const float* part = first + i * stride;
      const float w = std::exp(part[g] - m_max);
      l += w * part[heads + g];
      const float* o = part + 2 * heads + g * dim;
      for (int64_t d = 0; d < dim; ++d) dst[d] += w * o[d];
    }
    const float inv_l = 1.0f / l;
    for (int64_t d = 0; d < dim; ++d) dst[d] *= inv_l;
  }
}

// Floats of one thread's buffers for an item of `rows` score rows (stride: rows rounded up).
int64_t ScratchFloats(int64_t rows, int64_t stride, int64_t dim) {
  return dim * stride + kKeyTile * stride + 3 * stride + rows * dim;
}

// Each thread's buffers, grown to the largest item it has run and never shrunk.
float* ThreadScratch(int64_t floats) {
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < floats) buffer.resize(floats);
  return buffer.data();
}

// The same for 32-bit words (bf16 pairs).
uint32_t* ThreadWords(int64_t words) {
  thread_local std::vector<uint32_t> buffer;
  if (static_cast<int64_t>(buffer.size()) < words) buffer.resize(words);
  return buffer.data();
}

// Portable: any head size, any CPU (loops the compiler may vectorize; std::exp).
template <typename T>
void RunItemGeneric(const Problem& pb, const WorkItem& it) {
  const ItemView v = View(pb, it);
  const int64_t dim = pb.head_size, rows = v.rows, stride = rows;
  float* qt = ThreadScratch(ScratchFloats(rows, stride, dim));
  float* s = qt + dim * stride;
  float* m = s + kKeyTile * stride;
  float* l = m + stride;
  float* alpha = l + stride;
  float* o = alpha + stride;
  LoadQueries<T>(pb, v, it.kv_head, stride, qt);
  std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
  std::fill(l, l + rows, 0.0f);
  std::fill(o, o + rows * dim, 0.0f);
  const T* keys[kKeyTile];
  const T* values[kKeyTile];
  for (int64_t k0 = v.key_begin; k0 < v.key_end; k0 += kKeyTile) {
    const int64_t n = std::min(kKeyTile, v.key_end - k0);
    TilePointers(pb, v, it.kv_head, k0, n, keys, values);
    for (int64_t i = 0; i < n; ++i) {
      float* si = s + i * stride;
      std::fill(si, si + rows, 0.0f);
      for (int64_t d = 0; d < dim; ++d) {
        const float kd = ToFloat(keys[i][d]);
        const float* qd = qt + d * stride;
        for (int64_t r = 0; r < rows; ++r) si[r] += qd[r] * kd;
      }
      if (pb.softcap > 0.0f) {
        for (int64_t r = 0; r < rows; ++r) si[r] = SoftCap(si[r], pb.softcap);
      }
      MaskScores(pb, v, k0 + i, si);
    }
    for (int64_t r = 0; r < rows; ++r) {
      float m_new = m[r];
      for (int64_t i = 0; i < n; ++i) m_new = std::max(m_new, s[i * stride + r]);
      // A row that has seen no key yet (its window starts past this tile) keeps all zeros.
      const float m_use = m_new == -std::numeric_limits<float>::infinity() ? 0.0f : m_new;
      alpha[r] = std::exp(m[r] - m_use);  // 0 on the first tile
      float sum = 0.0f;
      for (int64_t i = 0; i < n; ++i)
        sum += (s[i * stride + r] = std::exp(s[i * stride + r] - m_use));
      l[r] = l[r] * alpha[r] + sum;
      m[r] = m_new;
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* orow = o + r * dim;
      for (int64_t d = 0; d < dim; ++d) orow[d] *= alpha[r];
      for (int64_t i = 0; i < n; ++i) {
        const float p = AsMultiplicand<T>(s[i * stride + r]);
        const T* vi = values[i];
        for (int64_t d = 0; d < dim; ++d) orow[d] += p * ToFloat(vi[d]);
      }
    }
  }
  Finish(pb, v, it, o, l, m);
}

// ---- AVX2 + FMA (head sizes that are multiples of 8): the portable item's math, vectorized
// over the head dimension (scores, values) and the tile's keys (softmax) ----

// 8 cache elements from p as floats (bf16: its bits shifted into a float's top half).
LLM_AVX2 inline __m256 LoadCache8(const float* p) { return _mm256_loadu_ps(p); }
LLM_AVX2 inline __m256 LoadCache8(const uint16_t* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// RunItemGeneric's item, in its order of operations per score, weight and output column but
// with each dot product summed in eight lanes, and exp as Exp256 (about 1 ulp). Buffers: the
// scaled queries row-major q[r][d] (rounded to bf16 for bf16 caches), the tile's scores
// s[r][i] (kKeyTile a row; past the tile's n keys -inf, so that they weigh 0), m, l, alpha and
// o[r][d].
template <typename T>
LLM_AVX2 void RunItemAvx2(const Problem& pb, const WorkItem& it) {
  const ItemView v = View(pb, it);
  const int64_t dim = pb.head_size, rows = v.rows;
  float* q = ThreadScratch(2 * rows * dim + rows * kKeyTile + 3 * rows);
  float* s = q + rows * dim;
  float* m = s + rows * kKeyTile;
  float* l = m + rows;
  float* alpha = l + rows;
  float* o = alpha + rows;
  for (int64_t j = 0; j < v.num_queries; ++j) {
    const float* src = QueryRow(pb, v.first_token + j, it.kv_head * pb.group);
    for (int64_t g = 0; g < pb.group; ++g) {
      float* dst = q + (j * pb.group + g) * dim;
      for (int64_t d = 0; d < dim; ++d) dst[d] = AsMultiplicand<T>(src[g * dim + d] * pb.scale);
    }
  }
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::fill(m, m + rows, kNegInf);
  std::fill(l, l + rows, 0.0f);
  std::fill(o, o + rows * dim, 0.0f);
  const T* keys[kKeyTile];
  const T* values[kKeyTile];
  for (int64_t k0 = v.key_begin; k0 < v.key_end; k0 += kKeyTile) {
    const int64_t n = std::min(kKeyTile, v.key_end - k0);
    TilePointers(pb, v, it.kv_head, k0, n, keys, values);
    // Scores; then the causal and window masks, per key, over the rows that do not see it.
    for (int64_t r = 0; r < rows; ++r) {
      const float* qr = q + r * dim;
      float* sr = s + r * kKeyTile;
      for (int64_t i = 0; i < n; ++i) {
        __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(qr), LoadCache8(keys[i]));
        for (int64_t d = 8; d < dim; d += 8) {
          acc = _mm256_fmadd_ps(_mm256_loadu_ps(qr + d), LoadCache8(keys[i] + d), acc);
        }
        const float dot = HorizontalSum256(acc);
        sr[i] = pb.softcap > 0.0f ? SoftCap(dot, pb.softcap) : dot;
      }
      std::fill(sr + n, sr + kKeyTile, kNegInf);
    }
    for (int64_t i = 0; i < n; ++i) {
      int64_t lo, hi;
      VisibleRows(pb, v, k0 + i, &lo, &hi);
      for (int64_t r = 0; r < lo; ++r) s[r * kKeyTile + i] = kNegInf;
      for (int64_t r = hi; r < rows; ++r) s[r * kKeyTile + i] = kNegInf;
    }
    // Online softmax per row, the tile's keys eight at a time.
    for (int64_t r = 0; r < rows; ++r) {
      float* sr = s + r * kKeyTile;
      __m256 mx = _mm256_set1_ps(m[r]);
      for (int64_t i = 0; i < kKeyTile; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(sr + i));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      const float m_new = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
      // A row that has seen no key yet (its window starts past this tile) keeps all zeros.
      const float m_use = m_new == kNegInf ? 0.0f : m_new;
      alpha[r] = std::exp(m[r] - m_use);  // 0 on the first tile
      const __m256 sub = _mm256_set1_ps(m_use);
      __m256 sum = _mm256_setzero_ps();
      for (int64_t i = 0; i < kKeyTile; i += 8) {
        const __m256 e = Exp256(_mm256_sub_ps(_mm256_loadu_ps(sr + i), sub));
        _mm256_storeu_ps(sr + i, e);
        sum = _mm256_add_ps(sum, e);
      }
      l[r] = l[r] * alpha[r] + HorizontalSum256(sum);
      m[r] = m_new;
    }
    // O = O alpha + P V: 32 columns in four registers at a time (then 8), each value row loaded
    // once per column group.
    for (int64_t r = 0; r < rows; ++r) {
      float* orow = o + r * dim;
      const float* sr = s + r * kKeyTile;
      float p[kKeyTile];
      for (int64_t i = 0; i < n; ++i) p[i] = AsMultiplicand<T>(sr[i]);
      const __m256 a = _mm256_set1_ps(alpha[r]);
      int64_t d = 0;
      for (; d + 32 <= dim; d += 32) {
        __m256 o0 = _mm256_mul_ps(_mm256_loadu_ps(orow + d), a);
        __m256 o1 = _mm256_mul_ps(_mm256_loadu_ps(orow + d + 8), a);
        __m256 o2 = _mm256_mul_ps(_mm256_loadu_ps(orow + d + 16), a);
        __m256 o3 = _mm256_mul_ps(_mm256_loadu_ps(orow + d + 24), a);
        for (int64_t i = 0; i < n; ++i) {
          const __m256 pi = _mm256_set1_ps(p[i]);
          const T* vi = values[i] + d;
          o0 = _mm256_fmadd_ps(pi, LoadCache8(vi), o0);
          o1 = _mm256_fmadd_ps(pi, LoadCache8(vi + 8), o1);
          o2 = _mm256_fmadd_ps(pi, LoadCache8(vi + 16), o2);
          o3 = _mm256_fmadd_ps(pi, LoadCache8(vi + 24), o3);
        }
        _mm256_storeu_ps(orow + d, o0);
        _mm256_storeu_ps(orow + d + 8, o1);
        _mm256_storeu_ps(orow + d + 16, o2);
        _mm256_storeu_ps(orow + d + 24, o3);
      }
      for (; d < dim; d += 8) {
        __m256 o0 = _mm256_mul_ps(_mm256_loadu_ps(orow + d), a);
        for (int64_t i = 0; i < n; ++i) {
          o0 = _mm256_fmadd_ps(_mm256_set1_ps(p[i]), LoadCache8(values[i] + d), o0);
        }
        _mm256_storeu_ps(orow + d, o0);
      }
    }
  }
  Finish(pb, v, it, o, l, m);
}

// out[0:dim] = out * alpha + sum_i p[i * p_stride] * values[i][offset : offset + dim] over a
// tile's n keys: 64 columns in four registers at a time, each value row loaded once per 64
// columns.
LLM_AVX512 inline void RescaleAndAddValues(float* out, float alpha, const float* p,
                                           int64_t p_stride, const float* const* values,
                                           int64_t offset, int64_t n, int64_t dim) {
  const __m512 a = _mm512_set1_ps(alpha);
  int64_t d = 0;
  for (; d + 64 <= dim; d += 64) {
    __m512 o0 = _mm512_mul_ps(_mm512_loadu_ps(out + d), a);
    __m512 o1 = _mm512_mul_ps(_mm512_loadu_ps(out + d + 16), a);
    __m512 o2 = _mm512_mul_ps(_mm512_loadu_ps(out + d + 32), a);
    __m512 o3 = _mm512_mul_ps(_mm512_loadu_ps(out + d + 48), a);
    for (int64_t i = 0; i < n; ++i) {
      const __m512 pi = _mm512_set1_ps(p[i * p_stride]);
      const float* vi = values[i] + offset + d;
      o0 = _mm512_fmadd_ps(pi, _mm512_loadu_ps(vi), o0);
      o1 = _mm512_fmadd_ps(pi, _mm512_loadu_ps(vi + 16), o1);
      o2 = _mm512_fmadd_ps(pi, _mm512_loadu_ps(vi + 32), o2);
      o3 = _mm512_fmadd_ps(pi, _mm512_loadu_ps(vi + 48), o3);
    }
    _mm512_storeu_ps(out + d, o0);
    _mm512_storeu_ps(out + d + 16, o1);
    _mm512_storeu_ps(out + d + 32, o2);
    _mm512_storeu_ps(out + d + 48, o3);
  }
  for (; d < dim; d += 16) {
    __m512 o0 = _mm512_mul_ps(_mm512_loadu_ps(out + d), a);
    for (int64_t i = 0; i < n; ++i) {
      o0 = _mm512_fmadd_ps(_mm512_set1_ps(p[i * p_stride]), _mm512_loadu_ps(values[i] + offset + d),
                           o0);
    }
    _mm512_storeu_ps(out + d, o0);
  }
}

// The online softmax's start for `stride` score rows (a multiple of 16): m = -inf, l = 0, and
// the `outputs` floats of o = 0.
LLM_AVX512 inline void StartRunningSums(int64_t stride, int64_t outputs, float* m, float* l,
                                        float* o) {
  for (int64_t r = 0; r < stride; r += 16) {
    _mm512_storeu_ps(m + r, _mm512_set1_ps(-std::numeric_limits<float>::infinity()));
    _mm512_storeu_ps(l + r, _mm512_setzero_ps());
  }
  std::fill(o, o + outputs, 0.0f);
}

// A tile's scores s[i * stride + r] (keys k0 .. k0 + n - 1) to weights: the softcap, the causal
// and window masks, then the online softmax 16 rows per register: m and l updated, alpha =
// exp(m - m') (0 on the first tile), s = exp(s - m') (m' taken as 0 while it is -inf: a row
// that has seen no key yet keeps zeros).
LLM_AVX512 inline void TileSoftmax(const Problem& pb, const ItemView& v, int64_t k0, int64_t n,
                                   int64_t stride, float* s, float* m, float* l, float* alpha) {
  if (pb.softcap > 0.0f) {
    const __m512 cap = _mm512_set1_ps(pb.softcap), inv_cap = _mm512_set1_ps(1.0f / pb.softcap);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t rb = 0; rb < stride; rb += 16) {
        float* si = s + i * stride + rb;
        _mm512_storeu_ps(si,
                         _mm512_mul_ps(cap, Tanh512(_mm512_mul_ps(_mm512_loadu_ps(si), inv_cap))));
      }
    }
  }
  for (int64_t i = 0; i < n; ++i) MaskScores(pb, v, k0 + i, s + i * stride);
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t rb = 0; rb < stride; rb += 16) {
    const __m512 m_old = _mm512_loadu_ps(m + rb);
    __m512 m_new = m_old;
    for (int64_t i = 0; i < n; ++i)
      m_new = _mm512_max_ps(_mm512_loadu_ps(s + i * stride + rb), m_new);
    const __m512 m_use = _mm512_mask_mov_ps(m_new, _mm512_cmp_ps_mask(m_new, neg_inf, _CMP_EQ_OQ),
                                            _mm512_setzero_ps());
    const __m512 a = Exp512(_mm512_sub_ps(m_old, m_use));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; ++i) {
      const __m512 p = Exp512(_mm512_sub_ps(_mm512_loadu_ps(s + i * stride + rb), m_use));
      _mm512_storeu_ps(s + i * stride + rb, p);
      sum = _mm512_add_ps(sum, p);
    }
    _mm512_storeu_ps(l + rb, _mm512_fmadd_ps(_mm512_loadu_ps(l + rb), a, sum));
    _mm512_storeu_ps(m + rb, m_new);
    _mm512_storeu_ps(alpha + rb, a);
  }
}

// Sums of 16 vectors: lane i of the result is the sum of v[i]'s 16 lanes (45 shuffles and adds
// for the 16, against 16 x 8 for one reduction each).
LLM_AVX512 inline __m512 Sum16(const __m512 v[16]) {
  __m512 w[8], x[4];
  for (int j = 0; j < 8; ++j) {  // 128-bit chunk c: (a, b, a, b) partial sums of v[2j], v[2j+1]
    w[j] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * j], v[2 * j + 1]),
                         _mm512_unpackhi_ps(v[2 * j], v[2 * j + 1]));
  }
  for (int j = 0; j < 4; ++j) {  // chunk c: partial sums of v[4j .. 4j + 3], in order
    x[j] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * j], w[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(w[2 * j], w[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // Add the four chunks of each x[j]: pairwise twice.
  const __m512 y0 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 y1 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(y0, y1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(y0, y1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// The row kernel's tile (RunRowAvx512, below): a key per lane of a register.
constexpr int64_t kLaneKeys = 16;

// prefetcht0 p, which the compiler keeps: GCC 12 deems __builtin_prefetch (_mm_prefetch) free of
// side effects, so a function that only computes addresses and prefetches is pure to it, and
// its calls are dropped as dead code.
inline void PrefetchL1(const void* p) {
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
}

// The cache rows of a row item's tiles of kLaneKeys keys. A tile is a block, or parts of two,
// somewhere else in the cache, where the hardware prefetcher does not follow, and one tile of
// compute does not cover a miss to memory: each tile's slots are prefetched twice, one tile and
// then two tiles before it is read, the nearer first. A single prefetch one, two, three or
// four tiles ahead does not do it (dropped at a page's first touch, it seems):
// bench_cpu_attention --shape=smollm2, bf16 caches, 32 x 2048 keys (past what stays cached):
// 2.4-2.8 ms with one prefetch, 1.6-2.1 ms with these two (three runs), 2.2-2.4 with the two
// the farther first; three or four a tile cost more where the cache stays cached.
template <typename T>
class RowTiles {
 public:
  RowTiles(const Problem& pb, const ItemView& v, const WorkItem& it)
      : pb_(pb), v_(v), kv_head_(it.kv_head), slot_bytes_(it.kv_count * pb.head_size * sizeof(T)) {
    Prefetch(v.key_begin);
    Prefetch(v.key_begin + kLaneKeys);
  }

  // Moves to the tile of keys k0 .. k0 + n - 1 (n = min(kLaneKeys, key_end - k0)), whose rows
  // are then keys() and values().
  void Advance(int64_t k0) {
    Prefetch(k0 + kLaneKeys);
    Prefetch(k0 + 2 * kLaneKeys);
    TilePointers(pb_, v_, kv_head_, k0, std::min(kLaneKeys, v_.key_end - k0), keys_, values_);
  }
  const T* const* keys() const { return keys_; }
  const T* const* values() const { return values_; }

 private:
  // The slots of the tile at k0 (none past the item's keys) into L1.
  void Prefetch(int64_t k0) {
    for (int64_t p = k0; p < std::min(k0 + kLaneKeys, v_.key_end); ++p) {
      const int64_t offset = v_.table[p / pb_.block_size] * pb_.block_stride +
                             (p % pb_.block_size) * pb_.slot_stride + kv_head_ * pb_.head_size;
      const char* k = reinterpret_cast<const char*>(static_cast<const T*>(pb_.key_cache) + offset);
      const char* v =
          reinterpret_cast<const char*>(static_cast<const T*>(pb_.value_cache) + offset);
      for (int64_t b = 0; b < slot_bytes_; b += 64) {
        PrefetchL1(k + b);
        PrefetchL1(v + b);
      }
    }
  }

  const Problem& pb_;
  const ItemView& v_;
  const int64_t kv_head_, slot_bytes_;
  const T* keys_[kLaneKeys];
  const T* values_[kLaneKeys];
};

// One head's online-softmax step over a tile: m and l updated; returns P = exp(S - m') (0 past
// the tile's n keys) and sets alpha = exp(m - m') (0 on the first tile). softcap > 0: S =
// softcap tanh(S / softcap) first.
LLM_AVX512 inline __m512 RowSoftmax(const __m512 dots[kLaneKeys], int64_t n, float softcap,
                                    float* m, float* l, float* alpha) {
  const __mmask16 live = static_cast<__mmask16>((1u << n) - 1);
  __m512 dot = Sum16(dots);
  if (softcap > 0.0f) {
    dot = _mm512_mul_ps(_mm512_set1_ps(softcap),
                        Tanh512(_mm512_mul_ps(dot, _mm512_set1_ps(1.0f / softcap))));
  }
  const __m512 scores =
      _mm512_mask_mov_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), live, dot);
  const float m_new = std::max(*m, _mm512_reduce_max_ps(scores));
  *alpha = m_new == *m ? 1.0f : std::exp(*m - m_new);  // the max seldom moves after a few tiles
  const __m512 probs = Exp512(_mm512_sub_ps(scores, _mm512_set1_ps(m_new)));
  *l = *l * *alpha + _mm512_reduce_add_ps(probs);
  *m = m_new;
  return probs;
}

// ---- Helpers for bf16 caches on AVX512_BF16 (head sizes that are multiples of 32) ----
//
// vdpbf16ps(acc, a, b) adds a[2l] b[2l] + a[2l + 1] b[2l + 1] to lane l of acc: 32 bf16 products
// per instruction, summed in f32. For P V the pairs are two keys: the values of keys 2j and
// 2j + 1 interleaved (PairValues) against the pair of their weights broadcast. The unpack
// instructions that interleave them work within 128-bit lanes, so the output accumulates with
// its columns permuted (per 32 columns: the unpacklo half, then the unpackhi half) and is put
// back in order once per item (UnpairColumns).

// One register of paired values in memory (PairValues), aligned for whole-line loads.
struct alignas(64) PairReg {
  uint16_t bf16[32];
};
LLM_AVX512_BF16 inline __m512bh Pairs(const PairReg* r) { return (__m512bh)_mm512_load_si512(r); }

// 32 bits from p (a pair of bf16), unaligned.
inline uint32_t LoadPair(const uint16_t* p) {
  uint32_t x;
  std::memcpy(&x, p, sizeof(x));
  return x;
}

// The values of a tile's n keys in pairs: for keys 2j and 2j + 1 (zeros for a missing last one)
// and each 32 columns c of `width`, out[(j * width / 32 + c / 32) * 2 + 0 / 1] is the unpacklo /
// unpackhi of the two rows' 32 columns: its dword lane l holds both keys' column
// c + 8 (l / 4) + l % 4, plus 4 in the unpackhi half.
LLM_AVX512_BF16 inline void PairValues(const uint16_t* const* values, int64_t n, int64_t width,
                                       PairReg* out) {
  for (int64_t j = 0; 2 * j < n; ++j) {
    const uint16_t* a = values[2 * j];
    const uint16_t* b = 2 * j + 1 < n ? values[2 * j + 1] : nullptr;
    for (int64_t c = 0; c < width; c += 32, out += 2) {
      const __m512i x = _mm512_loadu_si512(a + c);
      const __m512i y = b != nullptr ? _mm512_loadu_si512(b + c) : _mm512_setzero_si512();
      _mm512_store_si512(out, _mm512_unpacklo_epi16(x, y));
      _mm512_store_si512(out + 1, _mm512_unpackhi_epi16(x, y));
    }
  }
}

// out[0:dim] (permuted columns) = out * alpha + sum over the tile's pairs j of
// w[j * w_stride] . values (w: the pairs of weights; vp: PairValues' registers for this kv
// head, vp_stride registers from one pair to the next).
LLM_AVX512_BF16 inline void RescaleAndAddPairs(float* out, float alpha, const uint32_t* w,
                                               int64_t w_stride, const PairReg* vp,
                                               int64_t vp_stride, int64_t pairs, int64_t dim) {
  const __m512 a = _mm512_set1_ps(alpha);
  int64_t c = 0;
  for (; c + 64 <= dim; c += 64) {  // 64 columns: four accumulators
    __m512 o0 = _mm512_mul_ps(_mm512_loadu_ps(out + c), a);
    __m512 o1 = _mm512_mul_ps(_mm512_loadu_ps(out + c + 16), a);
    __m512 o2 = _mm512_mul_ps(_mm512_loadu_ps(out + c + 32), a);
    __m512 o3 = _mm512_mul_ps(_mm512_loadu_ps(out + c + 48), a);
    const PairReg* x = vp + c / 16;
    for (int64_t j = 0; j < pairs; ++j, x += vp_stride) {
      const __m512bh wj = (__m512bh)_mm512_set1_epi32(static_cast<int>(w[j * w_stride]));
      o0 = _mm512_dpbf16_ps(o0, wj, Pairs(x + 0));
      o1 = _mm512_dpbf16_ps(o1, wj, Pairs(x + 1));
      o2 = _mm512_dpbf16_ps(o2, wj, Pairs(x + 2));
      o3 = _mm512_dpbf16_ps(o3, wj, Pairs(x + 3));
    }
    _mm512_storeu_ps(out + c, o0);
    _mm512_storeu_ps(out + c + 16, o1);
    _mm512_storeu_ps(out + c + 32, o2);
    _mm512_storeu_ps(out + c + 48, o3);
  }
  if (c < dim) {  // 32 columns left
    __m512 o0 = _mm512_mul_ps(_mm512_loadu_ps(out + c), a);
    __m512 o1 = _mm512_mul_ps(_mm512_loadu_ps(out + c + 16), a);
    const PairReg* x = vp + c / 16;
    for (int64_t j = 0; j < pairs; ++j, x += vp_stride) {
      const __m512bh wj = (__m512bh)_mm512_set1_epi32(static_cast<int>(w[j * w_stride]));
      o0 = _mm512_dpbf16_ps(o0, wj, Pairs(x + 0));
      o1 = _mm512_dpbf16_ps(o1, wj, Pairs(x + 1));
    }
    _mm512_storeu_ps(out + c, o0);
    _mm512_storeu_ps(out + c + 16, o1);
  }
}

// `rows` rows of dim columns, in place: PairValues' column order back to 0 .. dim - 1.
LLM_AVX512_BF16 inline void UnpairColumns(float* o, int64_t rows, int64_t dim) {
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int64_t c = 0; c < rows * dim; c += 32) {
    const __m512 lo = _mm512_loadu_ps(o + c), hi = _mm512_loadu_ps(o + c + 16);
    _mm512_storeu_ps(o + c, _mm512_permutex2var_ps(lo, first, hi));
    _mm512_storeu_ps(o + c + 16, _mm512_permutex2var_ps(lo, second, hi));
  }
}

// Each thread's buffer of paired values, grown as needed.
PairReg* ThreadPairs(int64_t registers) {
  thread_local std::vector<PairReg> buffer;
  if (static_cast<int64_t>(buffer.size()) < registers) buffer.resize(registers);
  return buffer.data();
}

// ---- The AVX-512 kernels: one body each for f32 and bf16 caches ----
//
// Avx512Cache<T> holds what differs between f32 caches (AVX-512F: f32 products, vfmadd231ps)
// and bf16 caches (AVX512_BF16: pairs of bf16 products summed in f32, vdpbf16ps): the buffers,
// the form of the scaled query, one step of q . k, and the tile's P V (the f32 kernels read the
// value rows in place; the bf16 kernels pair them, PairValues, and permute the output's columns,
// UnpairColumns). RunItemAvx512<T> and RunRowAvx512<T> are the rest, the same for both.
//
// A template's target cannot depend on T, so both instances are compiled for AVX512_BF16's
// target (which includes AVX512BW). The f32 instance holds no AVX512_BF16 instruction (those
// come only from Avx512Cache<uint16_t>'s intrinsics), but the compiler may give it AVX512BW's
// mask moves: it runs where avx512f and avx512bw both hold (PickKernels).
template <typename T>
struct Avx512Cache;

template <>
struct Avx512Cache<float> {
  using Query = float;                      // the row kernel's scaled query
  static constexpr int64_t kRowStep = 16;   // columns per step of the row kernel's q . k
  static constexpr int64_t kQueryPack = 1;  // columns per word of the item kernel's qt

  // The row kernel's buffers, one allocation: q, m, l, o and the tile's weights p.
  struct RowBuffers {
    RowBuffers(int64_t heads, int64_t dim, int64_t /*width*/)
        : q(ThreadScratch(heads * dim + 2 * heads + heads * dim + kLaneKeys)),
          m(q + heads * dim),
          l(m + heads),
          o(l + heads),
          p(o + heads * dim) {}
    float *q, *m, *l, *o, *p;
  };
  // q[0 .. 15] = src[0 .. 15] * scale.
  static LLM_AVX512 void ScaleQuery(const float* src, __m512 scale, float* q) {
    _mm512_storeu_ps(q, _mm512_mul_ps(_mm512_loadu_ps(src), scale));
  }
  static LLM_AVX512 __m512 RowDot(__m512 acc, const float* q, const float* k) {
    return _mm512_fmadd_ps(_mm512_loadu_ps(q), _mm512_loadu_ps(k), acc);
  }
  // The row kernel's P V reads the tile's value rows in place.
  static void LoadRowValues(RowBuffers& /*buf*/, const float* const* /*values*/, int64_t /*n*/,
                            int64_t /*width*/) {}
  // o[0:dim] = o * alpha + sum_i probs[i] * values[i][offset : offset + dim].
  static LLM_AVX512 void AddRowValues(RowBuffers& buf, const float* const* values, int64_t n,
                                      int64_t /*width*/, int64_t dim, int64_t offset, __m512 probs,
                                      float alpha, float* o) {
    _mm512_storeu_ps(buf.p, probs);
    RescaleAndAddValues(o, alpha, buf.p, 1, values, offset, n, dim);
  }

  // The item kernel's buffers, one allocation: qt, then s, m, l, alpha and o.
  struct ItemBuffers {
    ItemBuffers(int64_t rows, int64_t stride, int64_t dim)
        : qt(ThreadScratch(ScratchFloats(rows, stride, dim))), s(qt + dim * stride) {}
    float *qt, *s;
  };
  // qt[d * stride + r]: column d of score row r, scaled.
  static void LoadQueryColumns(const Problem& pb, const ItemView& v, int64_t kv_head,
                               int64_t stride, float* qt) {
    LoadQueries<float>(pb, v, kv_head, stride, qt);
  }
  static LLM_AVX512 __m512 QueryColumn(const float* qt) { return _mm512_loadu_ps(qt); }
  static LLM_AVX512 __m512 KeyColumn(const float* k) { return _mm512_set1_ps(*k); }
  static LLM_AVX512 __m512 Dot(__m512 acc, __m512 q, __m512 k) {
    return _mm512_fmadd_ps(q, k, acc);
  }
  // The item kernel's P V reads the weights s[i * stride + r] and the value rows in place.
  static void LoadItemValues(const ItemBuffers& /*buf*/, int64_t /*stride*/,
                             const float* const* /*values*/, int64_t /*n*/, int64_t /*dim*/) {}
  // o[0:dim] = o * alpha + sum_i s[i * stride + r] * values[i][0:dim].
  static LLM_AVX512 void AddItemValues(const ItemBuffers& buf, int64_t stride,
                                       const float* const* values, int64_t n, int64_t dim,
                                       int64_t r, float alpha, float* o) {
    RescaleAndAddValues(o, alpha, buf.s + r, stride, values, 0, n, dim);
  }

  static void UnpermuteColumns(float* /*o*/, int64_t /*rows*/, int64_t /*dim*/) {}
};

template <>
struct Avx512Cache<uint16_t> {
  using Query = uint16_t;                   // bf16 bits
  static constexpr int64_t kRowStep = 32;   // columns per vdpbf16ps
  static constexpr int64_t kQueryPack = 2;  // a pair of bf16 per word

  // The row kernel's buffers: q (bf16); m, l and o; the tile's values in pairs (all the item's
  // kv heads, `width` columns) and its weights in pairs.
  struct RowBuffers {
    RowBuffers(int64_t heads, int64_t dim, int64_t width)
        : q(reinterpret_cast<uint16_t*>(ThreadWords(heads * dim / 2))),
          m(ThreadScratch(2 * heads + heads * dim)),
          l(m + heads),
          o(l + heads),
          vp(ThreadPairs(kLaneKeys / 2 * width / 16)) {}
    uint16_t* q;
    float *m, *l, *o;
    PairReg* vp;
    alignas(32) uint32_t w[kLaneKeys / 2];  // weights of keys 2j, 2j + 1 in dword j
  };
  // q[0 .. 15] = bf16(src[0 .. 15] * scale).
  static LLM_AVX512_BF16 void ScaleQuery(const float* src, __m512 scale, uint16_t* q) {
    const __m256bh qb = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(src), scale));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), (__m256i)qb);
  }
  static LLM_AVX512_BF16 __m512 RowDot(__m512 acc, const uint16_t* q, const uint16_t* k) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(q), (__m512bh)_mm512_loadu_si512(k));
  }
  static LLM_AVX512_BF16 void LoadRowValues(RowBuffers& buf, const uint16_t* const* values,
                                            int64_t n, int64_t width) {
    PairValues(values, n, width, buf.vp);
  }
  // o[0:dim] (permuted columns) = o * alpha + the weights rounded to bf16 in pairs . the kv
  // head's paired values.
  static LLM_AVX512_BF16 void AddRowValues(RowBuffers& buf, const uint16_t* const* /*values*/,
                                           int64_t n, int64_t width, int64_t dim, int64_t offset,
                                           __m512 probs, float alpha, float* o) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(buf.w), (__m256i)_mm512_cvtneps_pbh(probs));
    RescaleAndAddPairs(o, alpha, buf.w, 1, buf.vp + offset / 16, width / 16, (n + 1) / 2, dim);
  }

  // The item kernel's buffers: s, m, l, alpha and o; qt, then the tile's weights in pairs of
  // keys, w[j * stride + r] (key 2j's in the low half); the tile's values in pairs.
  struct ItemBuffers {
    ItemBuffers(int64_t rows, int64_t stride, int64_t dim)
        : s(ThreadScratch(kKeyTile * stride + 3 * stride + rows * dim)),
          qt(ThreadWords(dim / 2 * stride + kKeyTile / 2 * stride)),
          w(qt + dim / 2 * stride),
          vp(ThreadPairs(kKeyTile / 2 * dim / 16)) {}
    float* s;
    uint32_t *qt, *w;
    PairReg* vp;
  };
  // qt[d / 2 * stride + r]: columns d and d + 1 of score row r, scaled, as a pair of bf16.
  static void LoadQueryColumns(const Problem& pb, const ItemView& v, int64_t kv_head,
                               int64_t stride, uint32_t* qt) {
    const int64_t dim = pb.head_size;
    std::fill(qt, qt + dim / 2 * stride, 0u);
    for (int64_t j = 0; j < v.num_queries; ++j) {
      const float* q = QueryRow(pb, v.first_token + j, kv_head * pb.group);
      for (int64_t g = 0; g < pb.group; ++g) {
        const int64_t r = j * pb.group + g;
        for (int64_t d = 0; d < dim; d += 2) {
          qt[d / 2 * stride + r] = FloatToBf16(q[g * dim + d] * pb.scale) |
                                   static_cast<uint32_t>(FloatToBf16(q[g * dim + d + 1] * pb.scale))
                                       << 16;
        }
      }
    }
  }
  static LLM_AVX512_BF16 __m512bh QueryColumn(const uint32_t* qt) {
    return (__m512bh)_mm512_loadu_si512(qt);
  }
  // The key's columns d and d + 1, broadcast.
  static LLM_AVX512_BF16 __m512bh KeyColumn(const uint16_t* k) {
    return (__m512bh)_mm512_set1_epi32(static_cast<int>(LoadPair(k)));
  }
  static LLM_AVX512_BF16 __m512 Dot(__m512 acc, __m512bh q, __m512bh k) {
    return _mm512_dpbf16_ps(acc, q, k);
  }
  // The tile's weights s[i * stride + r] to bf16 pairs in w, its values to pairs in vp.
  static LLM_AVX512_BF16 void LoadItemValues(const ItemBuffers& buf, int64_t stride,
                                             const uint16_t* const* values, int64_t n,
                                             int64_t dim) {
    for (int64_t j = 0; 2 * j < n; ++j) {
      for (int64_t rb = 0; rb < stride; rb += 16) {
        const __m512i lo = _mm512_cvtepu16_epi32(
            (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(buf.s + 2 * j * stride + rb)));
        const __m512i hi = 2 * j + 1 < n ? _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(
                                               _mm512_loadu_ps(buf.s + (2 * j + 1) * stride + rb)))
                                         : _mm512_setzero_si512();
        _mm512_storeu_si512(buf.w + j * stride + rb,
                            _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
      }
    }
    PairValues(values, n, dim, buf.vp);
  }
  // o[0:dim] (permuted columns) = o * alpha + row r's weights in pairs . the paired values.
  static LLM_AVX512_BF16 void AddItemValues(const ItemBuffers& buf, int64_t stride,
                                            const uint16_t* const* /*values*/, int64_t n,
                                            int64_t dim, int64_t r, float alpha, float* o) {
    RescaleAndAddPairs(o, alpha, buf.w + r, stride, buf.vp, dim / 16, (n + 1) / 2, dim);
  }

  static LLM_AVX512_BF16 void UnpermuteColumns(float* o, int64_t rows, int64_t dim) {
    UnpairColumns(o, rows, dim);
  }
};

// The tiled item kernel (prefill rows, and decode rows when the row kernel does not take them):
// head sizes that are multiples of 16 (f32 caches) or 32 (bf16); score rows padded to 16, one
// register. Per tile of kKeyTile keys: S = Q K^T, 16 rows x 4 keys a step, each key's column
// broadcast against a column of qt; the causal mask and online softmax (TileSoftmax); O = O *
// alpha + P V row by row.
template <typename T>
LLM_AVX512_BF16 void RunItemAvx512(const Problem& pb, const WorkItem& it) {
  using Cache = Avx512Cache<T>;
  constexpr int64_t kPack = Cache::kQueryPack;
  const ItemView v = View(pb, it);
  const int64_t dim = pb.head_size, rows = v.rows, stride = (rows + 15) / 16 * 16;
  const typename Cache::ItemBuffers buf(rows, stride, dim);
  const auto* qt = buf.qt;
  float* s = buf.s;
  float* m = s + kKeyTile * stride;
  float* l = m + stride;
  float* alpha = l + stride;
  float* o = alpha + stride;
  Cache::LoadQueryColumns(pb, v, it.kv_head, stride, buf.qt);
  StartRunningSums(stride, rows * dim, m, l, o);
  const T* keys[kKeyTile];
  const T* values[kKeyTile];
  for (int64_t k0 = v.key_begin; k0 < v.key_end; k0 += kKeyTile) {
    const int64_t n = std::min(kKeyTile, v.key_end - k0);
    TilePointers(pb, v, it.kv_head, k0, n, keys, values);
    for (int64_t rb = 0; rb < stride; rb += 16) {
      int64_t i = 0;
      for (; i + 4 <= n; i += 4) {
        const T *k_a = keys[i], *k_b = keys[i + 1], *k_c = keys[i + 2], *k_d = keys[i + 3];
        __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
        __m512 c = _mm512_setzero_ps(), e = _mm512_setzero_ps();
        for (int64_t d = 0; d < dim; d += kPack) {
          const auto q = Cache::QueryColumn(qt + d / kPack * stride + rb);
          a = Cache::Dot(a, q, Cache::KeyColumn(k_a + d));
          b = Cache::Dot(b, q, Cache::KeyColumn(k_b + d));
          c = Cache::Dot(c, q, Cache::KeyColumn(k_c + d));
          e = Cache::Dot(e, q, Cache::KeyColumn(k_d + d));
        }
        _mm512_storeu_ps(s + i * stride + rb, a);
        _mm512_storeu_ps(s + (i + 1) * stride + rb, b);
        _mm512_storeu_ps(s + (i + 2) * stride + rb, c);
        _mm512_storeu_ps(s + (i + 3) * stride + rb, e);
      }
      for (; i < n; ++i) {
        __m512 a = _mm512_setzero_ps();
        for (int64_t d = 0; d < dim; d += kPack) {
          a = Cache::Dot(a, Cache::QueryColumn(qt + d / kPack * stride + rb),
                         Cache::KeyColumn(keys[i] + d));
        }
        _mm512_storeu_ps(s + i * stride + rb, a);
      }
    }
    TileSoftmax(pb, v, k0, n, stride, s, m, l, alpha);
    // O = O * alpha + P V, row by row.
    Cache::LoadItemValues(buf, stride, values, n, dim);
    for (int64_t r = 0; r < rows; ++r) {
      Cache::AddItemValues(buf, stride, values, n, dim, r, alpha[r], o + r * dim);
    }
  }
  Cache::UnpermuteColumns(o, rows, dim);
  Finish(pb, v, it, o, l, m);
}

// The row kernel: one query row (a decode row, or one part of a split one) and all its heads
// (the item's kv heads and their query heads, H = kv_count * group). A group's G query heads are
// too few to fill a register of score rows (RunItemAvx512 pads them to 16), so the keys go
// across the lanes instead; and the item reads every kv head of each cache slot it visits, so
// that the cache is read in whole slots. Per tile of 16 keys and per head h:
//   S[i] = sum(q_h * k_i) (16 dot products, summed by Sum16), -inf past the tile's keys;
//   m' = max(m, max_i S[i]);  P = exp(S - m');  l = l exp(m - m') + sum P;
//   o = o exp(m - m') + sum_i P[i] v_i.
// No mask: every key of the item is at or before the row's position and inside its window
// (the item starts at the window's first key). The query is scaled
// (and rounded to bf16 for bf16 caches) once; S comes straight from the cache rows.
template <typename T>
LLM_AVX512_BF16 void RunRowAvx512(const Problem& pb, const WorkItem& it) {
  using Cache = Avx512Cache<T>;
  const ItemView v = View(pb, it);
  const int64_t dim = pb.head_size, group = pb.group, heads = it.kv_count * group;
  const int64_t width = it.kv_count * dim;  // columns of a slot the item reads
  typename Cache::RowBuffers buf(heads, dim, width);
  typename Cache::Query* q = buf.q;
  float* m = buf.m;
  float* l = buf.l;
  float* o = buf.o;
  const float* src = QueryRow(pb, v.first_token, it.kv_head * group);
  const __m512 scale = _mm512_set1_ps(pb.scale);
  for (int64_t c = 0; c < heads * dim; c += 16) Cache::ScaleQuery(src + c, scale, q + c);
  std::fill(m, m + heads, -std::numeric_limits<float>::infinity());
  std::fill(l, l + heads, 0.0f);
  std::fill(o, o + heads * dim, 0.0f);
  RowTiles<T> tiles(pb, v, it);
  __m512 dots[kLaneKeys];
  for (int64_t k0 = v.key_begin; k0 < v.key_end; k0 += kLaneKeys) {
    const int64_t n = std::min(kLaneKeys, v.key_end - k0);
    tiles.Advance(k0);
    const T* const* keys = tiles.keys();
    Cache::LoadRowValues(buf, tiles.values(), n, width);
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t offset = h / group * dim;  // the kv head's place in a cache slot
      const typename Cache::Query* qh = q + h * dim;
      for (int64_t i = 0; i < kLaneKeys; ++i) {
        __m512 a = _mm512_setzero_ps();
        if (i < n) {
          const T* k = keys[i] + offset;
          for (int64_t c = 0; c < dim; c += Cache::kRowStep) a = Cache::RowDot(a, qh + c, k + c);
        }
        dots[i] = a;
      }
      float alpha;
      const __m512 probs = RowSoftmax(dots, n, pb.softcap, m + h, l + h, &alpha);
      Cache::AddRowValues(buf, tiles.values(), n, width, dim, offset, probs, alpha, o + h * dim);
    }
  }
  Cache::UnpermuteColumns(o, heads, dim);
  Finish(pb, v, it, o, l, m);
}

std::atomic<int> g_threads{0};  // SetPagedAttentionThreads; 0: OpenMP's

int PagedAttentionThreads() {
  const int n = g_threads.load(std::memory_order_relaxed);
  return n > 0 ? n : omp_get_max_threads();
}

// The item functions for a call: `row` for decode rows when the vector path takes them all
// heads at a time (null: `item` does), `item` for the rest.
struct Kernels {
  void (*row)(const Problem&, const WorkItem&);
  void (*item)(const Problem&, const WorkItem&);
};
// f32 caches: AVX-512 (F and BW) for head sizes that are multiples of 16. bf16 caches: AVX512_BF16
// for multiples of 32. Else, on AVX2 and FMA, the AVX2 item for multiples of 8; else the portable
// loops.
Kernels PickKernels(DType cache_dtype, int64_t head_size, int64_t group, bool allow_vector) {
  if (cache_dtype == DType::kBF16) {
    if (allow_vector && HasAvx512Bf16() && head_size % 32 == 0) {
      return {group < kLaneKeys ? &RunRowAvx512<uint16_t> : nullptr, &RunItemAvx512<uint16_t>};
    }
    if (allow_vector && HasAvx2Fma() && head_size % 8 == 0)
      return {nullptr, &RunItemAvx2<uint16_t>};
    return {nullptr, &RunItemGeneric<uint16_t>};
  }
  if (allow_vector && HasAvx512() && HasAvx512Bw() && head_size % 16 == 0) {
    return {group < kLaneKeys ? &RunRowAvx512<float> : nullptr, &RunItemAvx512<float>};
  }
  if (allow_vector && HasAvx2Fma() && head_size % 8 == 0) return {nullptr, &RunItemAvx2<float>};
  return {nullptr, &RunItemGeneric<float>};
}

OpStatus RunTiled(const TensorView& out, const TensorView& query, const TensorView& key_cache,
                  const TensorView& value_cache, const AttentionMetadata& metadata,
                  const AttentionOptions& options, bool allow_avx512) {
  const int64_t num_tokens = query.shape[0];
  const int64_t num_blocks = key_cache.shape[0];
  Problem pb;
  pb.num_heads = query.shape[1];
  pb.head_size = query.shape[2];
  pb.block_size = key_cache.shape[1];
  pb.num_kv_heads = key_cache.shape[2];
  if (OpStatus s = CheckMetadata(metadata, num_tokens, num_blocks, pb.block_size); !s.ok()) {
    return s;
  }
  pb.group = pb.num_heads / pb.num_kv_heads;
  pb.max_blocks = metadata.block_tables.shape[1];
  pb.query = query.data_as<const float>();
  pb.query_stride = internal::TokenStride(query);
  pb.out = out.data_as<float>();
  pb.key_cache = key_cache.data;
  pb.value_cache = value_cache.data;
  pb.query_start_loc = metadata.query_start_loc.data_as<const int32_t>();
  pb.seq_lens = metadata.seq_lens.data_as<const int32_t>();
  pb.block_tables = metadata.block_tables.data_as<const int32_t>();
  pb.slot_stride = pb.num_kv_heads * pb.head_size;
  pb.block_stride = pb.block_size * pb.slot_stride;
  pb.scale = options.scale;
  pb.window = options.sliding_window;
  pb.softcap = options.softcap;

  // Work items, the costliest first; the lists are the calling thread's, kept between calls.
  thread_local std::vector<WorkItem> items;
  thread_local std::vector<Split> splits;
  thread_local std::vector<float> partials;
  items.clear();
  splits.clear();
  const int64_t num_seqs = metadata.seq_lens.shape[0];
  const int64_t tile_queries = std::max<int64_t>(1, kMaxTileRows / pb.group);
  const Kernels kernels = PickKernels(key_cache.dtype, pb.head_size, pb.group, allow_avx512);
  // Decode rows whose groups are narrower than a register: one item per row, all kv heads.
  const bool rows_all_heads = kernels.row != nullptr;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = pb.query_start_loc[s + 1] - pb.query_start_loc[s];
    const int64_t context = pb.seq_lens[s] - q_len;
    if (q_len == 1 && rows_all_heads) {
      const int64_t keys = context + 1 - WindowStart(context, pb.window);
      items.push_back({static_cast<int32_t>(s), 0, static_cast<int32_t>(pb.num_kv_heads), 0, 1, 0,
                       -1, -1, pb.num_heads * keys});
      continue;
    }
    for (int64_t q0 = 0; q0 < q_len; q0 += tile_queries) {
      const int64_t q1 = std::min(q_len, q0 + tile_queries);
      const int64_t keys = context + q1 - WindowStart(context + q0, pb.window);
      for (int64_t kvh = 0; kvh < pb.num_kv_heads; ++kvh) {
        items.push_back({static_cast<int32_t>(s), static_cast<int32_t>(kvh), 1,
                         static_cast<int32_t>(q0), static_cast<int32_t>(q1), 0, -1, -1,
                         (q1 - q0) * pb.group * keys});
      }
    }
  }
  // Fewer items than about two per thread: decode rows with long contexts are split over
  // their keys (whole key tiles of at least kMinSplitKeys keys each, from the window's first
  // key), so that every thread has work, and merged afterwards.
  int64_t work = 0;
  for (const WorkItem& it : items) work += it.cost * pb.head_size;
  const int64_t threads = work >= kMinParallelWork ? PagedAttentionThreads() : 1;
  if (threads > 1 && static_cast<int64_t>(items.size()) < 2 * threads) {
    const int64_t want = (2 * threads + items.size() - 1) / std::max<size_t>(items.size(), 1);
    const size_t unsplit = items.size();
    int64_t num_partials = 0;
    for (size_t i = 0; i < unsplit; ++i) {
      WorkItem& it = items[i];
      const ItemView view = View(pb, it);
      const int64_t num_keys = view.num_keys, first = view.key_begin;
      const int64_t parts = std::min(want, (num_keys - first) / kMinSplitKeys);
      if (it.q_end - it.q_begin != 1 || parts < 2) continue;
      const int64_t tiles = (num_keys - first + kKeyTile - 1) / kKeyTile;
      splits.push_back({it.seq, it.kv_head, it.kv_count, static_cast<int32_t>(num_partials),
                        static_cast<int32_t>(parts)});
      const WorkItem whole = it;
      for (int64_t p = 0; p < parts; ++p) {
        WorkItem part = whole;
        part.k_begin = static_cast<int32_t>(first + tiles * p / parts * kKeyTile);
        part.k_end =
            static_cast<int32_t>(std::min(num_keys, first + tiles * (p + 1) / parts * kKeyTile));
        part.partial = static_cast<int32_t>(num_partials++);
        part.cost = it.kv_count * pb.group * (part.k_end - part.k_begin);
        if (p == 0) {
          it = part;
        } else {
          items.push_back(part);
        }
      }
    }
    if (static_cast<int64_t>(partials.size()) < num_partials * PartialFloats(pb)) {
      partials.resize(num_partials * PartialFloats(pb));
    }
  }
  pb.partials = partials.data();
  std::sort(items.begin(), items.end(),
            [](const WorkItem& a, const WorkItem& b) { return a.cost > b.cost; });
  const int64_t num_items = static_cast<int64_t>(items.size());
  const WorkItem* list = items.data();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && num_items > 1)
  for (int64_t i = 0; i < num_items; ++i) {
    if (rows_all_heads && list[i].q_end - list[i].q_begin == 1) {
      kernels.row(pb, list[i]);
    } else {
      kernels.item(pb, list[i]);
    }
  }
  for (const Split& sp : splits) MergeSplit(pb, sp);
  return OpStatus::Ok();
}

}  // namespace

OpStatus PagedAttention(const TensorView& out, const TensorView& query, const TensorView& key_cache,
                        const TensorView& value_cache, const AttentionMetadata& metadata,
                        const AttentionOptions& options) {
  return RunTiled(out, query, key_cache, value_cache, metadata, options, /*allow_avx512=*/true);
}

OpStatus PagedAttention(const TensorView& out, const TensorView& query, const TensorView& key_cache,
                        const TensorView& value_cache, const AttentionMetadata& metadata,
                        float scale) {
  AttentionOptions options;
  options.scale = scale;
  return PagedAttention(out, query, key_cache, value_cache, metadata, options);
}

void SetPagedAttentionThreads(int n) { g_threads.store(std::max(n, 0), std::memory_order_relaxed); }

OpStatus PagedAttentionPortable(const TensorView& out, const TensorView& query,
                                const TensorView& key_cache, const TensorView& value_cache,
                                const AttentionMetadata& metadata,
                                const AttentionOptions& options) {
  return RunTiled(out, query, key_cache, value_cache, metadata, options, /*allow_avx512=*/false);
}

OpStatus PagedAttentionPortable(const TensorView& out, const TensorView& query,
                                const TensorView& key_cache, const TensorView& value_cache,
                                const AttentionMetadata& metadata, float scale) {
  AttentionOptions options;
  options.scale = scale;
  return PagedAttentionPortable(out, query, key_cache, value_cache, metadata, options);
}

}  // namespace llm::ops::cpu
