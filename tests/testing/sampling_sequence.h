// One sequence's sampling inputs held outside a BatchState, for the sampler tests: what the
// worker's BatchState keeps for it (the request's params and prompt-token set, the sequence's
// key and state), and the row the samplers read.
#ifndef LLM_TESTS_TESTING_SAMPLING_SEQUENCE_H_
#define LLM_TESTS_TESTING_SAMPLING_SEQUENCE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "common/sampling_params.h"
#include "common/types.h"
#include "kernels/philox.h"
#include "protocol/batch_state.h"
#include "worker_service/sampler.h"

namespace llm::testing {

// Sequence `seq_index` of a request with `params` (seed 0 when it has none) and `prompt`. The
// row points into it: keep it in place while a row is in use.
struct SamplingSequence {
  SamplingParams params;
  std::vector<TokenId> prompt_tokens;
  uint64_t key = 0;
  SamplingState state;

  SamplingSequence(const SamplingParams& p, int seq_index, std::span<const TokenId> prompt = {})
      : params(p),
        prompt_tokens(RepetitionPenaltyTokens(p, prompt)),
        key(philox::SequenceKey(p.seed.value_or(0), seq_index)) {}
  SamplingSequence(const SamplingSequence&) = delete;
  SamplingSequence& operator=(const SamplingSequence&) = delete;

  SampleRow row() {
    return {.params = &params, .prompt_tokens = prompt_tokens, .key = key, .state = &state};
  }
  // Records a token sampled for the sequence, as BatchState::AppendSampled does.
  void Append(TokenId token) { state.AddOutputToken(token, params.has_penalties()); }
};

}  // namespace llm::testing

#endif  // LLM_TESTS_TESTING_SAMPLING_SEQUENCE_H_
