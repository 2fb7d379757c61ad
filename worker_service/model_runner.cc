#include "worker_service/model_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace llm {

ModelRunner::ModelRunner(LlamaModel* model, CacheEngine* cache) : model_(model), cache_(cache) {}

SequenceSampler* ModelRunner::SamplerFor(Request& req, int index) {
  std::unique_ptr<SequenceSampler>& s = req.samplers[index];
  if (s == nullptr) s = std::make_unique<SequenceSampler>(req.params, index, req.prompt);
  return s.get();
}

absl::Status ModelRunner::Validate(const SchedulerOutput& step) const {
  const int num_blocks = cache_->num_device_blocks();
  const int block_size = cache_->shape().block_size;
  const int vocab = model_->vocab_size();
  absl::flat_hash_set<int32_t> finished(step.finished_slots.begin(), step.finished_slots.end());
  absl::flat_hash_set<int32_t> seen;
  auto check = [&](const ScheduledRequest& r, bool is_new) -> absl::Status {
    const std::string who =
        absl::StrCat("step ", step.step_id, ": request ", std::string(r.request_id));
    if (!seen.insert(r.slot).second) return absl::InvalidArgumentError(who + " is listed twice");
    const auto it = requests_.find(r.slot);
    const bool known = it != requests_.end() && !finished.contains(r.slot);
    if (is_new == known) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, is_new ? " is already known" : " is unknown to this worker"));
    }
    if (is_new && (r.sampling_params == nullptr || r.prompt_token_ids.empty())) {
      return absl::InvalidArgumentError(who + " comes without a prompt or sampling params");
    }
    if (r.num_computed_tokens < 0 || r.num_scheduled_tokens < 0 || r.num_samples < 0 ||
        r.seqs.begin + r.seqs.size > step.seqs.size()) {
      return absl::InvalidArgumentError(who + " has negative counts or a bad sequence range");
    }
    // Samples: none (a partial prefill), one per listed sequence, or n from the one sequence
    // of a request that forks after this first sample.
    const int n = is_new ? r.sampling_params->n : it->second.params.n;
    if (r.num_samples != 0 && r.num_samples != static_cast<int>(r.seqs.size) &&
        !(r.seqs.size == 1 && r.num_samples == n)) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": ", r.num_samples, " samples for ",
                                                     r.seqs.size, " sequences (n = ", n, ")"));
    }
    const size_t prompt_len = is_new ? r.prompt_token_ids.size() : it->second.prompt.size();
    for (const ScheduledSequence& s : step.Seqs(r)) {
      if (s.new_token_ids.begin + s.new_token_ids.size > step.token_ids.size() ||
          s.block_ids.begin + s.block_ids.size > step.block_ids.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(who, " sequence ", s.index, ": ranges outside the step's arrays"));
      }
      for (TokenId t : step.NewTokenIds(s)) {
        if (t < 0 || t >= vocab) {
          return absl::InvalidArgumentError(
              absl::StrCat(who, ": token id ", t, " outside the vocabulary [0, ", vocab, ")"));
        }
      }
      for (BlockId b : step.BlockIds(s)) {
        if (b < 0 || b >= num_blocks) {
          return absl::InvalidArgumentError(
              absl::StrCat(who, ": block id ", b, " outside the cache [0, ", num_blocks, ")"));
        }
      }
      const Sequence* old = nullptr;
      if (!is_new && !s.new_to_workers) {
        auto seq = it->second.seqs.find(s.index);
        if (seq == it->second.seqs.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat(who, ": sequence ", s.index, " is unknown and not new"));
        }
        old = &seq->second;
      }
      const size_t num_tokens = (old ? old->token_ids.size() : prompt_len) + s.new_token_ids.size;
      const size_t num_blocks_after =
          (s.replace_block_table || old == nullptr ? 0 : old->block_table.size()) +
          s.block_ids.size;
      const size_t end = static_cast<size_t>(r.num_computed_tokens) + r.num_scheduled_tokens;
      if (end > num_tokens || end > num_blocks_after * block_size) {
        return absl::InvalidArgumentError(
            absl::StrCat(who, " sequence ", s.index, ": computing up to token ", end, " with ",
                         num_tokens, " tokens in ", num_blocks_after, " blocks of ", block_size));
      }
    }
    return absl::OkStatus();
  };
  for (const ScheduledRequest& r : step.new_requests) RETURN_IF_ERROR(check(r, true));
  for (const ScheduledRequest& r : step.cached_requests) RETURN_IF_ERROR(check(r, false));
  // Execute drops the finished slots and swaps before the copy: a bad pair of any list must
  // refuse the step before that.
  return cache_->CheckPairs(step.blocks_to_swap_out, step.blocks_to_swap_in, step.blocks_to_copy);
}

void ModelRunner::Apply(const SchedulerOutput& step, const ScheduledRequest& r, bool is_new) {
  Request& req = requests_[r.slot];
  if (is_new) {
    req = Request{};
    req.request_id = std::string(r.request_id);
    req.prompt.assign(r.prompt_token_ids.begin(), r.prompt_token_ids.end());
    req.params = *r.sampling_params;
  }
  req.num_computed_tokens = r.num_computed_tokens;
  std::map<int, Sequence> listed;
  for (const ScheduledSequence& s : step.Seqs(r)) {
    Sequence seq;
    if (!s.new_to_workers) seq = std::move(req.seqs[s.index]);
    if (s.new_to_workers) seq.token_ids = req.prompt;
    const std::span<const TokenId> tokens = step.NewTokenIds(s);
    seq.token_ids.insert(seq.token_ids.end(), tokens.begin(), tokens.end());
    // Penalties count every output token the sequence has, whoever sampled it.
    SequenceSampler* sampler = SamplerFor(req, s.index);
    for (TokenId t : tokens) sampler->AddOutputToken(t);
    if (s.replace_block_table) seq.block_table.clear();
    const std::span<const BlockId> blocks = step.BlockIds(s);
    seq.block_table.insert(seq.block_table.end(), blocks.begin(), blocks.end());
    listed.emplace(s.index, std::move(seq));
  }
  req.seqs = std::move(listed);  // a sequence not listed has finished
}

