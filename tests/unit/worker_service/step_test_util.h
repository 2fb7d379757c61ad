// Hand-built steps for the worker tests (the scheduler builds real ones).
#ifndef LLM_TESTS_UNIT_WORKER_SERVICE_STEP_TEST_UTIL_H_
#define LLM_TESTS_UNIT_WORKER_SERVICE_STEP_TEST_UTIL_H_

#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "common/sampling_params.h"
#include "protocol/scheduler_output.h"

namespace llm {

// Step 1: admits request `request_id` in slot 0 with one sequence whose block table is
// `block_ids`, computes its whole `prompt` and samples one token. The step's views point into
// `request_id`, `prompt` and `params`, which must outlive it.
inline SchedulerOutput OnePrefillStep(std::string_view request_id, std::span<const TokenId> prompt,
                                      const SamplingParams& params,
                                      std::vector<BlockId> block_ids) {
  SchedulerOutput step;
  step.step_id = 1;
  step.block_ids = std::move(block_ids);
  step.seqs.push_back({.index = 0,
                       .new_to_workers = true,
                       .replace_block_table = true,
                       .block_ids = {0, static_cast<uint32_t>(step.block_ids.size())}});
  step.new_requests.push_back({.slot = 0,
                               .request_id = request_id,
                               .prompt_token_ids = prompt,
                               .sampling_params = &params,
                               .num_scheduled_tokens = static_cast<int>(prompt.size()),
                               .num_samples = 1,
                               .seqs = {0, 1}});
  return step;
}

}  // namespace llm

#endif  // LLM_TESTS_UNIT_WORKER_SERVICE_STEP_TEST_UTIL_H_
