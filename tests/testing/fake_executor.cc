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

absl::Status Internal(auto&&... parts) {
  return absl::InternalError(absl::StrCat("fake executor: ", parts...));
}

}  // namespace

FakeExecutor::FakeExecutor(const FakeExecutorConfig& config)
    : config_(config),
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

absl::Status FakeExecutor::CopyBlocks(std::span<const BlockPair> pairs, std::vector<TokenId>* from,
                                      int from_blocks, std::vector<TokenId>* to, int to_blocks,
                                      const char* what) {
  const int bs = config_.block_size;
  for (const BlockPair& p : pairs) {
    if (p.src < 0 || p.src >= from_blocks || p.dst < 0 || p.dst >= to_blocks) {
      return Internal(what, " pair (", p.src, ", ", p.dst, ") out of range");
    }
    std::copy_n(from->begin() + static_cast<int64_t>(p.src) * bs, bs,
                to->begin() + static_cast<int64_t>(p.dst) * bs);
  }
  return absl::OkStatus();
}

absl::Status FakeExecutor::Execute(const SchedulerOutput& step, ModelOutput* out) {
  ++num_steps_;
  out->step_id = step.step_id;
  out->sampled_token_ids.clear();
  for (int32_t slot : step.finished_slots) {
    if (requests_.erase(slot) == 0) return Internal("finished slot ", slot, " is unknown");
  }
  const int g = config_.num_gpu_blocks, c = config_.num_cpu_blocks;
  RETURN_IF_ERROR(CopyBlocks(step.blocks_to_swap_out, &gpu_kv_, g, &cpu_kv_, c, "swap-out"));
  RETURN_IF_ERROR(CopyBlocks(step.blocks_to_swap_in, &cpu_kv_, c, &gpu_kv_, g, "swap-in"));
  RETURN_IF_ERROR(CopyBlocks(step.blocks_to_copy, &gpu_kv_, g, &gpu_kv_, g, "copy"));
  num_swapped_blocks_ += step.blocks_to_swap_in.size() + step.blocks_to_swap_out.size();
  num_copies_ += step.blocks_to_copy.size();
  for (const ScheduledRequest& r : step.new_requests) RETURN_IF_ERROR(Apply(r, true, step, out));
  for (const ScheduledRequest& r : step.cached_requests) {
    RETURN_IF_ERROR(Apply(r, false, step, out));
  }
  if (static_cast<int>(out->sampled_token_ids.size()) != step.total_num_samples) {
    return Internal("step ", step.step_id, " sampled ", out->sampled_token_ids.size(),
                    " tokens; total_num_samples is ", step.total_num_samples);
  }
  return absl::OkStatus();
}

absl::Status FakeExecutor::Apply(const ScheduledRequest& r, bool is_new,
                                 const SchedulerOutput& step, ModelOutput* out) {
  const std::string id(r.request_id);
  WorkerRequest* req;
  if (is_new) {
    auto [it, inserted] = requests_.try_emplace(r.slot);
    if (!inserted) return Internal("new request ", id, " in a slot in use");
    req = &it->second;
    req->id = id;
    req->prompt.assign(r.prompt_token_ids.begin(), r.prompt_token_ids.end());
    req->seed = r.sampling_params->seed.value_or(0);
    req->seqs.resize(r.sampling_params->n);
  } else {
    auto it = requests_.find(r.slot);
    if (it == requests_.end() || it->second.id != r.request_id) {
      return Internal("cached request ", id, " is unknown");
    }
    req = &it->second;
    if (!r.resumed_from_preemption && r.num_computed_tokens != req->num_computed_tokens) {
      return Internal("request ", id, ": ", r.num_computed_tokens,
                      " tokens computed per the scheduler; ", req->num_computed_tokens,
                      " per the worker");
    }
  }
  req->num_computed_tokens = r.num_computed_tokens;
  // Sequences not listed have finished.
  std::vector<bool> listed(req->seqs.size(), false);
  for (const ScheduledSequence& s : step.Seqs(r)) {
    if (s.index < 0 || s.index >= static_cast<int>(req->seqs.size())) {
      return Internal("request ", id, " lists sequence ", s.index);
    }
    listed[s.index] = true;
  }
  for (size_t i = 0; i < req->seqs.size(); ++i) {
    if (!listed[i]) req->seqs[i] = {};
  }
  const int bs = config_.block_size;
  const int begin = r.num_computed_tokens, end = begin + r.num_scheduled_tokens;
  int num_tokens = -1;
  for (const ScheduledSequence& s : step.Seqs(r)) {
    WorkerSeq& seq = req->seqs[s.index];
    const std::span<const TokenId> tokens = step.NewTokenIds(s);
    if (s.new_to_workers) {
      if (!seq.tokens.empty()) return Internal(id, ": sequence ", s.index, " is known");
      seq.tokens = req->prompt;
    } else if (seq.tokens.empty()) {
      return Internal(id, ": sequence ", s.index, " is unknown");
    }
    seq.tokens.insert(seq.tokens.end(), tokens.begin(), tokens.end());
    const std::span<const BlockId> ids = step.BlockIds(s);
    if (s.replace_block_table) seq.table.clear();
    seq.table.insert(seq.table.end(), ids.begin(), ids.end());
    for (BlockId id : seq.table) {
      if (id < 0 || id >= config_.num_gpu_blocks) {
        return Internal(id, ": block ", id, " out of range");
      }
    }
    if (num_tokens >= 0 && num_tokens != static_cast<int>(seq.tokens.size())) {
      return Internal(id, ": live sequences of different lengths");
    }
    num_tokens = static_cast<int>(seq.tokens.size());
    if (end > num_tokens || static_cast<int64_t>(seq.table.size()) * bs < end) {
      return Internal(id, ": computing tokens [", begin, ", ", end, ") of ", num_tokens, " with ",
                      seq.table.size(), " blocks");
    }
    for (int i = begin; i < end; ++i) gpu_kv_[Slot(seq, i)] = seq.tokens[i];
  }
  req->num_computed_tokens = end;
  if (r.num_samples == 0) return absl::OkStatus();
  if (end != num_tokens) {
    return Internal(id, ": samples with ", end, " of ", num_tokens, " tokens computed");
  }
  const bool fork = static_cast<int>(r.seqs.size) != r.num_samples;
  if (fork && r.seqs.size != 1) {
    return Internal(id, ": ", r.num_samples, " samples for ", r.seqs.size, " sequences");
  }
  for (const ScheduledSequence& s : step.Seqs(r)) {
    const WorkerSeq& seq = req->seqs[s.index];
    if (config_.verify_kv) {
      for (int i = 0; i < end; ++i) {
        if (gpu_kv_[Slot(seq, i)] != seq.tokens[i]) {
          return Internal(id, " sequence ", s.index, ": the KV of token ", i, " is ",
                          gpu_kv_[Slot(seq, i)], "; token ", seq.tokens[i], " expected");
        }
      }
    }
    const int window = std::min(end, config_.context_window);
    scratch_.clear();
    for (int i = end - window; i < end; ++i) scratch_.push_back(gpu_kv_[Slot(seq, i)]);
    if (fork) {
      for (int j = 0; j < r.num_samples; ++j) {
        out->sampled_token_ids.push_back(NextToken(scratch_, j, req->seed));
      }
    } else {
      out->sampled_token_ids.push_back(NextToken(scratch_, s.index, req->seed));
    }
  }
  return absl::OkStatus();
}

}  // namespace llm
