#include "tests/testing/fake_executor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace llm {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

FakeExecutor::FakeExecutor(const FakeExecutorConfig& config)
    : config_(config),
      batch_({.num_gpu_blocks = config.num_gpu_blocks,
              .num_cpu_blocks = config.num_cpu_blocks,
              .block_size = config.block_size,
              .vocab_size = config.vocab_size}),
      gpu_kv_(static_cast<size_t>(config.num_gpu_blocks) * config.block_size, -1),
      cpu_kv_(static_cast<size_t>(config.num_cpu_blocks) * config.block_size, -1) {}

TokenId FakeExecutor::NextToken(std::span<const TokenId> context_tail, int seq_index,
                                uint64_t request_seed) const {
  uint64_t h = Mix(config_.seed ^ Mix(request_seed) ^ (static_cast<uint64_t>(seq_index) << 32));
  for (TokenId t : context_tail) h = Mix(h ^ static_cast<uint32_t>(t));
  const TokenId eos = config_.eos_token_id;
  if (eos >= 0 && static_cast<double>(Mix(h ^ 0xe05) >> 11) * 0x1.0p-53 < config_.eos_probability) {
    return eos;
  }
  TokenId t = static_cast<TokenId>(h % static_cast<uint64_t>(config_.vocab_size));
  if (t == eos) t = (t + 1) % config_.vocab_size;
  return t;
}

// The BatchState checked every pair's range.
void FakeExecutor::CopyBlocks(std::span<const BlockPair> pairs, const std::vector<TokenId>& from,
                              std::vector<TokenId>* to) {
  const int bs = config_.block_size;
  for (const BlockPair& p : pairs) {
    std::copy_n(from.begin() + static_cast<int64_t>(p.src) * bs, bs,
                to->begin() + static_cast<int64_t>(p.dst) * bs);
  }
}

absl::Status FakeExecutor::Execute(const SchedulerOutput& step, ModelOutput* out) {
  ++num_steps_;
  out->step_id = step.step_id;
  out->sampled_token_ids.clear();
  out->logprobs.clear();
  RETURN_IF_ERROR(batch_.Apply(step));
  CopyBlocks(step.blocks_to_swap_out, gpu_kv_, &cpu_kv_);
  CopyBlocks(step.blocks_to_swap_in, cpu_kv_, &gpu_kv_);
  CopyBlocks(step.blocks_to_copy, gpu_kv_, &gpu_kv_);
  num_swapped_blocks_ += step.blocks_to_swap_in.size() + step.blocks_to_swap_out.size();
  num_copies_ += step.blocks_to_copy.size();
  // The "forward pass": each scheduled token's KV is the token itself, in its slot.
  const BatchInputs& in = batch_.inputs();
  for (int i = 0; i < in.num_tokens(); ++i) gpu_kv_[in.slot_mapping[i]] = in.token_ids[i];
  for (const BatchInputs::Sample& sample : in.samples) RETURN_IF_ERROR(Sample(sample, out));
  if (static_cast<int>(out->sampled_token_ids.size()) != step.total_num_samples) {
    return absl::InternalError(absl::StrCat(
        "fake executor: step ", step.step_id, " sampled ", out->sampled_token_ids.size(),
        " tokens; total_num_samples is ", step.total_num_samples));
  }
  // As a worker: it keeps what it sampled.
  batch_.AppendSampled(out->sampled_token_ids);
  return absl::OkStatus();
}

absl::Status FakeExecutor::Sample(const BatchInputs::Sample& sample, ModelOutput* out) {
  const BatchInputs& in = batch_.inputs();
  const int bs = config_.block_size;
  const int end = in.seq_lens[sample.batch_seq];
  const int32_t* table = in.block_tables.data() + int64_t{sample.batch_seq} * in.max_blocks;
  auto kv = [&](int i) { return gpu_kv_[int64_t{table[i / bs]} * bs + i % bs]; };
  const BatchInputs::SeqRef ref = in.seqs[sample.batch_seq];
  const BatchState::Request& req = *batch_.FindRequest(ref.slot);
  if (config_.verify_kv) {
    const std::vector<TokenId>& tokens = req.seqs[ref.index].token_ids;
    const int first =
        config_.attention_window > 0 ? std::max(0, end - config_.attention_window) : 0;
    for (int i = first; i < end; ++i) {
      if (kv(i) != tokens[i]) {
        return absl::InternalError(absl::StrCat("fake executor: request ", req.request_id,
                                                " sequence ", ref.index, ": the KV of token ", i,
                                                " is ", kv(i), "; token ", tokens[i], " expected"));
      }
    }
  }
  scratch_.clear();
  for (int i = std::max(0, end - config_.context_window); i < end; ++i) scratch_.push_back(kv(i));
  out->sampled_token_ids.push_back(
      NextToken(scratch_, sample.seq_index, req.params.seed.value_or(0)));
  return absl::OkStatus();
}

}  // namespace llm
