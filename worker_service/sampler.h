// Turns each sequence's logits into its next token, as vLLM's sampler does:
//
//   1. penalties on the logits: repetition (HF style: a logit of a token seen in the prompt or
//      the output is divided by the penalty when positive, multiplied when negative), then
//      frequency (- f * count in the output) and presence (- p if in the output);
//   2. greedy (temperature below 1e-5, as vLLM: smaller ones would overflow the scaled
//      logits): the argmax, lowest token id on ties; otherwise logits / temperature, then min-p
//      (drop tokens whose probability is below min_p * the largest), top-k, top-p (the smallest set
//      of most likely tokens whose mass reaches top_p), and one draw from what is left,
//      renormalized: the exponential race of kernels/philox.h;
//   3. logprobs, when asked: of the sampled token and the top N, from the model's raw
//      distribution (log_softmax of the logits before penalties and temperature: vLLM v1's
//      default "raw_logprobs").
//
// Each sequence draws from its own Philox stream (SequenceSampler): its key comes from the
// request's seed and the sequence's index, its counter from the sample's index and the token
// id, so the same seed and inputs give the same tokens whatever else is in the batch, and the
// same as the device sampler (worker_service/device_sampler.h), which follows this file's
// arithmetic step by step (float logits scaled as s = z / temperature; min-p as s - max >=
// log(min_p); most likely first means s descending, then token id ascending; top-p on the
// fixed-point masses of philox::MassFixed). Without a seed, a random 64-bit seed is drawn once
// from a random device.
//
// Thread-safety: Sampler is stateless; a SequenceSampler belongs to one sequence.
#ifndef LLM_WORKER_SERVICE_SAMPLER_H_
#define LLM_WORKER_SERVICE_SAMPLER_H_

#include <cstdint>
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

  // The Philox key (from the seed and the sequence index) and the number of tokens sampled so
  // far (the counter of the next draw).
  uint64_t key() const { return key_; }
  uint64_t num_samples() const { return num_samples_; }
  // Whether any of the three penalties is on.
  bool has_penalties() const;
  const absl::flat_hash_set<TokenId>& prompt_tokens() const { return prompt_tokens_; }

 private:
  friend class Sampler;
  friend class DeviceSampler;

  SamplingParams params_;
  uint64_t key_;
  uint64_t num_samples_ = 0;
  int device_slot_ = -1;                             // DeviceSampler's penalty state, -1 when none
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
  // The tokens that survive min-p, top-k and top-p (not for greedy), for tests.
  static std::vector<TokenId> KeptTokens(const SamplingParams& params, std::span<const float> row);
  // Temperatures below this sample greedily.
  static constexpr double kGreedyBelow = 1e-5;
  static bool IsGreedy(const SamplingParams& params);
  // log(min_p) as the samplers compare with it (-inf when min-p is off).
  static float LogMinP(const SamplingParams& params);
};

}  // namespace llm

#endif  // LLM_WORKER_SERVICE_SAMPLER_H_
