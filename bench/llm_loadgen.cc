// llm-loadgen: a load generator for a running llm-scheduler. Sends --num-requests streaming
// Generate calls with prompt and output lengths drawn uniformly from the given ranges (random
// token ids, ignore_eos so each request produces exactly its output length), either as a
// closed loop (--rate=0: --concurrency clients back to back) or with Poisson arrivals at
// --rate requests/s (at most --concurrency in flight). Prints throughput and latency
// percentiles with the metric definitions of vLLM's serving benchmark:
//   TTFT  time from sending a request to its first token
//   TPOT  per request: (end-to-end latency - TTFT) / (output tokens per sequence - 1)
//   ITL   every gap between two consecutive responses that carry tokens, over all requests
//   E2E   time from sending a request to its last response
// Exits 1 when any request failed (the first error is printed).
//
// Soak mode (bench/soak.sh): --duration=S keeps --concurrency clients busy back to back for S
// seconds (--num-requests and --rate are then ignored). --cancel-fraction of the requests are
// cancelled by the client after a random number of streamed tokens (0 to their output length;
// 0: before the first), and --deadline-fraction get a gRPC deadline drawn uniformly from 1 to
// --deadline-ms milliseconds. A cancelled request that ends CANCELLED, and one with a deadline
// that ends DEADLINE_EXCEEDED, count as such, not as failures; any other error is a failure.
//
//   llm-loadgen --address=127.0.0.1:50051 --num-requests=32 --concurrency=8 [--rate=4]
//   llm-loadgen --duration=600 --concurrency=32 --cancel-fraction=0.1 --deadline-fraction=0.1
//
// --json-schema constrains every request (structured outputs), to measure their cost against
// the same workload without (bench/structured_overhead.sh).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/flag_parser.h"
#include "common/grpc_security.h"
#include "llm/v1/llm_service.grpc.pb.h"

namespace llm {
namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string address = "127.0.0.1:50051";
  PublicChannelOptions channel;
  int num_requests = 32;
  int concurrency = 8;
  double rate = 0;  // requests/s; 0: closed loop
  int min_prompt_len = 8;
  int max_prompt_len = 128;
  int min_output_len = 8;
  int max_output_len = 64;
  double n_fraction = 0;  // share of requests with n = 2
  double temperature = 1.0;
  int64_t seed = 0;
  double duration_s = 0;  // > 0: soak mode
  double cancel_fraction = 0;
  double deadline_fraction = 0;
  int deadline_ms = 2000;
  std::string json_schema;  // non-empty: every request's output is constrained to it
};

struct Planned {
  double arrival_s = 0;  // since the start
  std::vector<int32_t> prompt;
  int output_len = 0;
  int n = 1;
  int cancel_after = -1;  // >= 0: the client cancels once it has this many tokens
  int deadline_ms = 0;    // > 0: the call's deadline
};

