#include "protocol/step_codec.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"

namespace llm {
namespace {

uint32_t U32(int v) { return static_cast<uint32_t>(v); }

void EncodePairs(const std::vector<BlockPair>& pairs,
                 google::protobuf::RepeatedPtrField<v1::BlockPair>* out) {
  out->Reserve(static_cast<int>(pairs.size()));
  for (const BlockPair& p : pairs) {
    v1::BlockPair* q = out->Add();
    q->set_src(p.src);
    q->set_dst(p.dst);
  }
}

void EncodeRequest(const SchedulerOutput& step, const ScheduledRequest& r, bool is_new,
                   v1::ScheduledRequest* out) {
  out->set_slot(r.slot);
  out->set_request_id(std::string(r.request_id));
  if (is_new) {
    out->mutable_prompt_token_ids()->Add(r.prompt_token_ids.begin(), r.prompt_token_ids.end());
    if (r.sampling_params != nullptr) {
      SamplingParamsToProto(*r.sampling_params, out->mutable_sampling_params());
    }
  }
  out->set_resumed_from_preemption(r.resumed_from_preemption);
  out->set_num_computed_tokens(U32(r.num_computed_tokens));
  out->set_num_scheduled_tokens(U32(r.num_scheduled_tokens));
  out->set_num_samples(U32(r.num_samples));
  const auto seqs = step.Seqs(r);
  out->mutable_seqs()->Reserve(static_cast<int>(seqs.size()));
  for (const ScheduledSequence& s : seqs) {
    v1::ScheduledSequence* q = out->add_seqs();
    q->set_index(U32(s.index));
    q->set_new_to_workers(s.new_to_workers);
    q->set_replace_block_table(s.replace_block_table);
    const auto tokens = step.NewTokenIds(s);
    q->mutable_new_token_ids()->Add(tokens.begin(), tokens.end());
    const auto blocks = step.BlockIds(s);
    q->mutable_block_ids()->Add(blocks.begin(), blocks.end());
  }
}

// Values past int range would wrap in the in-process structs; they are never legitimate.
constexpr uint32_t kMaxCount = static_cast<uint32_t>(std::numeric_limits<int32_t>::max());

void DecodePairs(const google::protobuf::RepeatedPtrField<v1::BlockPair>& in,
                 std::vector<BlockPair>* out) {
  out->clear();
  out->reserve(in.size());
  for (const v1::BlockPair& p : in) out->push_back({p.src(), p.dst()});
}

absl::Status DecodeRequest(const v1::ScheduledRequest& in, bool is_new,
                           const SamplingLimits& limits, DecodedStep* step) {
  SchedulerOutput& out = step->output;
  const std::string& id = in.request_id();
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("request \"", id, "\" (slot ", in.slot(), "): ", what));
  };
  if (in.num_computed_tokens() > kMaxCount || in.num_scheduled_tokens() > kMaxCount ||
      in.num_samples() > kMaxCount) {
    return bad("a token count is out of range");
  }

  ScheduledRequest r;
  r.slot = in.slot();
  r.request_id = id;
  r.resumed_from_preemption = in.resumed_from_preemption();
  r.num_computed_tokens = static_cast<int>(in.num_computed_tokens());
  r.num_scheduled_tokens = static_cast<int>(in.num_scheduled_tokens());
  r.num_samples = static_cast<int>(in.num_samples());
  if (is_new) {
    r.prompt_token_ids = std::span<const TokenId>(in.prompt_token_ids().data(),
                                                  static_cast<size_t>(in.prompt_token_ids_size()));
    if (in.has_sampling_params()) {
      SamplingParams& params =
          step->sampling_params.emplace_back(SamplingParamsFromProto(in.sampling_params()));
      if (absl::Status s = params.Validate(limits); !s.ok()) {
        return bad(absl::StrCat("sampling_params: ", s.message()));
      }
      r.sampling_params = &params;
    }
  } else if (!in.prompt_token_ids().empty() || in.has_sampling_params()) {
    return bad("a cached request carries a prompt or sampling_params");
  }

