#include "protocol/batch_state.h"

#include <algorithm>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace llm {
namespace {

bool Contains(const std::vector<int32_t>& sorted, int32_t slot) {
  return std::binary_search(sorted.begin(), sorted.end(), slot);
}

bool InRange(IndexRange range, size_t size) { return size_t{range.begin} + range.size <= size; }

uint64_t SeedFor(const SamplingParams& params) {
  if (params.seed.has_value()) return *params.seed;
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

}  // namespace

std::vector<TokenId> RepetitionPenaltyTokens(const SamplingParams& params,
                                             std::span<const TokenId> prompt) {
  if (params.repetition_penalty == 1.0) return {};
  std::vector<TokenId> tokens(prompt.begin(), prompt.end());
  std::sort(tokens.begin(), tokens.end());
  tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
  return tokens;
}

absl::Status CheckBlockPairs(std::span<const BlockPair> pairs, int src_blocks, int dst_blocks,
                             const char* what) {
  for (const BlockPair& p : pairs) {
    if (p.src < 0 || p.src >= src_blocks || p.dst < 0 || p.dst >= dst_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(what, " pair (", p.src, ", ", p.dst,
                                                     ") is out of range (", src_blocks, ", ",
                                                     dst_blocks, " blocks)"));
    }
  }
  return absl::OkStatus();
}

BatchState::BatchState(const BatchStateConfig& config) : config_(config) {}

const BatchState::Request* BatchState::FindRequest(int32_t slot) const {
  const auto it = requests_.find(slot);
  return it == requests_.end() ? nullptr : &it->second;
}

SamplingState* BatchState::MutableSamplingState(int32_t slot, int seq_index) {
  const auto it = requests_.find(slot);
  CHECK(it != requests_.end()) << "slot " << slot << " is not held";
  return &it->second.seqs[seq_index].sampling;
}

void BatchState::ResetSequence(Sequence* seq,
                               const std::shared_ptr<const structured::CompiledGrammar>& grammar) {
  if (seq->sampling.device_slot.slot >= 0) {
    released_device_slots_.push_back(seq->sampling.device_slot);
  }
  *seq = Sequence{};
  if (grammar != nullptr)
    seq->sampling.grammar = std::make_unique<structured::GrammarMatcher>(grammar);
}

void BatchState::Clear() {
  released_device_slots_.clear();
  for (auto& [slot, req] : requests_) {
    for (Sequence& seq : req.seqs) ResetSequence(&seq);
  }
  requests_.clear();
  inputs_ = BatchInputs{};
}

absl::Status BatchState::Apply(const SchedulerOutput& step) {
  RETURN_IF_ERROR(Validate(step));
  released_device_slots_.clear();
  for (int32_t slot : step.finished_slots) {
    const auto it = requests_.find(slot);
    if (it == requests_.end()) continue;
    for (Sequence& seq : it->second.seqs) ResetSequence(&seq);
    requests_.erase(it);
  }
  for (size_t i = 0; i < step.new_requests.size(); ++i) {
    requests_[step.new_requests[i].slot].grammar = std::move(new_grammars_[i]);
    ApplyRequest(step, step.new_requests[i], /*is_new=*/true);
  }
  for (const ScheduledRequest& r : step.cached_requests) ApplyRequest(step, r, /*is_new=*/false);

  BatchInputs& in = inputs_;
  in.token_ids.clear();
  in.positions.clear();
  in.slot_mapping.clear();
  in.seq_lens.clear();
  in.query_start_loc.assign(1, 0);
  in.logits_indices.clear();
  in.seqs.clear();
  in.samples.clear();
  tables_.clear();
  for (const ScheduledRequest& r : step.new_requests) AddToBatch(step, r);
  for (const ScheduledRequest& r : step.cached_requests) AddToBatch(step, r);
  FillBlockTables();
  return absl::OkStatus();
}

