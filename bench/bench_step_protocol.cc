// bench_step_protocol: what the step protocol on the wire costs per engine step.
//
//   BM_WireStep/N         a decode step of N requests (one sequence each, a new block every
//                         16th step, no token ids: the workers keep what they sample):
//                         EncodeStepRequest + SerializeToString + ParseFromString +
//                         DecodeStepRequest, and the StepResult of N tokens (with its digest)
//                         back the same way
//   BM_DecodeDiff/N/B     the same round trip at N = 256 and 4,096 requests, B = 0 as the
//                         protocol is, B = 1 with each sampled token sent back in the next
//                         step's diff (what workers that do not keep their tokens need): the
//                         baseline, in the same run; the summary prints both steps' bytes
//   BM_WireNewStep        256 new requests with 512-token prompts (32 blocks each)
//   BM_EncodeSerialize/256, BM_ParseDecode/256   the scheduler's and the worker's halves
//   BM_Baseline_Copy/N    copying the same SchedulerOutput and ModelOutput in memory: what an
//                         in-process executor would at least do with them
//   BM_GrpcRoundTrip/N    one StepRequest written and one StepResult read over a real loopback
//                         gRPC bidi stream to a minimal echo service (no model), the encode
//                         and decode included: the protocol's whole overhead per step
//
// The summary prints µs per step, ns per request and the ratio to the in-memory copy.
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/summary_reporter.h"
#include "benchmark/benchmark.h"
#include "grpcpp/grpcpp.h"
#include "llm/v1/worker_service.grpc.pb.h"
#include "protocol/step_codec.h"

namespace llm {
namespace {

// A decode step (num_new_requests == 0) or a step of new requests with `prompt_len` prompts.
struct StepFixture {
  // tokens_sent_back: a decode step of the earlier protocol, which sent each sequence's last
  // sampled token back to the workers.
  StepFixture(int num_requests, bool new_requests, int prompt_len = 512,
              bool tokens_sent_back = false) {
    params.temperature = 0.8;
    params.top_p = 0.95;
    params.top_k = 40;
    params.max_tokens = 256;
    prompt.resize(prompt_len);
    for (int i = 0; i < prompt_len; ++i) prompt[i] = (i * 7919) % 32000;
    ids.reserve(num_requests);
    for (int r = 0; r < num_requests; ++r) ids.push_back("req-" + std::to_string(r));
    step.step_id = 1000;
    for (int r = 0; r < num_requests; ++r) {
      ScheduledRequest q;
      q.slot = r;
      q.request_id = ids[r];
      const uint32_t seq = static_cast<uint32_t>(step.seqs.size());
      ScheduledSequence s;
      s.index = 0;
      if (new_requests) {
        const int blocks = (prompt_len + 15) / 16;
        s.new_to_workers = true;
        s.replace_block_table = true;
        s.block_ids = {static_cast<uint32_t>(step.block_ids.size()), static_cast<uint32_t>(blocks)};
        for (int b = 0; b < blocks; ++b) step.block_ids.push_back(r * blocks + b);
        q.prompt_token_ids = prompt;
        q.sampling_params = &params;
        q.num_scheduled_tokens = prompt_len;
      } else {
        if (tokens_sent_back) {
          s.new_token_ids = {static_cast<uint32_t>(step.token_ids.size()), 1};
          step.token_ids.push_back(1234 + r);
        }
        if (r % 16 == 0) {  // this request's context just crossed a block boundary
          s.block_ids = {static_cast<uint32_t>(step.block_ids.size()), 1};
          step.block_ids.push_back(r);
        }
        q.num_computed_tokens = 700 + r;
        q.num_scheduled_tokens = 1;
      }
      q.num_samples = 1;
      q.seqs = {seq, 1};
      step.seqs.push_back(s);
      (new_requests ? step.new_requests : step.cached_requests).push_back(q);
      step.total_num_scheduled_tokens += q.num_scheduled_tokens;
      ++step.total_num_samples;
    }
    result.step_id = step.step_id;
    for (int r = 0; r < num_requests; ++r) result.sampled_token_ids.push_back(4321 + r);
  }

