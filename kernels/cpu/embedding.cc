// Embedding lookup on the CPU: out[t][h] = table[token_ids[t]][h].
#include <cstring>
#include <string>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/op_check.h"

namespace llm::ops::cpu {

OpStatus Embedding(const TensorView& out, const TensorView& token_ids, const TensorView& table) {
  const int64_t num_tokens = token_ids.shape[0];
  const int64_t vocab_size = table.shape[0], hidden = table.shape[1];
  // Check every id before writing anything, so that a bad batch leaves out untouched.
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t id = internal::IndexAt(token_ids, t);
    if (id < 0 || id >= vocab_size) {
      return internal::Error("Embedding", "token_ids[" + std::to_string(t) +
                                              "] = " + std::to_string(id) + " is outside [0, " +
                                              std::to_string(vocab_size) + ")");
    }
  }
  const float* tab = table.data_as<const float>();
  float* o = out.data_as<float>();
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t id = internal::IndexAt(token_ids, t);
    // out[t][:] = table[id][:]
    std::memcpy(o + t * hidden, tab + id * hidden, hidden * sizeof(float));
  }
  return OpStatus::Ok();
}

}  // namespace llm::ops::cpu