  r.seqs.begin = static_cast<uint32_t>(out.seqs.size());
  for (const v1::ScheduledSequence& s : in.seqs()) {
    if (s.index() > kMaxCount)
      return bad(absl::StrCat("sequence index ", s.index(), " is out of range"));
    ScheduledSequence q;
    q.index = static_cast<int>(s.index());
    q.new_to_workers = s.new_to_workers();
    q.replace_block_table = s.replace_block_table();
    q.new_token_ids = {static_cast<uint32_t>(out.token_ids.size()),
                       static_cast<uint32_t>(s.new_token_ids_size())};
    out.token_ids.insert(out.token_ids.end(), s.new_token_ids().begin(), s.new_token_ids().end());
    q.block_ids = {static_cast<uint32_t>(out.block_ids.size()),
                   static_cast<uint32_t>(s.block_ids_size())};
    out.block_ids.insert(out.block_ids.end(), s.block_ids().begin(), s.block_ids().end());
    out.seqs.push_back(q);
  }
  r.seqs.size = static_cast<uint32_t>(in.seqs_size());
  const int64_t scheduled = int64_t{r.num_scheduled_tokens} * in.seqs_size();
  if (int64_t{out.total_num_scheduled_tokens} + scheduled > kMaxCount) {
    return bad("the step schedules too many tokens");
  }
  out.total_num_scheduled_tokens += static_cast<int>(scheduled);
  out.total_num_samples += r.num_samples;
  (is_new ? out.new_requests : out.cached_requests).push_back(r);
  return absl::OkStatus();
}

}  // namespace

SamplingParams SamplingParamsFromProto(const v1::SamplingParams& p) {
  SamplingParams s;
  if (p.has_n()) s.n = static_cast<int>(std::min<uint32_t>(p.n(), kMaxCount));
  if (p.has_temperature()) s.temperature = p.temperature();
  if (p.has_top_p()) s.top_p = p.top_p();
  if (p.has_top_k()) s.top_k = p.top_k();
  if (p.has_min_p()) s.min_p = p.min_p();
  if (p.has_seed()) s.seed = p.seed();
  if (p.has_max_tokens()) s.max_tokens = static_cast<int>(std::min(p.max_tokens(), kMaxCount));
  s.min_tokens = static_cast<int>(std::min(p.min_tokens(), kMaxCount));
  s.stop.assign(p.stop().begin(), p.stop().end());
  s.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.ignore_eos = p.ignore_eos();
  if (p.has_logprobs()) s.logprobs = static_cast<int>(std::min(p.logprobs(), kMaxCount));
  s.presence_penalty = p.presence_penalty();
  s.frequency_penalty = p.frequency_penalty();
  if (p.has_repetition_penalty()) s.repetition_penalty = p.repetition_penalty();
  s.include_stop_str_in_output = p.include_stop_str_in_output();
  if (p.has_skip_special_tokens()) s.skip_special_tokens = p.skip_special_tokens();
  // A proto map's order is unspecified: sorted, every rank applies the biases alike.
  s.logit_bias.assign(p.logit_bias().begin(), p.logit_bias().end());
  std::sort(s.logit_bias.begin(), s.logit_bias.end());
  using Kind = StructuredOutputParams::Kind;
  const v1::StructuredOutput& so = p.structured_output();
  StructuredOutputParams& st = s.structured;
  switch (so.kind_case()) {
    case v1::StructuredOutput::kJsonSchema:
      st.kind = Kind::kJsonSchema;
      st.text = so.json_schema();
      break;
    case v1::StructuredOutput::kJsonObject:
      if (so.json_object()) st.kind = Kind::kJsonObject;
      break;
    case v1::StructuredOutput::kRegex:
      st.kind = Kind::kRegex;
      st.text = so.regex();
      break;
    case v1::StructuredOutput::kGrammar:
      st.kind = Kind::kGrammar;
      st.text = so.grammar();
      break;
    case v1::StructuredOutput::kChoice:
      st.kind = Kind::kChoice;
      st.choices.assign(so.choice().choices().begin(), so.choice().choices().end());
      break;
    case v1::StructuredOutput::KIND_NOT_SET:
      break;
  }
  st.any_whitespace = so.any_whitespace();
  return s;
}

