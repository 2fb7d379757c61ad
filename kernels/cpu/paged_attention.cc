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
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

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

// a . b over n floats, in 8 independent lanes so that the compiler can vectorize it.
float Dot(const float* a, const float* b, int64_t n) {
  float lanes[8] = {};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    for (int j = 0; j < 8; ++j) lanes[j] += a[d + j] * b[d + j];
  }
  float sum = 0.0f;
  for (int j = 0; j < 8; ++j) sum += lanes[j];
  for (; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

}  // namespace

OpStatus PagedAttention(const TensorView& out, const TensorView& query, const TensorView& key_cache,
                        const TensorView& value_cache, const AttentionMetadata& metadata,
                        float scale) {
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
  const float* kc = key_cache.data_as<const float>();
  const float* vc = value_cache.data_as<const float>();
  const int64_t slot_stride = num_kv_heads * head_size;   // cache[b][i][h][d]: one slot
  const int64_t block_stride = block_size * slot_stride;  // one block

  // Per query head of one kv head's group: scores of one block, running max and sum, and
  // the unnormalized output.
  std::vector<float> scores(group * block_size);
  std::vector<float> m(group), l(group), acc(group * head_size);
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = qsl[s + 1] - qsl[s];
    const int32_t* table = tables + s * max_blocks;
    for (int64_t j = 0; j < q_len; ++j) {
      const int64_t t = qsl[s] + j;
      const int64_t num_keys = seq_lens[s] - q_len + j + 1;  // positions 0 .. p
      for (int64_t kvh = 0; kvh < num_kv_heads; ++kvh) {
        // q[t][kvh * group + g][:] for the group's query heads, which share every key and value.
        const float* q = query.data_as<const float>() + (t * num_heads + kvh * group) * head_size;
        std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
        std::fill(l.begin(), l.end(), 0.0f);
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t b = 0; b * block_size < num_keys; ++b) {
          const int64_t n = std::min(block_size, num_keys - b * block_size);
          const float* kb = kc + table[b] * block_stride + kvh * head_size;
          const float* vb = vc + table[b] * block_stride + kvh * head_size;
          for (int64_t i = 0; i < n; ++i) {
            const float* k = kb + i * slot_stride;  // key_cache[table[b]][i][kvh][:]
            for (int64_t g = 0; g < group; ++g) {
              scores[g * block_size + i] = Dot(q + g * head_size, k, head_size) * scale;
            }
          }
          for (int64_t g = 0; g < group; ++g) {
            float* sc = scores.data() + g * block_size;
            float* a = acc.data() + g * head_size;
            const float m_new = std::max(m[g], *std::max_element(sc, sc + n));
            const float correction = std::exp(m[g] - m_new);  // 0 on the first block
            l[g] *= correction;
            for (int64_t d = 0; d < head_size; ++d) a[d] *= correction;
            for (int64_t i = 0; i < n; ++i) {
              const float p = std::exp(sc[i] - m_new);
              l[g] += p;
              const float* v = vb + i * slot_stride;  // value_cache[table[b]][i][kvh][:]
              for (int64_t d = 0; d < head_size; ++d) a[d] += p * v[d];
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

}  // namespace llm::ops::cpu