  SamplingParams params;
  std::vector<TokenId> prompt;
  std::vector<std::string> ids;
  SchedulerOutput step;
  ModelOutput result;
};

// Scheduler side: encode + serialize; worker side: parse + decode; the result back likewise.
void WireRoundTrip(const StepFixture& f, v1::StepRequest* request, std::string* bytes,
                   v1::StepRequest* received, DecodedStep* decoded, v1::StepResult* result,
                   std::string* result_bytes, v1::StepResult* result_received, ModelOutput* out) {
  EncodeStepRequest(f.step, request);
  request->SerializeToString(bytes);
  received->ParseFromString(*bytes);
  if (!DecodeStepRequest(*received, SamplingLimits{}, decoded).ok()) std::abort();
  EncodeStepResult(f.result, result);
  result->set_sampled_digest(SampledTokensDigest(f.result.sampled_token_ids));
  result->SerializeToString(result_bytes);
  result_received->ParseFromString(*result_bytes);
  if (!DecodeStepResult(*result_received, out).ok()) std::abort();
  // The scheduler checks every rank's digest against rank 0's tokens.
  if (SampledTokensDigest(out->sampled_token_ids) != result_received->sampled_digest()) {
    std::abort();
  }
}

void RunWire(benchmark::State& state, const StepFixture& f) {
  v1::StepRequest request, received;
  v1::StepResult result, result_received;
  std::string bytes, result_bytes;
  DecodedStep decoded;
  ModelOutput out;
  for (auto _ : state) {
    WireRoundTrip(f, &request, &bytes, &received, &decoded, &result, &result_bytes,
                  &result_received, &out);
    benchmark::DoNotOptimize(out.sampled_token_ids.data());
  }
  state.counters["request_bytes"] = static_cast<double>(bytes.size());
  state.counters["result_bytes"] = static_cast<double>(result_bytes.size());
}

void BM_WireStep(benchmark::State& state) {
  const StepFixture f(static_cast<int>(state.range(0)), /*new_requests=*/false);
  RunWire(state, f);
}
BENCHMARK(BM_WireStep)->Arg(1)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);

void BM_DecodeDiff(benchmark::State& state) {
  const StepFixture f(static_cast<int>(state.range(0)), /*new_requests=*/false, 512,
                      /*tokens_sent_back=*/state.range(1) != 0);
  RunWire(state, f);
}
BENCHMARK(BM_DecodeDiff)
    ->Args({256, 0})
    ->Args({256, 1})
    ->Args({4096, 0})
    ->Args({4096, 1})
    ->Unit(benchmark::kMicrosecond);

void BM_WireNewStep(benchmark::State& state) {
  const StepFixture f(256, /*new_requests=*/true, 512);
  RunWire(state, f);
}
BENCHMARK(BM_WireNewStep)->Unit(benchmark::kMicrosecond);

// The parts of BM_WireStep/256, to see where its time goes.
void BM_EncodeSerialize(benchmark::State& state) {
  const StepFixture f(static_cast<int>(state.range(0)), /*new_requests=*/false);
  v1::StepRequest request;
  std::string bytes;
  for (auto _ : state) {
    EncodeStepRequest(f.step, &request);
    request.SerializeToString(&bytes);
    benchmark::DoNotOptimize(bytes.data());
  }
}
BENCHMARK(BM_EncodeSerialize)->Arg(256)->Unit(benchmark::kMicrosecond);

void BM_ParseDecode(benchmark::State& state) {
  const StepFixture f(static_cast<int>(state.range(0)), /*new_requests=*/false);
  v1::StepRequest request, received;
  EncodeStepRequest(f.step, &request);
  const std::string bytes = request.SerializeAsString();
  DecodedStep decoded;
  for (auto _ : state) {
    received.ParseFromString(bytes);
    if (!DecodeStepRequest(received, SamplingLimits{}, &decoded).ok()) std::abort();
    benchmark::DoNotOptimize(decoded.output.seqs.data());
  }
}
BENCHMARK(BM_ParseDecode)->Arg(256)->Unit(benchmark::kMicrosecond);

void BM_Baseline_Copy(benchmark::State& state) {
  const bool fresh = state.range(1) != 0;
  const StepFixture f(static_cast<int>(state.range(0)), fresh, 512);
  SchedulerOutput copy;
  ModelOutput out;
  for (auto _ : state) {
    copy = f.step;  // vectors deep, prompts and ids by view (as an in-process executor sees them)
    out = f.result;
    benchmark::DoNotOptimize(copy.seqs.data());
    benchmark::DoNotOptimize(out.sampled_token_ids.data());
  }
}
BENCHMARK(BM_Baseline_Copy)
    ->Args({1, 0})
    ->Args({64, 0})
    ->Args({256, 0})
    ->Args({256, 1})
    ->Unit(benchmark::kMicrosecond);

// The worker's side reduced to the protocol: each StepRequest is answered by a StepResult with
// its step id and one token per request, in order.
class EchoWorker final : public v1::WorkerService::Service {
  grpc::Status Step(grpc::ServerContext*,
                    grpc::ServerReaderWriter<v1::StepResult, v1::StepRequest>* stream) override {
    v1::StepRequest request;
    v1::StepResult result;
    while (stream->Read(&request)) {
      result.Clear();
      result.set_step_id(request.step_id());
      const int n = request.new_requests_size() + request.cached_requests_size();
      for (int i = 0; i < n; ++i) result.add_sampled_token_ids(4321 + i);
      if (!stream->Write(result)) break;
    }
    return grpc::Status::OK;
  }
};

void BM_GrpcRoundTrip(benchmark::State& state) {
  const StepFixture f(static_cast<int>(state.range(0)), /*new_requests=*/false);
  EchoWorker service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    state.SkipWithError("cannot start the loopback server");
    return;
  }
  auto stub = v1::WorkerService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto stream = stub->Step(&ctx);
  v1::StepRequest request;
  v1::StepResult result;
  ModelOutput out;
  int64_t step_id = 0;
  for (auto _ : state) {
    EncodeStepRequest(f.step, &request);
    request.set_step_id(++step_id);
    if (!stream->Write(request) || !stream->Read(&result)) {
      state.SkipWithError("the stream broke");
      break;
    }
    if (!DecodeStepResult(result, &out).ok()) std::abort();
  }
  stream->WritesDone();
  (void)stream->Finish();
  server->Shutdown();
}
BENCHMARK(BM_GrpcRoundTrip)->Arg(1)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);

