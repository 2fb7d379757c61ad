#include "scheduler_service/core/block_table.h"

namespace llm {

int BlockTable::NumBlocksTouchedByAppend(int num_new_tokens, int num_lookahead_slots) const {
  const int n = num_new_tokens + num_lookahead_slots;
  if (n <= 0) return 0;
  const int first = num_tokens_ / block_size_;
  const int last = (num_tokens_ + n - 1) / block_size_;
  return last - first + 1;
}

}  // namespace llm
