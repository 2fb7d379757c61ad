// Mixture-of-experts routing on the host: from the router's logits, each token's top-k experts
// and their weights, then the tokens grouped by expert (vLLM's fused_moe idea: tokens sorted by
// expert, so that each active expert runs one GEMM over its tokens and its rows are scattered
// back, weighted, into the output).
//
//   logits[t][e]  ->  p[t][e] = softmax_e(logits[t])           (fp32, max-subtracted)
//                 ->  top-k of p[t] (ties: the lower expert)   weights w = p, or w / sum(w)
//                     when `normalize` (Mixtral; Qwen-MoE's norm_topk_prob)
//   grouped:  tokens[offsets[e] .. offsets[e + 1])  the tokens routed to expert e, ascending
//             weights[...]                           their weights for e
//
// Thread-safety: a MoeRouting is plain data; Route() writes only *this.
#ifndef LLM_WORKER_SERVICE_MODEL_MOE_ROUTING_H_
#define LLM_WORKER_SERVICE_MODEL_MOE_ROUTING_H_

#include <cstdint>
#include <span>
#include <vector>

namespace llm {

struct MoeRouting {
  std::vector<int32_t> offsets;  // [num_experts + 1]
  std::vector<int32_t> tokens;   // [num_tokens * k], grouped by expert
  std::vector<float> weights;    // [num_tokens * k], alongside tokens

  int32_t count(int e) const { return offsets[e + 1] - offsets[e]; }

  // Routes `num_tokens` tokens from logits [num_tokens, num_experts] (row-major), keeping the
  // buffers' capacity from call to call. Requires 1 <= k <= num_experts.
  void Route(std::span<const float> logits, int64_t num_tokens, int num_experts, int k,
             bool normalize);

 private:
  std::vector<int32_t> chosen_;  // [num_tokens * k]: each token's experts
  std::vector<float> chosen_w_;  // and their weights
  std::vector<float> probs_;     // one token's softmax
  std::vector<int32_t> fill_;    // the sort's next slot per expert
};

}  // namespace llm

#endif  // LLM_WORKER_SERVICE_MODEL_MOE_ROUTING_H_
