// The step protocol on the wire: SchedulerOutput <-> llm.v1.StepRequest and ModelOutput <->
// llm.v1.StepResult (protos/llm/v1/worker_service.proto mirrors scheduler_output.h field for
// field), and SamplingParams <-> llm.v1.SamplingParams.
//
// The scheduler encodes each step once and sends the same message to every rank; a worker
// decodes it into a SchedulerOutput for its ModelRunner. Decoding checks only what the wire
// form adds to the in-process types: values past their int range, a step_id past int64, the
// finished ids and slots of different lengths, a cached request that carries a prompt or
// params, and the sampling params (SamplingParams::Validate against the worker's limits); it
// answers INVALID_ARGUMENT naming the request and the field.
//
// These are invariants of the worker's resources, not request validation: a step is a typed
// message from another process, checked on arrival, and the worker's buffers are sized by the
// limits it was initialized with (n sequences, logprobs per token) while its sampler relies on
// the params' ranges. The full SamplingParams::Validate is what checks them, once per new
// request (cached requests carry no params). Requests themselves are checked once, at the
// engine's admission (Scheduler::ValidateRequest); a step that fails here is a scheduler bug or
// a mismatch of limits between scheduler and worker, never a client's error. Everything else about
// a step (negative or duplicate slots, sequences out of order, ids out of range, a request the
// worker does not hold, ...) is the BatchState's check, the same for steps from the wire and in
// process (protocol/batch_state.h).
//
// Thread-compatible: plain functions; a DecodedStep belongs to one thread.
#ifndef LLM_PROTOCOL_STEP_CODEC_H_
#define LLM_PROTOCOL_STEP_CODEC_H_

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/sampling_params.h"
#include "llm/v1/llm_service.pb.h"
#include "llm/v1/worker_service.pb.h"
#include "protocol/scheduler_output.h"

namespace llm {

// Unset proto fields take SamplingParams' defaults. Does not Validate().
SamplingParams SamplingParamsFromProto(const v1::SamplingParams& proto);
void SamplingParamsToProto(const SamplingParams& params, v1::SamplingParams* proto);

// Clears `out` and fills it from `step` (reusing `out`'s storage where protobuf can).
void EncodeStepRequest(const SchedulerOutput& step, v1::StepRequest* out);

// A SchedulerOutput decoded from a StepRequest. Its string views and spans point into the
// StepRequest passed to DecodeStepRequest and into `sampling_params`: keep both alive and
// unchanged while `output` is used.
struct DecodedStep {
  SchedulerOutput output;
  std::deque<SamplingParams> sampling_params;  // one per new request; stable addresses
};

// Replaces `out` with the decoding of `in`. On error `out` is unspecified.
absl::Status DecodeStepRequest(const v1::StepRequest& in, const SamplingLimits& limits,
                               DecodedStep* out);

void EncodeStepResult(const ModelOutput& output, v1::StepResult* out);
// INVALID_ARGUMENT for a negative token id; the error the result carries (error_code != 0)
// as that status.
absl::Status DecodeStepResult(const v1::StepResult& in, ModelOutput* out);

// A digest (64-bit FNV-1a over the ids' bytes) of one step's sampled tokens: every rank of a
// group reports it (StepResult.sampled_digest), and the scheduler refuses a step whose ranks
// disagree, since each rank appends its own tokens and their KV would diverge from there.
uint64_t SampledTokensDigest(std::span<const TokenId> tokens);

// WorkerStats <-> llm.v1.WorkerStats (the step result's, the worker's Health, GetStats).
void EncodeWorkerStats(const WorkerStats& stats, v1::WorkerStats* out);
WorkerStats DecodeWorkerStats(const v1::WorkerStats& in);

}  // namespace llm

#endif  // LLM_PROTOCOL_STEP_CODEC_H_