absl::Status BatchState::Validate(const SchedulerOutput& step) {
  finished_slots_.assign(step.finished_slots.begin(), step.finished_slots.end());
  std::sort(finished_slots_.begin(), finished_slots_.end());
  scheduled_slots_.clear();
  for (const auto* list : {&step.new_requests, &step.cached_requests}) {
    for (const ScheduledRequest& r : *list) scheduled_slots_.push_back(r.slot);
  }
  std::sort(scheduled_slots_.begin(), scheduled_slots_.end());
  // A slot listed twice would get two diffs applied to one request (state is keyed by slot).
  if (auto it = std::adjacent_find(scheduled_slots_.begin(), scheduled_slots_.end());
      it != scheduled_slots_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step.step_id, ": slot ", *it, " is scheduled twice"));
  }
  new_grammars_.clear();
  for (const ScheduledRequest& r : step.new_requests) {
    RETURN_IF_ERROR(ValidateRequest(step, r, /*is_new=*/true));
    std::shared_ptr<const structured::CompiledGrammar>& grammar = new_grammars_.emplace_back();
    if (!r.sampling_params->structured.active()) continue;
    if (config_.grammars == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", step.step_id, ": request ", std::string(r.request_id),
                       " has a structured output, which this worker cannot enforce (it has no "
                       "vocabulary for grammars)"));
    }
    absl::StatusOr<std::shared_ptr<const structured::CompiledGrammar>> compiled =
        config_.grammars->Get(structured::SpecOf(r.sampling_params->structured));
    if (!compiled.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", step.step_id, ": request ", std::string(r.request_id),
                       ": structured output: ", std::string(compiled.status().message())));
    }
    grammar = *std::move(compiled);
  }
  for (const ScheduledRequest& r : step.cached_requests) {
    RETURN_IF_ERROR(ValidateRequest(step, r, /*is_new=*/false));
  }
  // The caller drops the finished slots and swaps before the copy: a bad pair of any list must
  // refuse the step before that.
  return ValidatePairs(step);
}

absl::Status BatchState::ValidatePairs(const SchedulerOutput& step) const {
  const int gpu = config_.num_gpu_blocks, cpu = config_.num_cpu_blocks;
  RETURN_IF_ERROR(CheckBlockPairs(step.blocks_to_swap_out, gpu, cpu, "swap-out"));
  RETURN_IF_ERROR(CheckBlockPairs(step.blocks_to_swap_in, cpu, gpu, "swap-in"));
  return CheckBlockPairs(step.blocks_to_copy, gpu, gpu, "copy");
}

