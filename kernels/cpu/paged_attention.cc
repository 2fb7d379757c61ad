// Paged attention on the CPU for a batch that mixes prefill chunks and decode tokens.
//
// For each sequence s, query token j (position p = seq_lens[s] - q_len + j) and query head h
// (kv head h / (Hq / Hkv)), one pass over s's blocks with an online softmax: for each block,
// the scores of its keys at positions <= p, then the running max m, sum l and weighted value
// sum acc are rescaled by exp(m_old - m_new) and extended with the block's keys:
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

  std::vector<float> scores(block_size);
  std::vector<float> acc(head_size);
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = qsl[s + 1] - qsl[s];
    const int32_t* table = tables + s * max_blocks;
    for (int64_t j = 0; j < q_len; ++j) {
      const int64_t t = qsl[s] + j;
      const int64_t num_keys = seq_lens[s] - q_len + j + 1;  // positions 0 .. p
      for (int64_t h = 0; h < num_heads; ++h) {
        const int64_t kvh = h / group;
        const float* q = query.data_as<const float>() + (t * num_heads + h) * head_size;
        float m = -std::numeric_limits<float>::infinity();
        float l = 0.0f;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t b = 0; b * block_size < num_keys; ++b) {
          const int64_t n = std::min(block_size, num_keys - b * block_size);
          const float* kb = kc + table[b] * block_stride + kvh * head_size;
          const float* vb = vc + table[b] * block_stride + kvh * head_size;
          float block_max = -std::numeric_limits<float>::infinity();
          for (int64_t i = 0; i < n; ++i) {
            const float* k = kb + i * slot_stride;  // key_cache[table[b]][i][kvh][:]
            float dot = 0.0f;
            for (int64_t d = 0; d < head_size; ++d) dot += q[d] * k[d];
            scores[i] = dot * scale;
            block_max = std::max(block_max, scores[i]);
          }
          const float m_new = std::max(m, block_max);
          const float correction = std::exp(m - m_new);  // 0 on the first block
          l *= correction;
          for (int64_t d = 0; d < head_size; ++d) acc[d] *= correction;
          for (int64_t i = 0; i < n; ++i) {
            const float p = std::exp(scores[i] - m_new);
            l += p;
            const float* v = vb + i * slot_stride;  // value_cache[table[b]][i][kvh][:]
            for (int64_t d = 0; d < head_size; ++d) acc[d] += p * v[d];
          }
          m = m_new;
        }
        float* o = out.data_as<float>() + (t * num_heads + h) * head_size;
        const float inv_l = 1.0f / l;
        for (int64_t d = 0; d < head_size; ++d) o[d] = acc[d] * inv_l;
      }
    }
  }
  return OpStatus::Ok();
}

}  // namespace llm::ops::cpu