void PrintSummary(const SummaryReporter& r) {
  std::printf(
      "\nSummary: the step protocol per engine step, wall time, best of the repetitions "
      "(ratio = wire / in-memory copy)\n");
  std::printf("%-36s %12s %10s %12s %9s %14s\n", "step", "wire", "per req", "copy", "ratio",
              "gRPC loopback");
  auto row = [&](const std::string& label, const std::string& wire, const std::string& copy,
                 const std::string& grpc, int n) {
    const double w = r.ns(wire), c = r.ns(copy), g = grpc.empty() ? 0 : r.ns(grpc);
    char g_s[32] = "-";
    if (g > 0) std::snprintf(g_s, sizeof(g_s), "%.1f us", g / 1e3);
    std::printf("%-36s %9.2f us %7.1f ns %9.2f us %8.1fx %14s\n", label.c_str(), w / 1e3, w / n,
                c / 1e3, c > 0 ? w / c : 0.0, g_s);
  };
  for (int n : {1, 64, 256}) {
    const std::string a = std::to_string(n);
    row("decode, " + a + " requests", "BM_WireStep/" + a, "BM_Baseline_Copy/" + a + "/0",
        "BM_GrpcRoundTrip/" + a, n);
  }
  row("new, 256 requests x 512-token prompts", "BM_WireNewStep", "BM_Baseline_Copy/256/1", "", 256);
  std::printf("decode, 256 requests: encode + serialize %.2f us, parse + decode %.2f us\n",
              r.ns("BM_EncodeSerialize/256") / 1e3, r.ns("BM_ParseDecode/256") / 1e3);
  std::printf(
      "\nA decode step's diff, round trip (as BM_WireStep), now (the workers keep their tokens) "
      "and with each sampled token sent back (the protocol before):\n");
  std::printf("%-10s %14s %12s %18s %14s %9s\n", "requests", "request bytes", "time",
              "sent back: bytes", "time", "ratio");
  for (int n : {256, 4096}) {
    auto request_bytes = [n](bool sent_back) {
      v1::StepRequest request;
      EncodeStepRequest(StepFixture(n, false, 512, sent_back).step, &request);
      return request.ByteSizeLong();
    };
    const std::string a = "BM_DecodeDiff/" + std::to_string(n);
    const double now = r.ns(a + "/0"), before = r.ns(a + "/1");
    std::printf("%-10d %14zu %9.1f us %18zu %11.1f us %8.2fx\n", n, request_bytes(false), now / 1e3,
                request_bytes(true), before / 1e3, now > 0 ? before / now : 0.0);
  }
  const double g1 = r.ns("BM_GrpcRoundTrip/1"), w1 = r.ns("BM_WireStep/1");
  if (g1 > 0) {
    std::printf(
        "\nper-step protocol overhead over loopback gRPC: %.1f us for 1 request (codec %.1f us "
        "of it), %.1f us for 256\n",
        g1 / 1e3, w1 / 1e3, r.ns("BM_GrpcRoundTrip/256") / 1e3);
  }
}

}  // namespace
}  // namespace llm

int main(int argc, char** argv) {
  llm::SummaryReporter reporter(llm::SummaryReporter::Clock::kReal);
  return llm::RunBenchmarksWithSummary(argc, argv, reporter, llm::PrintSummary);
}