struct Result {
  bool ok = false;
  bool cancelled = false;          // cancelled by the client as planned, and ended CANCELLED
  bool deadline_exceeded = false;  // had a deadline, and ended DEADLINE_EXCEEDED
  std::string error;
  int prompt_tokens = 0;
  int output_tokens = 0;  // over all n sequences
  int n = 1;
  double ttft = 0;
  double e2e = 0;
  std::vector<double> itl;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * (v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - lo);
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

void PrintMetric(const char* title, const char* name, const std::vector<double>& seconds) {
  std::printf("%s\n", title);
  std::printf("  %-28s %10.2f\n", (std::string("Mean ") + name + " (ms):").c_str(),
              Mean(seconds) * 1e3);
  for (double p : {50.0, 90.0, 99.0}) {
    std::printf("  %-28s %10.2f\n",
                (std::string("P") + std::to_string(int(p)) + " " + name + " (ms):").c_str(),
                Percentile(seconds, p) * 1e3);
  }
}

Result RunOne(v1::LLMService::Stub& stub, const Planned& plan, const Args& args, int index) {
  v1::GenerateRequest req;
  *req.mutable_token_ids()->mutable_ids() = {plan.prompt.begin(), plan.prompt.end()};
  v1::SamplingParams* p = req.mutable_sampling_params();
  p->set_n(plan.n);
  p->set_max_tokens(plan.output_len);
  p->set_temperature(args.temperature);
  p->set_seed(static_cast<uint64_t>(args.seed + index));
  p->set_ignore_eos(true);
  if (!args.json_schema.empty()) p->mutable_structured_output()->set_json_schema(args.json_schema);
  req.set_stream(true);

  Result r;
  r.n = plan.n;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   (plan.deadline_ms > 0 ? std::chrono::milliseconds(plan.deadline_ms)
                                         : std::chrono::milliseconds(std::chrono::minutes(10))));
  const Clock::time_point t0 = Clock::now();
  double last = -1;
  auto reader = stub.Generate(&ctx, req);
  bool cancel_sent = false;
  if (plan.cancel_after == 0) {
    ctx.TryCancel();
    cancel_sent = true;
  }
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    int tokens = 0;
    for (const v1::SequenceOutput& s : resp.outputs()) tokens += s.token_ids_size();
    if (tokens > 0) {
      if (last < 0) {
        r.ttft = t;
      } else {
        r.itl.push_back(t - last);
      }
      last = t;
    }
    r.output_tokens += tokens;
    if (resp.has_usage()) r.prompt_tokens = resp.usage().prompt_tokens();
    if (!cancel_sent && plan.cancel_after > 0 && r.output_tokens >= plan.cancel_after) {
      ctx.TryCancel();
      cancel_sent = true;
    }
  }
  const grpc::Status s = reader->Finish();
  // As vLLM's benchmark: to the last response that carried output, not the trailing status.
  r.e2e = last >= 0 ? last : std::chrono::duration<double>(Clock::now() - t0).count();
  r.ok = s.ok();
  r.cancelled = cancel_sent && s.error_code() == grpc::StatusCode::CANCELLED;
  r.deadline_exceeded =
      plan.deadline_ms > 0 && s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
  if (!s.ok()) {
    r.error = absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())) + ": " +
              s.error_message();
  }
  return r;
}

// One request of the workload: the draws of `rng` in a fixed order (prompt length, output
// length, prompt tokens, n), then the arrival gap when `gap` is set.
Planned Draw(std::mt19937_64& rng, const Args& a, int max_len, int vocab_size) {
  std::uniform_int_distribution<int32_t> token(3, std::max<int32_t>(3, vocab_size - 1));
  std::bernoulli_distribution two(a.n_fraction);
  Planned p;
  int prompt_len = std::uniform_int_distribution<int>(a.min_prompt_len, a.max_prompt_len)(rng);
  p.output_len = std::uniform_int_distribution<int>(a.min_output_len, a.max_output_len)(rng);
  if (max_len > 0 && prompt_len + p.output_len > max_len) {
    prompt_len = std::max(1, max_len - p.output_len);
  }
  for (int i = 0; i < prompt_len; ++i) p.prompt.push_back(token(rng));
  p.n = two(rng) ? 2 : 1;
  return p;
}

// The cancel and deadline of a request, from their own generator (so that the workload itself
// does not change with these flags).
void DrawInterruptions(std::mt19937_64& rng, const Args& a, Planned* p) {
  if (std::bernoulli_distribution(a.cancel_fraction)(rng)) {
    p->cancel_after = std::uniform_int_distribution<int>(0, p->output_len * p->n - 1)(rng);
  }
  if (std::bernoulli_distribution(a.deadline_fraction)(rng)) {
    p->deadline_ms = std::uniform_int_distribution<int>(1, a.deadline_ms)(rng);
  }
}

