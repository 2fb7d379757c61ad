#include "worker_service/model/moe_routing.h"

#include <algorithm>
#include <cmath>

namespace llm {

void MoeRouting::Route(std::span<const float> logits, int64_t num_tokens, int num_experts, int k,
                       bool normalize) {
  const size_t n = static_cast<size_t>(num_tokens) * static_cast<size_t>(k);
  chosen_.resize(n);
  chosen_w_.resize(n);
  probs_.resize(static_cast<size_t>(num_experts));
  offsets.assign(static_cast<size_t>(num_experts) + 1, 0);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* row = logits.data() + t * num_experts;
    const float max = *std::max_element(row, row + num_experts);
    float sum = 0.0f;
    for (int e = 0; e < num_experts; ++e) sum += probs_[e] = std::exp(row[e] - max);
    for (int e = 0; e < num_experts; ++e) probs_[e] /= sum;
    // Top-k by selection (k is small): the largest remaining, the lower expert on ties.
    int32_t* ex = chosen_.data() + t * k;
    float* w = chosen_w_.data() + t * k;
    float picked = 0.0f;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < num_experts; ++e) {
        if (std::find(ex, ex + j, e) != ex + j) continue;
        if (best < 0 || probs_[e] > probs_[best]) best = e;
      }
      ex[j] = best;
      w[j] = probs_[best];
      picked += w[j];
      ++offsets[static_cast<size_t>(best) + 1];
    }
    if (normalize) {
      for (int j = 0; j < k; ++j) w[j] /= picked;
    }
  }
  // Counting sort by expert; tokens stay ascending within an expert.
  for (int e = 0; e < num_experts; ++e) offsets[e + 1] += offsets[e];
  tokens.resize(n);
  weights.resize(n);
  std::vector<int32_t>& fill = fill_;
  fill.assign(offsets.begin(), offsets.end() - 1);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int j = 0; j < k; ++j) {
      const size_t i = static_cast<size_t>(t * k + j);
      const int32_t at = fill[static_cast<size_t>(chosen_[i])]++;
      tokens[static_cast<size_t>(at)] = static_cast<int32_t>(t);
      weights[static_cast<size_t>(at)] = chosen_w_[i];
    }
  }
}

}  // namespace llm