absl::Status BatchState::ValidateRequest(const SchedulerOutput& step, const ScheduledRequest& r,
                                         bool is_new) const {
  // The message names the step and the request; built only on failure (this runs per request
  // per step).
  auto bad = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("step ", step.step_id, ": request \"",
                                                   std::string(r.request_id), "\" (slot ", r.slot,
                                                   ")", parts...));
  };
  if (r.slot < 0) return bad(": negative slot");
  if (r.request_id.empty()) return bad(" has no request_id");
  const auto it = requests_.find(r.slot);
  const bool held = it != requests_.end() && !Contains(finished_slots_, r.slot);
  const Request* old = nullptr;
  if (is_new) {
    if (held) return bad(" is already known");
    if (r.sampling_params == nullptr || r.prompt_token_ids.empty()) {
      return bad(" comes without a prompt or sampling params");
    }
  } else {
    if (!held || it->second.request_id != r.request_id) return bad(" is unknown to this worker");
    old = &it->second;
    if (!r.resumed_from_preemption && r.num_computed_tokens != old->num_computed_tokens) {
      return bad(": ", r.num_computed_tokens, " tokens computed per the step; ",
                 old->num_computed_tokens, " per this worker");
    }
  }
  if (r.num_computed_tokens < 0 || r.num_scheduled_tokens < 0 || r.num_samples < 0) {
    return bad(" has a negative count");
  }
  if (!InRange(r.seqs, step.seqs.size())) return bad(": sequences outside the step's array");
  if (r.seqs.size == 0) return bad(" lists no sequences");
  const int vocab = config_.vocab_size;
  auto check_tokens = [&](std::span<const TokenId> tokens) -> absl::Status {
    for (TokenId t : tokens) {
      if (t < 0 || t >= vocab) {
        return bad(": token id ", t, " outside the vocabulary [0, ", vocab, ")");
      }
    }
    return absl::OkStatus();
  };
  if (is_new) RETURN_IF_ERROR(check_tokens(r.prompt_token_ids));
  const int n = is_new ? r.sampling_params->n : old->params.n;
  if (n < 1) return bad(": n is ", n);
  const int64_t end = int64_t{r.num_computed_tokens} + r.num_scheduled_tokens;
  const size_t prompt_len = is_new ? r.prompt_token_ids.size() : old->prompt.size();
  const int bs = config_.block_size;
  int last_index = -1;
  int64_t num_tokens = -1;  // every listed sequence's, after the diff
  for (const ScheduledSequence& s : step.Seqs(r)) {
    if (s.index <= last_index || s.index >= n) {
      return bad(": sequence ", s.index, " is out of order or outside [0, n = ", n, ")");
    }
    last_index = s.index;
    if (!InRange(s.new_token_ids, step.token_ids.size()) ||
        !InRange(s.block_ids, step.block_ids.size())) {
      return bad(" sequence ", s.index, ": ranges outside the step's arrays");
    }
    RETURN_IF_ERROR(check_tokens(step.NewTokenIds(s)));
    for (BlockId b : step.BlockIds(s)) {
      if (b < 0 || b >= config_.num_gpu_blocks) {
        return bad(": block id ", b, " outside the cache [0, ", config_.num_gpu_blocks, ")");
      }
    }
    const Sequence* seq = old != nullptr ? &old->seqs[s.index] : nullptr;
    const bool known = seq != nullptr && seq->live;
    if (s.new_to_workers == known) {
      return bad(": sequence ", s.index,
                 known ? " is known and listed as new" : " is unknown and not listed as new");
    }
    // A worker appends what it samples: tokens sent again would be appended twice.
    if (known && s.new_token_ids.size != 0) {
      return bad(": sequence ", s.index, " is known, yet ", s.new_token_ids.size,
                 " token(s) come with it (only a sequence new to the workers brings tokens)");
    }
    const int64_t tokens = (known ? seq->token_ids.size() : prompt_len) + s.new_token_ids.size;
    const int64_t blocks =
        (known && !s.replace_block_table ? seq->block_table.size() : 0) + s.block_ids.size;
    if (num_tokens >= 0 && tokens != num_tokens) {
      return bad(": live sequences of different lengths (", num_tokens, " and ", tokens, ")");
    }
    num_tokens = tokens;
    if (end > tokens || end > blocks * bs) {
      return bad(" sequence ", s.index, ": computing up to token ", end, " with ", tokens,
                 " tokens in ", blocks, " blocks of ", bs);
    }
  }
  // Samples: none (a partial prefill), one per listed sequence, or n from the one sequence of
  // a request that forks after this first sample.
  const int num_listed = static_cast<int>(r.seqs.size);
  if (r.num_samples != 0 && r.num_samples != num_listed &&
      !(num_listed == 1 && r.num_samples == n)) {
    return bad(": ", r.num_samples, " samples for ", num_listed, " sequences (n = ", n, ")");
  }
  // A sample reads the logits of the sequence's last token: this step must compute it.
  if (r.num_samples > 0 && (r.num_scheduled_tokens == 0 || end != num_tokens)) {
    return bad(": samples with ", end, " of ", num_tokens, " tokens computed (",
               r.num_scheduled_tokens, " this step)");
  }
  return absl::OkStatus();
}

void BatchState::ApplyRequest(const SchedulerOutput& step, const ScheduledRequest& r, bool is_new) {
  Request& req = requests_[r.slot];
  if (is_new) {
    req.request_id.assign(r.request_id);
    req.prompt.assign(r.prompt_token_ids.begin(), r.prompt_token_ids.end());
    req.params = *r.sampling_params;
    req.seed = SeedFor(req.params);
    req.prompt_token_set = RepetitionPenaltyTokens(req.params, req.prompt);
    // Every sequence's state from the start: the n - 1 a fork makes sample their first token
    // (from the parent's row) before they exist as sequences.
    req.seqs.clear();
    req.seqs.resize(req.params.n);
    for (Sequence& seq : req.seqs) ResetSequence(&seq, req.grammar);
  }
  req.num_computed_tokens = r.num_computed_tokens + r.num_scheduled_tokens;
  const bool count = req.params.has_penalties();
  // A sequence not listed has finished. Listed ones are in increasing index order.
  const std::span<const ScheduledSequence> listed = step.Seqs(r);
  auto next = listed.begin();
  for (int i = 0; i < static_cast<int>(req.seqs.size()); ++i) {
    Sequence& seq = req.seqs[i];
    if (next == listed.end() || next->index != i) {
      // Also a sequence yet to fork, should a failed step have left it a device slot.
      if (seq.live || seq.sampling.device_slot.slot >= 0) ResetSequence(&seq, req.grammar);
      continue;
    }
    const ScheduledSequence& s = *next++;
    const std::span<const TokenId> tokens = step.NewTokenIds(s);
    if (s.new_to_workers) {
      // Its tokens are the prompt and its output so far (a request resumed on workers that
      // never held it): the state continues from that output, as on the workers that sampled
      // it.
      ResetSequence(&seq, req.grammar);
      seq.token_ids = req.prompt;
      for (TokenId t : tokens) seq.sampling.AddOutputToken(t, count);
    }
    seq.token_ids.insert(seq.token_ids.end(), tokens.begin(), tokens.end());
    if (s.replace_block_table) seq.block_table.clear();
    const std::span<const BlockId> blocks = step.BlockIds(s);
    seq.block_table.insert(seq.block_table.end(), blocks.begin(), blocks.end());
    seq.live = true;
  }
}

