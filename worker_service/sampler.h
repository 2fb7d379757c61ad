// Turns each sequence's logits into its next token, as vLLM's sampler does:
//
//   1. penalties on the logits: repetition (HF style: a logit of a token seen in the prompt or
//      the output is divided by the penalty when positive, multiplied when negative), then
//      frequency (- f * count in the output) and presence (- p if in the output);
//   2. greedy (temperature 0): the argmax; otherwise logits / temperature, then min-p (drop
//      tokens whose probability is below min_p * the largest), top-k, top-p (the smallest
//      set of most likely tokens whose mass reaches top_p), and one draw from what is left,
//      renormalized;
//   3. logprobs, when asked: of the sampled token and the top N, from the model's raw
//      distribution (log_softmax of the logits before penalties and temperature: vLLM v1's
//      default "raw_logprobs").
//
// Each sequence draws from its own RNG (SequenceSampler), seeded from the request's seed and
// the sequence's index, so the same seed and inputs give the same tokens whatever else is in
// the batch. Without a seed, the RNG is seeded from a random device.
//
// Thread-safety: Sampler is stateless; a SequenceSampler belongs to one sequence.
#ifndef LLM_WORKER_SERVICE_SAMPLER_H_
#define LLM_WORKER_SERVICE_SAMPLER_H_

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/sampling_params.h"
#include "common/types.h"

namespace llm {

// Per-sequence sampling state: the parameters, the RNG and the token counts penalties need.
class SequenceSampler {
 public:
  SequenceSampler(const SamplingParams& params, int seq_index,
                  std::span<const TokenId> prompt_token_ids);

  const SamplingParams& params() const { return params_; }
  // Call with each token appended to the sequence's output.
  void AddOutputToken(TokenId token);

 private:
  friend class Sampler;

  SamplingParams params_;
  std::mt19937_64 rng_;
  absl::flat_hash_set<TokenId> prompt_tokens_;       // for the repetition penalty
  absl::flat_hash_map<TokenId, int> output_counts_;  // for all three penalties
};

struct SampledToken {
  TokenId token = 0;
  float logprob = 0;  // of `token`, raw distribution; set when logprobs were asked
  std::vector<std::pair<TokenId, float>> top_logprobs;  // most likely first
};

class Sampler {
 public:
  // logits: [rows.size(), vocab_size], one row per sequence, modified in place.
  static std::vector<SampledToken> Sample(std::span<float> logits, int vocab_size,
                                          std::span<SequenceSampler* const> rows);

  // Step 1 alone, exposed for tests: applies the sequence's penalties to one row.
  static void ApplyPenalties(const SequenceSampler& seq, std::span<float> row);
  // The distribution step 2 draws from (after temperature, min-p, top-k, top-p), as
  // probabilities over the vocabulary (zeros for excluded tokens); for tests. Not for greedy.
  static std::vector<double> FilteredProbs(const SamplingParams& params,
                                           std::span<const float> row);
};

}  // namespace llm

#endif  // LLM_WORKER_SERVICE_SAMPLER_H_