int Run(int argc, char** argv) {
  Args a;
  FlagParser flags(
      "usage: llm-loadgen [--flag=value ...]: streaming load against a running llm-scheduler");
  flags.Add("address", &a.address, "the scheduler (127.0.0.1:50051)");
  flags.Add("tls", &a.channel.tls, "connect over TLS, trusting the system's roots (false)");
  flags.Add("tls-ca", &a.channel.tls_ca, "connect over TLS, trusting this PEM file's roots (none)");
  flags.Add("tls-server-name", &a.channel.tls_server_name,
            "the name the server's certificate must carry (the address's host)");
  flags.Add("api-key", &a.channel.api_key,
            "sent as 'authorization: Bearer KEY'; default: $LLM_API_KEY (none)");
  flags.Add("num-requests", &a.num_requests, "requests to send (32)");
  flags.Add("concurrency", &a.concurrency, "most requests in flight (8)");
  flags.Add("rate", &a.rate, "Poisson arrivals per second; 0: closed loop (0)");
  flags.Add("min-prompt-len", &a.min_prompt_len, "shortest prompt in tokens (8)");
  flags.Add("max-prompt-len", &a.max_prompt_len, "longest prompt in tokens (128)");
  flags.Add("min-output-len", &a.min_output_len, "fewest tokens to generate (8)");
  flags.Add("max-output-len", &a.max_output_len, "most tokens to generate (64)");
  flags.Add("n-fraction", &a.n_fraction, "share of requests that ask for n = 2 (0)");
  flags.Add("temperature", &a.temperature, "sampling temperature (1.0)");
  flags.Add("seed", &a.seed, "seed of the workload and of the requests' sampling (0)");
  flags.Add("duration", &a.duration_s,
            "seconds; > 0: soak mode, --concurrency clients back to back until then, "
            "--num-requests and --rate ignored (0)");
  flags.Add("cancel-fraction", &a.cancel_fraction,
            "share of requests the client cancels after a random number of tokens (0)");
  flags.Add("deadline-fraction", &a.deadline_fraction,
            "share of requests sent with a deadline of 1 to --deadline-ms milliseconds (0)");
  flags.Add("deadline-ms", &a.deadline_ms,
            "longest deadline of the --deadline-fraction requests, in ms (2000)");
  flags.Add("json-schema", &a.json_schema,
            "a JSON schema (its text) every request's output is constrained to; empty: none. "
            "Choose one the outputs cannot complete (minItems beyond them) to mask every token "
            "(empty)");
  flags.Parse(argc, argv);
  std::string bad;
  if (a.duration_s < 0) bad = "--duration must be >= 0, got " + std::to_string(a.duration_s);
  if (a.cancel_fraction < 0 || a.cancel_fraction > 1) {
    bad = "--cancel-fraction must be in [0, 1], got " + std::to_string(a.cancel_fraction);
  }
  if (a.deadline_fraction < 0 || a.deadline_fraction > 1) {
    bad = "--deadline-fraction must be in [0, 1], got " + std::to_string(a.deadline_fraction);
  }
  if (a.deadline_ms < 1) bad = "--deadline-ms must be >= 1, got " + std::to_string(a.deadline_ms);
  if (!bad.empty()) {
    std::fprintf(stderr, "llm-loadgen: %s\n", bad.c_str());
    return 2;
  }
  if (a.num_requests < 1 || a.concurrency < 1 || a.min_prompt_len < 1 ||
      a.max_prompt_len < a.min_prompt_len || a.min_output_len < 1 ||
      a.max_output_len < a.min_output_len || a.rate < 0) {
    std::fprintf(stderr, "llm-loadgen: inconsistent flags\n%s", flags.Usage().c_str());
    return 2;
  }

  a.channel.api_key = ApiKeyFromFlagOrEnv(a.channel.api_key);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      CreatePublicChannel(a.address, a.channel);
  if (!channel.ok()) {
    std::fprintf(stderr, "llm-loadgen: %s\n", std::string(channel.status().message()).c_str());
    return 2;
  }
  auto stub = v1::LLMService::NewStub(*channel);
  v1::GetModelInfoResponse info;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status s = stub->GetModelInfo(&ctx, {}, &info);
    if (!s.ok()) {
      std::fprintf(stderr, "llm-loadgen: GetModelInfo at %s: %s\n", a.address.c_str(),
                   s.error_message().c_str());
      return 1;
    }
  }
  // The workload, drawn up front from --seed: token ids avoid the first few (special) ids.
  std::mt19937_64 rng(static_cast<uint64_t>(a.seed));
  std::mt19937_64 interruptions(static_cast<uint64_t>(a.seed) ^ 0x9e3779b97f4a7c15ULL);
  const int max_len = static_cast<int>(info.max_model_len());
  const int vocab_size = static_cast<int>(info.vocab_size());
  const bool soak = a.duration_s > 0;
  std::exponential_distribution<double> gap(a.rate > 0 ? a.rate : 1.0);
  std::vector<Planned> plans(soak ? 0 : a.num_requests);
  double t = 0;
  for (Planned& p : plans) {
    p = Draw(rng, a, max_len, vocab_size);
    if (a.rate > 0) t += gap(rng);
    p.arrival_s = t;
    DrawInterruptions(interruptions, a, &p);
  }

  if (soak) {
    std::printf(
        "llm-loadgen: soak for %.0f s against %s (%s, max_model_len %u), %d clients "
        "back to back, %.0f%% cancelled, %.0f%% with a deadline of at most %d ms\n",
        a.duration_s, a.address.c_str(), info.model_name().c_str(), info.max_model_len(),
        a.concurrency, a.cancel_fraction * 100, a.deadline_fraction * 100, a.deadline_ms);
  } else {
    std::printf("llm-loadgen: %d requests to %s (%s, max_model_len %u), %d in flight at most, %s\n",
                a.num_requests, a.address.c_str(), info.model_name().c_str(), info.max_model_len(),
                a.concurrency,
                a.rate > 0 ? ("Poisson arrivals at " + std::to_string(a.rate) + " req/s").c_str()
                           : "closed loop");
  }
  std::fflush(stdout);
  std::vector<Result> results(plans.size());
  std::mutex results_mu;  // soak mode: results grows
  std::atomic<int> next{0};
  const Clock::time_point start = Clock::now();
  const Clock::time_point end = start + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(a.duration_s));
  std::vector<std::thread> clients;
  const int num_clients = soak ? a.concurrency : std::min(a.concurrency, a.num_requests);
  for (int c = 0; c < num_clients; ++c) {
    clients.emplace_back([&, c] {
      if (soak) {
        std::mt19937_64 my_rng(static_cast<uint64_t>(a.seed) * 1000003 + c);
        while (Clock::now() < end) {
          Planned p = Draw(my_rng, a, max_len, vocab_size);
          DrawInterruptions(my_rng, a, &p);
          Result r = RunOne(*stub, p, a, next.fetch_add(1));
          std::lock_guard<std::mutex> lock(results_mu);
          results.push_back(std::move(r));
        }
        return;
      }
      for (int i; (i = next.fetch_add(1)) < a.num_requests;) {
        std::this_thread::sleep_until(start +
                                      std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(plans[i].arrival_s)));
        results[i] = RunOne(*stub, plans[i], a, i);
      }
    });
  }
  for (std::thread& c : clients) c.join();
  const double duration = std::chrono::duration<double>(Clock::now() - start).count();

  int ok = 0, cancelled = 0, deadline_exceeded = 0, failed = 0;
  long input_tokens = 0, output_tokens = 0;
  std::vector<double> ttft, tpot, itl, e2e;
  std::string first_error;
  for (const Result& r : results) {
    if (r.cancelled) {
      ++cancelled;
      continue;
    }
    if (r.deadline_exceeded) {
      ++deadline_exceeded;
      continue;
    }
    if (!r.ok) {
      ++failed;
      if (first_error.empty()) first_error = r.error;
      continue;
    }
    ++ok;
    input_tokens += r.prompt_tokens;
    output_tokens += r.output_tokens;
    ttft.push_back(r.ttft);
    e2e.push_back(r.e2e);
    // The n sequences of a request advance together: TPOT is per token of one sequence.
    const double per_seq = static_cast<double>(r.output_tokens) / r.n;
    if (per_seq > 1) tpot.push_back((r.e2e - r.ttft) / (per_seq - 1));
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
  }
  std::printf("============ Serving Benchmark Result ============\n");
  std::printf("  %-34s %10d\n", "Successful requests:", ok);
  std::printf("  %-34s %10d\n", "Failed requests:", failed);
  if (a.cancel_fraction > 0 || a.deadline_fraction > 0) {
    std::printf("  %-34s %10d\n", "Cancelled by the client:", cancelled);
    std::printf("  %-34s %10d\n", "Deadline exceeded:", deadline_exceeded);
  }
  std::printf("  %-34s %10.2f\n", "Benchmark duration (s):", duration);
  std::printf("  %-34s %10ld\n", "Total input tokens:", input_tokens);
  std::printf("  %-34s %10ld\n", "Total generated tokens:", output_tokens);
  std::printf("  %-34s %10.2f\n", "Request throughput (req/s):", ok / duration);
  std::printf("  %-34s %10.2f\n", "Output token throughput (tok/s):", output_tokens / duration);
  std::printf("  %-34s %10.2f\n",
              "Total token throughput (tok/s):", (input_tokens + output_tokens) / duration);
  PrintMetric("---------------Time to First Token----------------", "TTFT", ttft);
  PrintMetric("-----Time per Output Token (excl. 1st token)------", "TPOT", tpot);
  PrintMetric("---------------Inter-token Latency----------------", "ITL", itl);
  PrintMetric("---------------End-to-end Latency-----------------", "E2E", e2e);
  std::printf("==================================================\n");
  if (!first_error.empty()) {
    std::fprintf(stderr, "llm-loadgen: %d requests failed; the first: %s\n", failed,
                 first_error.c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace llm

int main(int argc, char** argv) { return llm::Run(argc, argv); }