void SamplingParamsToProto(const SamplingParams& s, v1::SamplingParams* p) {
  p->Clear();
  p->set_n(U32(s.n));
  p->set_temperature(static_cast<float>(s.temperature));
  p->set_top_p(static_cast<float>(s.top_p));
  p->set_top_k(s.top_k);
  p->set_min_p(static_cast<float>(s.min_p));
  if (s.seed.has_value()) p->set_seed(*s.seed);
  p->set_max_tokens(U32(s.max_tokens));
  p->set_min_tokens(U32(s.min_tokens));
  for (const std::string& stop : s.stop) p->add_stop(stop);
  p->mutable_stop_token_ids()->Add(s.stop_token_ids.begin(), s.stop_token_ids.end());
  p->set_ignore_eos(s.ignore_eos);
  if (s.logprobs.has_value()) p->set_logprobs(U32(*s.logprobs));
  p->set_presence_penalty(static_cast<float>(s.presence_penalty));
  p->set_frequency_penalty(static_cast<float>(s.frequency_penalty));
  p->set_repetition_penalty(static_cast<float>(s.repetition_penalty));
  p->set_include_stop_str_in_output(s.include_stop_str_in_output);
  p->set_skip_special_tokens(s.skip_special_tokens);
  for (const auto& [token, bias] : s.logit_bias) (*p->mutable_logit_bias())[token] = bias;
  using Kind = StructuredOutputParams::Kind;
  const StructuredOutputParams& st = s.structured;
  if (!st.active()) return;
  v1::StructuredOutput* so = p->mutable_structured_output();
  switch (st.kind) {
    case Kind::kJsonSchema:
      so->set_json_schema(st.text);
      break;
    case Kind::kJsonObject:
      so->set_json_object(true);
      break;
    case Kind::kRegex:
      so->set_regex(st.text);
      break;
    case Kind::kGrammar:
      so->set_grammar(st.text);
      break;
    case Kind::kChoice:
      so->mutable_choice()->mutable_choices()->Add(st.choices.begin(), st.choices.end());
      break;
    case Kind::kNone:
      break;
  }
  so->set_any_whitespace(st.any_whitespace);
}

void EncodeStepRequest(const SchedulerOutput& step, v1::StepRequest* out) {
  out->Clear();
  out->set_step_id(static_cast<uint64_t>(step.step_id));
  out->mutable_new_requests()->Reserve(static_cast<int>(step.new_requests.size()));
  for (const ScheduledRequest& r : step.new_requests) {
    EncodeRequest(step, r, /*is_new=*/true, out->add_new_requests());
  }
  out->mutable_cached_requests()->Reserve(static_cast<int>(step.cached_requests.size()));
  for (const ScheduledRequest& r : step.cached_requests) {
    EncodeRequest(step, r, /*is_new=*/false, out->add_cached_requests());
  }
  for (const std::string& id : step.finished_request_ids) out->add_finished_request_ids(id);
  out->mutable_finished_slots()->Add(step.finished_slots.begin(), step.finished_slots.end());
  EncodePairs(step.blocks_to_swap_in, out->mutable_blocks_to_swap_in());
  EncodePairs(step.blocks_to_swap_out, out->mutable_blocks_to_swap_out());
  EncodePairs(step.blocks_to_copy, out->mutable_blocks_to_copy());
}