void BatchState::AddToBatch(const SchedulerOutput& step, const ScheduledRequest& r) {
  const Request& req = requests_.find(r.slot)->second;
  const int begin = r.num_computed_tokens, end = req.num_computed_tokens;
  if (end == begin) return;  // Validate: no samples either
  BatchInputs& in = inputs_;
  const int bs = config_.block_size;
  const bool fork = r.num_samples > 0 && r.num_samples != static_cast<int>(r.seqs.size);
  for (const ScheduledSequence& s : step.Seqs(r)) {
    const Sequence& seq = req.seqs[s.index];
    for (int p = begin; p < end; ++p) {
      in.token_ids.push_back(seq.token_ids[p]);
      in.positions.push_back(p);
      in.slot_mapping.push_back(int64_t{seq.block_table[p / bs]} * bs + p % bs);
    }
    const int32_t batch_seq = in.num_seqs();
    in.seq_lens.push_back(end);
    in.query_start_loc.push_back(in.num_tokens());
    in.seqs.push_back({r.slot, s.index});
    tables_.push_back(&seq.block_table);
    if (r.num_samples == 0) continue;
    const int32_t row = static_cast<int32_t>(in.logits_indices.size());
    in.logits_indices.push_back(in.num_tokens() - 1);
    if (!fork) {
      in.samples.push_back({batch_seq, row, s.index});
      continue;
    }
    // The first sample of an unforked request with n > 1: n tokens from its one row, token j
    // for the sequence j the scheduler forks next.
    for (int j = 0; j < r.num_samples; ++j) in.samples.push_back({batch_seq, row, j});
  }
}

void BatchState::AppendSampled(std::span<const TokenId> sampled) {
  const BatchInputs& in = inputs_;
  CHECK_EQ(sampled.size(), in.samples.size()) << "one token per sample of the step";
  for (size_t i = 0; i < sampled.size(); ++i) {
    const BatchInputs::Sample& sample = in.samples[i];
    const BatchInputs::SeqRef ref = in.seqs[sample.batch_seq];
    Request& req = requests_.find(ref.slot)->second;
    Sequence& seq = req.seqs[sample.seq_index];
    if (sample.seq_index != ref.index) {
      // A fork's first token: sequence j starts as the prompt (the parent has no output yet)
      // and shares the parent's blocks, as the scheduler's fork does; copy-on-write replaces
      // its table later. Its sampling state is the parent's before this sample (no output),
      // its own since the request came: the token was drawn from it.
      const Sequence& parent = req.seqs[ref.index];
      DCHECK_EQ(seq.sampling.num_samples, 0u);
      seq.token_ids = req.prompt;
      seq.block_table = parent.block_table;
      seq.live = true;
    }
    seq.token_ids.push_back(sampled[i]);
    seq.sampling.AddOutputToken(sampled[i], req.params.has_penalties());
  }
}

void BatchState::FillBlockTables() {
  BatchInputs& in = inputs_;
  in.max_blocks = 0;
  for (const std::vector<BlockId>* t : tables_) {
    in.max_blocks = std::max(in.max_blocks, static_cast<int>(t->size()));
  }
  in.block_tables.assign(tables_.size() * in.max_blocks, 0);
  for (size_t i = 0; i < tables_.size(); ++i) {
    std::copy(tables_[i]->begin(), tables_[i]->end(), in.block_tables.begin() + i * in.max_blocks);
  }
}

}  // namespace llm