absl::Status ModelRunner::Execute(const SchedulerOutput& step, ModelOutput* out) {
  RETURN_IF_ERROR(Validate(step));
  for (int32_t slot : step.finished_slots) requests_.erase(slot);
  RETURN_IF_ERROR(cache_->SwapOut(step.blocks_to_swap_out));
  RETURN_IF_ERROR(cache_->SwapIn(step.blocks_to_swap_in));
  RETURN_IF_ERROR(cache_->Copy(step.blocks_to_copy));
  for (const ScheduledRequest& r : step.new_requests) Apply(step, r, true);
  for (const ScheduledRequest& r : step.cached_requests) Apply(step, r, false);

  // The batch: every listed sequence's scheduled tokens, requests in output order.
  const int bs = cache_->shape().block_size;
  std::vector<int32_t> token_ids, positions, seq_lens, query_start{0}, logits_rows;
  std::vector<int64_t> slots;
  std::vector<const std::vector<BlockId>*> tables;
  struct Sampling {
    Request* req;
    int num_samples;
    int first_row;  // into logits_rows
    int num_rows;
  };
  std::vector<Sampling> sampling;
  auto add = [&](const ScheduledRequest& r) {
    Request& req = requests_[r.slot];
    const int begin = r.num_computed_tokens, end = begin + r.num_scheduled_tokens;
    const int first_row = static_cast<int>(logits_rows.size());
    for (const ScheduledSequence& s : step.Seqs(r)) {
      const Sequence& seq = req.seqs[s.index];
      if (end == begin) continue;
      for (int p = begin; p < end; ++p) {
        token_ids.push_back(seq.token_ids[p]);
        positions.push_back(p);
        slots.push_back(static_cast<int64_t>(seq.block_table[p / bs]) * bs + p % bs);
      }
      seq_lens.push_back(end);
      query_start.push_back(static_cast<int32_t>(token_ids.size()));
      tables.push_back(&seq.block_table);
      if (r.num_samples > 0) logits_rows.push_back(static_cast<int32_t>(token_ids.size()) - 1);
    }
    sampling.push_back(
        {&req, r.num_samples, first_row, static_cast<int>(logits_rows.size()) - first_row});
  };
  for (const ScheduledRequest& r : step.new_requests) add(r);
  for (const ScheduledRequest& r : step.cached_requests) add(r);

  out->step_id = step.step_id;
  out->sampled_token_ids.clear();
  out->logprobs.clear();
  if (token_ids.empty()) return absl::OkStatus();
  int max_blocks = 0;
  for (const auto* t : tables) max_blocks = std::max<int>(max_blocks, t->size());
  std::vector<int32_t> block_tables(tables.size() * max_blocks, 0);
  for (size_t i = 0; i < tables.size(); ++i) {
    std::copy(tables[i]->begin(), tables[i]->end(), block_tables.begin() + i * max_blocks);
  }
  const ForwardInput input{token_ids,  positions, slots,       block_tables,
                           max_blocks, seq_lens,  query_start, logits_rows};
  HostTensor logits;
  RETURN_IF_ERROR(model_->Forward(input, cache_->device_caches(), &logits));

  // Non-finite logits mean a kernel or model bug (or KV read from a slot never written):
  // fail the step rather than sample garbage.
  for (int64_t i = 0; i < logits.numel(); ++i) {
    if (!std::isfinite(logits.data<float>()[i])) {
      return absl::InternalError(absl::StrCat("step ", step.step_id, ": logit ",
                                              i % model_->vocab_size(), " of row ",
                                              i / model_->vocab_size(), " is not finite"));
    }
  }

  // Sampling: one row per listed sequence, or, at the first sample of an unforked request
  // with n > 1, n samples (one per future sequence) from its single row.
  const int vocab = model_->vocab_size();
  std::vector<float> rows;
  std::vector<SequenceSampler*> samplers;
  for (const Sampling& s : sampling) {
    if (s.num_samples == 0) continue;
    const bool fork = s.num_rows == 1 && s.num_samples > 1;  // Validate() checked the counts
    auto seq_it = s.req->seqs.begin();
    for (int j = 0; j < s.num_samples; ++j) {
      const int row = fork ? s.first_row : s.first_row + j;
      const float* src = logits.data<float>() + static_cast<size_t>(row) * vocab;
      rows.insert(rows.end(), src, src + vocab);
      const int index = fork ? j : (seq_it++)->first;
      samplers.push_back(SamplerFor(*s.req, index));
    }
  }
  const bool any_logprobs = std::any_of(samplers.begin(), samplers.end(), [](const auto* s) {
    return s->params().logprobs.has_value();
  });
  std::vector<SampledToken> sampled = Sampler::Sample(rows, vocab, samplers);
  for (size_t i = 0; i < sampled.size(); ++i) {
    out->sampled_token_ids.push_back(sampled[i].token);
    if (!any_logprobs) continue;
    SampleLogprobs& lp = out->logprobs.emplace_back();
    if (!samplers[i]->params().logprobs.has_value()) continue;
    lp.logprob = sampled[i].logprob;
    lp.top = std::move(sampled[i].top_logprobs);
  }
  return absl::OkStatus();
}

}  // namespace llm