absl::Status DecodeStepRequest(const v1::StepRequest& in, const SamplingLimits& limits,
                               DecodedStep* out) {
  out->output.Clear();
  out->sampling_params.clear();
  SchedulerOutput& step = out->output;
  if (in.step_id() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("step_id ", in.step_id(), " is out of range"));
  }
  step.step_id = static_cast<int64_t>(in.step_id());
  for (const v1::ScheduledRequest& r : in.new_requests()) {
    if (absl::Status s = DecodeRequest(r, /*is_new=*/true, limits, out); !s.ok()) return s;
  }
  for (const v1::ScheduledRequest& r : in.cached_requests()) {
    if (absl::Status s = DecodeRequest(r, /*is_new=*/false, limits, out); !s.ok()) return s;
  }
  if (in.finished_request_ids_size() != in.finished_slots_size()) {
    return absl::InvalidArgumentError(absl::StrCat(in.finished_request_ids_size(),
                                                   " finished_request_ids but ",
                                                   in.finished_slots_size(), " finished_slots"));
  }
  step.finished_request_ids.assign(in.finished_request_ids().begin(),
                                   in.finished_request_ids().end());
  step.finished_slots.assign(in.finished_slots().begin(), in.finished_slots().end());
  DecodePairs(in.blocks_to_swap_in(), &step.blocks_to_swap_in);
  DecodePairs(in.blocks_to_swap_out(), &step.blocks_to_swap_out);
  DecodePairs(in.blocks_to_copy(), &step.blocks_to_copy);
  return absl::OkStatus();
}

void EncodeStepResult(const ModelOutput& output, v1::StepResult* out) {
  out->Clear();
  out->set_step_id(static_cast<uint64_t>(output.step_id));
  out->mutable_sampled_token_ids()->Add(output.sampled_token_ids.begin(),
                                        output.sampled_token_ids.end());
  out->mutable_logprobs()->Reserve(static_cast<int>(output.logprobs.size()));
  for (size_t i = 0; i < output.logprobs.size(); ++i) {
    const SampleLogprobs& lp = output.logprobs[i];
    v1::Logprobs* q = out->add_logprobs();
    if (i < output.sampled_token_ids.size()) {
      q->mutable_sampled()->set_token_id(output.sampled_token_ids[i]);
    }
    q->mutable_sampled()->set_logprob(lp.logprob);
    for (const auto& [token, logprob] : lp.top) {
      v1::TokenLogprob* t = q->add_top();
      t->set_token_id(token);
      t->set_logprob(logprob);
    }
  }
  if (output.worker_stats.has_value()) {
    EncodeWorkerStats(*output.worker_stats, out->mutable_worker_stats());
  }
}

