// Turns each sequence's logits into its next token, as vLLM's sampler does:
//
//   0. logit_bias: each listed token's bias added to its logit (vLLM v1 applies it among the
//      logits processors that can move the argmax, before the penalties); then a structured
//      output's token mask: the logit of every token its grammar does not allow now is -inf;
//   1. penalties on the logits: repetition (HF style: a logit of a token seen in the prompt or
//      the output is divided by the penalty when positive, multiplied when negative), then
//      frequency (- f * count in the output) and presence (- p if in the output);
//   2. greedy (temperature below 1e-5, as vLLM: smaller ones would overflow the scaled
//      logits): the argmax, lowest token id on ties; otherwise logits / temperature, then min-p
//      (drop tokens whose probability is below min_p * the largest), top-k, top-p (the smallest set
//      of most likely tokens whose mass reaches top_p), and one draw from what is left,
//      renormalized: the exponential race of kernels/philox.h;
//   3. logprobs, when asked: of the sampled token and the top N, from the model's raw
//      distribution (log_softmax of the logits before bias, mask, penalties and temperature:
//      vLLM v1's default "raw_logprobs").
//
// Each sequence draws from its own Philox stream: its key comes from the request's seed and the
// sequence's index, its counter from the sample's index (the sequence's output length) and the
// token id, so the same seed and inputs give the same tokens whatever else is in the batch,
// and the same as the device sampler (worker_service/device_sampler.h), which follows this
// file's arithmetic step by step (float logits scaled as s = z / temperature; min-p as s - max
// >= log(min_p); most likely first means s descending, then token id ascending; top-p on the
// fixed-point masses of philox::MassFixed).
//
// The state sampling reads (params, seed, prompt tokens, each sequence's counter and counts) is
// the worker's BatchState's (protocol/batch_state.h), held once and kept in step with the
// sequences; a SampleRow points into it.
//
// Thread-safety: Sampler is stateless.
#ifndef LLM_WORKER_SERVICE_SAMPLER_H_
#define LLM_WORKER_SERVICE_SAMPLER_H_

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "common/sampling_params.h"
#include "common/types.h"
#include "protocol/batch_state.h"

namespace llm {

// What one row of a step samples with: the request's params and prompt-token set, and the
// sequence's key and state. Sampling does not advance the state: the sampled token does, once
// recorded in the sequence (BatchState::AppendSampled, SamplingState::AddOutputToken).
struct SampleRow {
  const SamplingParams* params = nullptr;
  // The prompt's distinct tokens, for the repetition penalty (RepetitionPenaltyTokens).
  std::span<const TokenId> prompt_tokens;
  uint64_t key = 0;  // philox::SequenceKey(the request's seed, the sequence's index)
  // The sequence's counter and output counts; a DeviceSampler records its penalty slot here.
  SamplingState* state = nullptr;
  // The tokens a structured output allows now: bit (id % 32) of allowed[id / 32]; at least one
  // is set. Null: every token.
  const uint32_t* allowed = nullptr;
};

// The row of sequence `seq_index` of the request in `slot`, which `batch` holds.
SampleRow SampleRowOf(BatchState& batch, int32_t slot, int seq_index);

struct SampledToken {
  TokenId token = 0;
  float logprob = 0;  // of `token`, raw distribution; set when logprobs were asked
  std::vector<std::pair<TokenId, float>> top_logprobs;  // most likely first
};

class Sampler {
 public:
  // logits: [rows.size(), vocab_size], one row per sequence, modified in place.
  static std::vector<SampledToken> Sample(std::span<float> logits, int vocab_size,
                                          std::span<const SampleRow> rows);

  // Step 0 alone: adds the params' logit_bias to a row of logits (ids outside it skipped).
  static void ApplyLogitBias(const SamplingParams& params, std::span<float> logits);
  // The mask of step 0 alone: -inf for each id of the row whose bit in `allowed` is clear.
  static void ApplyAllowed(const uint32_t* allowed, std::span<float> logits);
  // Step 1 alone, exposed for tests: applies the row's penalties to its logits.
  static void ApplyPenalties(const SampleRow& row, std::span<float> logits);
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
