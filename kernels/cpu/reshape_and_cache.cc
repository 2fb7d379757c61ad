// Writes this step's keys and values (token-strided views allowed: token t's row of Hkv * D
// values starts at data + t * TokenStride) into their slots of the paged KV cache, on the CPU.
#include <cstring>
#include <string>

#include "common/half.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/op_check.h"

namespace llm::ops::cpu {

OpStatus ReshapeAndCache(const TensorView& key, const TensorView& value,
                         const TensorView& key_cache, const TensorView& value_cache,
                         const TensorView& slot_mapping) {
  const int64_t num_tokens = slot_mapping.shape[0];
  const int64_t num_slots = key_cache.shape[0] * key_cache.shape[1];
  const int64_t row = key_cache.shape[2] * key_cache.shape[3];  // Hkv * D floats per token
  const int64_t k_stride = internal::TokenStride(key), v_stride = internal::TokenStride(value);
  // Check every slot first, so that a bad mapping writes nothing.
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = internal::IndexAt(slot_mapping, t);
    if (slot != -1 && (slot < 0 || slot >= num_slots)) {
      return internal::Error("ReshapeAndCache",
                             "slot_mapping[" + std::to_string(t) + "] = " + std::to_string(slot) +
                                 " is outside [0, " + std::to_string(num_slots) +
                                 ") (num_blocks * block_size) and is not -1 (padding)");
    }
  }
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = internal::IndexAt(slot_mapping, t);
    if (slot == -1) continue;
    // cache[slot / bs][slot % bs][h][d] = kv[t][h][d]: slots are consecutive rows of Hkv * D.
    if (key_cache.dtype == DType::kBF16) {  // rounded to nearest even
      uint16_t* kc = key_cache.data_as<uint16_t>() + slot * row;
      uint16_t* vc = value_cache.data_as<uint16_t>() + slot * row;
      const float* k = key.data_as<const float>() + t * k_stride;
      const float* v = value.data_as<const float>() + t * v_stride;
      for (int64_t i = 0; i < row; ++i) {
        kc[i] = FloatToBf16(k[i]);
        vc[i] = FloatToBf16(v[i]);
      }
      continue;
    }
    std::memcpy(key_cache.data_as<float>() + slot * row, key.data_as<const float>() + t * k_stride,
                row * sizeof(float));
    std::memcpy(value_cache.data_as<float>() + slot * row,
                value.data_as<const float>() + t * v_stride, row * sizeof(float));
  }
  return OpStatus::Ok();
}

}  // namespace llm::ops::cpu