uint64_t SampledTokensDigest(std::span<const TokenId> tokens) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const TokenId t : tokens) {
    const uint32_t v = static_cast<uint32_t>(t);
    for (int b = 0; b < 4; ++b) {
      h ^= (v >> (8 * b)) & 0xFF;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

void EncodeWorkerStats(const WorkerStats& stats, v1::WorkerStats* out) {
  out->set_sampler(stats.sampler == WorkerStats::Sampler::kDevice
                       ? v1::WorkerStats::SAMPLER_KIND_DEVICE
                       : v1::WorkerStats::SAMPLER_KIND_HOST);
  out->set_cuda_graphs_enabled(stats.cuda_graphs_enabled);
  out->set_steps(static_cast<uint64_t>(stats.steps));
  out->set_graph_steps(static_cast<uint64_t>(stats.graph_steps));
  out->set_graphs_captured(static_cast<uint32_t>(stats.graphs_captured));
  out->set_device_sampled_steps(static_cast<uint64_t>(stats.device_sampled_steps));
  out->set_host_sampled_steps(static_cast<uint64_t>(stats.host_sampled_steps));
  out->set_linear_plans(static_cast<uint64_t>(stats.linear_plans));
  out->set_linear_plan_hits(static_cast<uint64_t>(stats.linear_plan_hits));
  out->set_linear_plan_misses(static_cast<uint64_t>(stats.linear_plan_misses));
  out->set_constrained_samples(static_cast<uint64_t>(stats.constrained_samples));
  out->set_grammar_mask_micros(static_cast<uint64_t>(stats.grammar_mask_micros));
  const WorkerStats::Memory& m = stats.memory;
  v1::WorkerStats::Memory* mo = out->mutable_memory();
  mo->set_resident(static_cast<uint64_t>(m.resident));
  mo->set_weights(static_cast<uint64_t>(m.weights));
  mo->set_coded_weights(static_cast<uint64_t>(m.coded_weights));
  mo->set_kv_cache_reserved(static_cast<uint64_t>(m.kv_reserved));
  mo->set_kv_cache_resident(static_cast<uint64_t>(m.kv_resident));
  mo->set_swap_reserved(static_cast<uint64_t>(m.swap_reserved));
  mo->set_swap_resident(static_cast<uint64_t>(m.swap_resident));
  mo->set_activations(static_cast<uint64_t>(m.activations));
}

WorkerStats DecodeWorkerStats(const v1::WorkerStats& in) {
  WorkerStats s;
  s.sampler = in.sampler() == v1::WorkerStats::SAMPLER_KIND_DEVICE ? WorkerStats::Sampler::kDevice
                                                                   : WorkerStats::Sampler::kHost;
  s.cuda_graphs_enabled = in.cuda_graphs_enabled();
  s.steps = static_cast<int64_t>(in.steps());
  s.graph_steps = static_cast<int64_t>(in.graph_steps());
  s.graphs_captured = in.graphs_captured();
  s.device_sampled_steps = static_cast<int64_t>(in.device_sampled_steps());
  s.host_sampled_steps = static_cast<int64_t>(in.host_sampled_steps());
  s.linear_plans = static_cast<int64_t>(in.linear_plans());
  s.linear_plan_hits = static_cast<int64_t>(in.linear_plan_hits());
  s.linear_plan_misses = static_cast<int64_t>(in.linear_plan_misses());
  s.constrained_samples = static_cast<int64_t>(in.constrained_samples());
  s.grammar_mask_micros = static_cast<int64_t>(in.grammar_mask_micros());
  const v1::WorkerStats::Memory& m = in.memory();
  s.memory.resident = static_cast<int64_t>(m.resident());
  s.memory.weights = static_cast<int64_t>(m.weights());
  s.memory.coded_weights = static_cast<int64_t>(m.coded_weights());
  s.memory.kv_reserved = static_cast<int64_t>(m.kv_cache_reserved());
  s.memory.kv_resident = static_cast<int64_t>(m.kv_cache_resident());
  s.memory.swap_reserved = static_cast<int64_t>(m.swap_reserved());
  s.memory.swap_resident = static_cast<int64_t>(m.swap_resident());
  s.memory.activations = static_cast<int64_t>(m.activations());
  return s;
}

absl::Status DecodeStepResult(const v1::StepResult& in, ModelOutput* out) {
  if (in.error_code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(in.error_code()), in.error_message());
  }
  out->step_id = static_cast<int64_t>(in.step_id());
  out->sampled_token_ids.clear();
  out->sampled_token_ids.reserve(in.sampled_token_ids_size());
  for (const int32_t t : in.sampled_token_ids()) {
    if (t < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", in.step_id(), ": sampled token id ", t, " is negative"));
    }
    out->sampled_token_ids.push_back(t);
  }
  out->logprobs.clear();
  if (in.logprobs_size() != 0 && in.logprobs_size() != in.sampled_token_ids_size()) {
    return absl::InvalidArgumentError(absl::StrCat("step ", in.step_id(), ": ", in.logprobs_size(),
                                                   " logprobs for ", in.sampled_token_ids_size(),
                                                   " tokens"));
  }
  out->logprobs.reserve(in.logprobs_size());
  for (const v1::Logprobs& q : in.logprobs()) {
    SampleLogprobs& lp = out->logprobs.emplace_back();
    lp.logprob = q.sampled().logprob();
    lp.top.reserve(q.top_size());
    for (const v1::TokenLogprob& t : q.top()) lp.top.emplace_back(t.token_id(), t.logprob());
  }
  out->worker_stats.reset();
  if (in.has_worker_stats()) out->worker_stats = DecodeWorkerStats(in.worker_stats());
  return absl::OkStatus();
}

}  // namespace llm
