// llm-client: the command-line client of llm-scheduler's public API (llm.v1.LLMService).
//
//   llm-client [--address=127.0.0.1:50051] generate "PROMPT" [--max-tokens=64]
//              [--temperature=0.8] [--n=2] [--top-p=P] [--top-k=K] [--seed=S] [--stop=S ...]
//              [--priority=P] [--no-stream] ...      streams the text, then usage and timings
//              [--json]   instead: each streamed response as one line of JSON (for scripts)
//   llm-client chat "USER MESSAGE" [--system="SYSTEM PROMPT"] [generate's flags]
//              streams the model's answer, the conversation rendered by its chat template
//   llm-client info     the served model (GetModelInfo)
//   llm-client stats    queues, KV usage, prefix-cache hit rate, preemptions, and what the
//                       workers run with (sampler, CUDA graphs, cuBLASLt plans, memory by
//                       kind) (GetStats); --json: the response as one line of JSON
//   llm-client health   grpc.health.v1 of the server
//
// Flags may be written --flag=value or --flag value, before or after the command; --stop may
// repeat. A gRPC error prints its code and message and exits 1; bad usage exits 2.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/flag_parser.h"
#include "common/grpc_security.h"
#include "google/protobuf/util/json_util.h"
#include "llm/v1/llm_service.grpc.pb.h"
#include "scheduler_service/api/metrics.h"
#include "tools/health_check.h"

namespace llm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kUnset = -1e300;  // a numeric flag not given on the command line

struct Args {
  std::string address = "127.0.0.1:50051";
  PublicChannelOptions channel;
  std::string command;
  std::string prompt;
  std::string system;     // chat: the system message (none when empty)
  std::string token_ids;  // comma-separated; instead of the prompt text
  int max_tokens = 64;
  int n = 1;
  double temperature = kUnset;
  double top_p = kUnset;
  double top_k = kUnset;
  double min_p = kUnset;
  int64_t seed = -1;
  int min_tokens = 0;
  double presence_penalty = 0;
  double frequency_penalty = 0;
  double repetition_penalty = kUnset;
  int logprobs = -1;
  std::vector<std::string> stop;
  std::string stop_token_ids;
  bool ignore_eos = false;
  bool add_special_tokens = true;
  bool no_stream = false;
  int priority = 0;
  std::string request_id;
  std::string cache_salt;
  double timeout_s = 0;  // 0: no deadline
  bool quiet = false;
  bool json = false;
};

// Flags that take no value when written alone.
const std::set<std::string>& BoolFlags() {
  static const auto* s =
      new std::set<std::string>{"ignore-eos", "add-special-tokens", "no-stream", "quiet"};
  return *s;
}

[[noreturn]] void UsageError(const std::string& msg, const FlagParser& flags) {
  std::fprintf(stderr, "llm-client: %s\n\n%s", msg.c_str(), flags.Usage().c_str());
  std::exit(2);
}

Args Parse(int argc, char** argv) {
  Args a;
  std::string stop_placeholder;
  FlagParser flags(
      "usage: llm-client [--address=HOST:PORT] COMMAND [ARGS] [--flag=value ...]\n"
      "commands:\n"
      "  generate \"PROMPT\"   stream a completion, then usage and timings\n"
      "  chat \"MESSAGE\"     stream the answer to a user message (the model's chat template)\n"
      "  info               the served model (GetModelInfo)\n"
      "  stats              the scheduler's queues and KV cache (GetStats)\n"
      "  health             grpc.health.v1 status of the server\n"
      "flags (--flag=value or --flag value):");
  flags.Add("address", &a.address, "the scheduler (127.0.0.1:50051)");
  flags.Add("tls", &a.channel.tls, "connect over TLS, trusting the system's roots (false)");
  flags.Add("tls-ca", &a.channel.tls_ca, "connect over TLS, trusting this PEM file's roots (none)");
  flags.Add("tls-server-name", &a.channel.tls_server_name,
            "the name the server's certificate must carry (the address's host)");
  flags.Add("api-key", &a.channel.api_key,
            "sent as 'authorization: Bearer KEY'; default: $LLM_API_KEY (none)");
  flags.Add("system", &a.system, "chat: the system message (none)");
  flags.Add("max-tokens", &a.max_tokens, "tokens to generate per sequence (64)");
  flags.Add("n", &a.n, "sequences to generate (1)");
  flags.Add("temperature", &a.temperature, "0 is greedy (server default: 1)");
  flags.Add("top-p", &a.top_p, "nucleus sampling mass in (0, 1] (server default: 1)");
  flags.Add("top-k", &a.top_k, "-1 (off) or the number of tokens kept (server default: -1)");
  flags.Add("min-p", &a.min_p, "in [0, 1] (server default: 0)");
  flags.Add("seed", &a.seed, "sampling seed (random)");
  flags.Add("min-tokens", &a.min_tokens, "tokens before EOS or a stop may end a sequence (0)");
  flags.Add("presence-penalty", &a.presence_penalty, "in [-2, 2] (0)");
  flags.Add("frequency-penalty", &a.frequency_penalty, "in [-2, 2] (0)");
  flags.Add("repetition-penalty", &a.repetition_penalty, "> 0 (server default: 1)");
  flags.Add("logprobs", &a.logprobs, "top-N logprobs per token (none)");
  flags.Add("stop", &stop_placeholder, "a stop string; repeat for more (none)");
  flags.Add("stop-token-ids", &a.stop_token_ids, "comma-separated token ids that stop (none)");
  flags.Add("ignore-eos", &a.ignore_eos, "keep generating past EOS (false)");
  flags.Add("add-special-tokens", &a.add_special_tokens, "add BOS when tokenizing (true)");
  flags.Add("token-ids", &a.token_ids, "comma-separated prompt token ids instead of text");
  flags.Add("no-stream", &a.no_stream, "one response at the end instead of a stream (false)");
  flags.Add("priority", &a.priority, "smaller runs first under priority scheduling (0)");
  flags.Add("request-id", &a.request_id, "request id (generated by the server)");
  flags.Add("cache-salt", &a.cache_salt, "isolates prefix-cache entries (none)");
  flags.Add("timeout", &a.timeout_s, "seconds before the call is cancelled (0: none)");
  flags.Add("quiet", &a.quiet, "print only the summary, not the text (false)");
  flags.Add("json", &a.json,
            "generate and chat: print each streamed GenerateResponse as one line of JSON "
            "(protobuf's JSON mapping: token ids, text, logprobs, usage) and nothing else; "
            "stats: the GetStatsResponse as one line of JSON, worker memory included (false)");

  // Positionals out, "--flag value" joined into "--flag=value", --stop collected (repeats).
  std::vector<std::string> rebuilt = {argv[0]};
  std::vector<std::string> positionals;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.size() < 2 || arg[0] != '-') {
      positionals.push_back(arg);
      continue;
    }
    if (arg.rfind("--", 0) == 0 && arg.find('=') == std::string::npos && arg != "--help" &&
        BoolFlags().count(arg.substr(2)) == 0) {
      if (i + 1 >= argc) UsageError(arg + " needs a value", flags);
      arg += "=" + std::string(argv[++i]);
    }
    if (arg.rfind("--stop=", 0) == 0) {
      a.stop.push_back(arg.substr(7));
      continue;
    }
    rebuilt.push_back(arg);
  }
  std::vector<char*> ptrs;
  for (std::string& s : rebuilt) ptrs.push_back(s.data());
  flags.Parse(static_cast<int>(ptrs.size()), ptrs.data());

  if (positionals.empty()) UsageError("missing the command", flags);
  a.command = positionals[0];
  if (a.command == "generate") {
    if (positionals.size() > 2) UsageError("generate takes one prompt (quote it)", flags);
    if (positionals.size() == 2) a.prompt = positionals[1];
    if (a.prompt.empty() && a.token_ids.empty()) {
      UsageError("generate needs a prompt: llm-client generate \"Once upon a time\"", flags);
    }
  } else if (a.command == "chat") {
    if (positionals.size() != 2 || positionals[1].empty()) {
      UsageError("chat needs one user message (quote it): llm-client chat \"Hello!\"", flags);
    }
    a.prompt = positionals[1];
  } else if (a.command == "info" || a.command == "stats" || a.command == "health") {
    if (positionals.size() > 1) UsageError(a.command + " takes no arguments", flags);
  } else {
    UsageError("unknown command \"" + a.command + "\"", flags);
  }
  return a;
}

int RpcFailed(const grpc::Status& s) {
  std::fprintf(stderr, "llm-client: %s: %s\n",
               absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())).c_str(),
               s.error_message().c_str());
  return 1;
}

void SetDeadline(const Args& a, grpc::ClientContext* ctx) {
  if (a.timeout_s > 0) {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1e3)));
  }
}

bool ParseIds(const std::string& text, google::protobuf::RepeatedField<int32_t>* out) {
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id;
    if (!absl::SimpleAtoi(part, &id)) return false;
    out->Add(id);
  }
  return true;
}

const char* FinishName(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_ABORT:
      return "abort";
    default:
      return "unfinished";
  }
}

// A token's text on one line: quoted, newlines and tabs escaped.
std::string Quoted(const std::string& text) {
  return "\"" + absl::StrReplaceAll(text, {{"\n", "\\n"}, {"\t", "\\t"}, {"\r", "\\r"}}) + "\"";
}

// One line per sampled token: its logprob, then the top alternatives.
void PrintLogprobs(const std::map<uint32_t, std::vector<v1::Logprobs>>& logprobs) {
  for (const auto& [index, tokens] : logprobs) {
    if (tokens.empty()) continue;
    std::printf("\nlogprobs of sequence %u:\n", index);
    for (const v1::Logprobs& t : tokens) {
      std::printf("  %-16s %8.4f", Quoted(t.sampled().text()).c_str(), t.sampled().logprob());
      for (const v1::TokenLogprob& alt : t.top()) {
        std::printf("  %s %.4f", Quoted(alt.text()).c_str(), alt.logprob());
      }
      std::printf("\n");
    }
  }
}

int Generate(const Args& a, v1::LLMService::Stub& stub) {
  v1::GenerateRequest req;
  if (a.command == "chat") {
    if (!a.system.empty()) {
      v1::ChatMessage* m = req.mutable_chat()->add_messages();
      m->set_role("system");
      m->set_content(a.system);
    }
    v1::ChatMessage* m = req.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(a.prompt);
  } else if (!a.token_ids.empty()) {
    if (!ParseIds(a.token_ids, req.mutable_token_ids()->mutable_ids())) {
      std::fprintf(stderr, "llm-client: --token-ids: expected comma-separated integers\n");
      return 2;
    }
  } else {
    req.set_text(a.prompt);
  }
  v1::SamplingParams* p = req.mutable_sampling_params();
  p->set_n(a.n);
  p->set_max_tokens(a.max_tokens);
  if (a.temperature != kUnset) p->set_temperature(a.temperature);
  if (a.top_p != kUnset) p->set_top_p(a.top_p);
  if (a.top_k != kUnset) p->set_top_k(static_cast<int32_t>(a.top_k));
  if (a.min_p != kUnset) p->set_min_p(a.min_p);
  if (a.seed >= 0) p->set_seed(static_cast<uint64_t>(a.seed));
  if (a.repetition_penalty != kUnset) p->set_repetition_penalty(a.repetition_penalty);
  if (a.logprobs >= 0) p->set_logprobs(a.logprobs);
  p->set_min_tokens(a.min_tokens);
  p->set_presence_penalty(a.presence_penalty);
  p->set_frequency_penalty(a.frequency_penalty);
  p->set_ignore_eos(a.ignore_eos);
  for (const std::string& s : a.stop) p->add_stop(s);
  if (!ParseIds(a.stop_token_ids, p->mutable_stop_token_ids())) {
    std::fprintf(stderr, "llm-client: --stop-token-ids: expected comma-separated integers\n");
    return 2;
  }
  req.set_request_id(a.request_id);
  req.set_priority(a.priority);
  req.set_stream(!a.no_stream);
  req.set_add_special_tokens(a.add_special_tokens);
  req.set_cache_salt(a.cache_salt);

  // n = 1 streams the text as it arrives; n > 1 prints each sequence at the end.
  const bool live = a.n == 1 && !a.quiet && !a.json;
  std::map<uint32_t, std::string> text;
  std::map<uint32_t, v1::FinishReason> finish;
  std::map<uint32_t, std::string> stop_reason;
  std::map<uint32_t, std::vector<v1::Logprobs>> logprobs;
  v1::Usage usage;
  std::string request_id;
  int num_tokens = 0;
  double ttft = -1;
  std::vector<double> token_times;  // arrival time of each response that carried tokens

  grpc::ClientContext ctx;
  SetDeadline(a, &ctx);
  const Clock::time_point t0 = Clock::now();
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = stub.Generate(&ctx, req);
  // A completion continues the prompt, so it is printed first; a chat answers the user.
  if (live && a.command == "chat") {
    if (!a.system.empty()) std::printf("system: %s\n", a.system.c_str());
    std::printf("user: %s\nassistant: ", a.prompt.c_str());
  } else if (live && !a.prompt.empty()) {
    std::fputs(a.prompt.c_str(), stdout);
  }
  v1::GenerateResponse resp;
  if (a.json) {
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    while (reader->Read(&resp)) {
      std::string line;
      (void)google::protobuf::util::MessageToJsonString(resp, &line, options);
      std::printf("%s\n", line.c_str());
    }
    const grpc::Status status = reader->Finish();
    return status.ok() ? 0 : RpcFailed(status);
  }
  while (reader->Read(&resp)) {
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    request_id = resp.request_id();
    for (const v1::SequenceOutput& seq : resp.outputs()) {
      if (seq.token_ids_size() > 0) {
        if (ttft < 0) ttft = t;
        token_times.push_back(t);
      }
      num_tokens += seq.token_ids_size();
      text[seq.index()] += seq.text();
      auto& lp = logprobs[seq.index()];
      lp.insert(lp.end(), seq.logprobs().begin(), seq.logprobs().end());
      if (seq.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
        finish[seq.index()] = seq.finish_reason();
        stop_reason[seq.index()] = seq.stop_reason();
      }
      if (live) {
        std::fputs(seq.text().c_str(), stdout);
        std::fflush(stdout);
      }
    }
    if (resp.has_usage()) usage = resp.usage();
  }
  const grpc::Status status = reader->Finish();
  const double total = std::chrono::duration<double>(Clock::now() - t0).count();
  if (live) std::printf("\n");
  if (!status.ok()) return RpcFailed(status);
  if (!a.quiet && !live) {
    for (const auto& [index, t] : text) {
      std::printf("[%u] %s%s\n\n", index, a.command == "chat" ? "" : a.prompt.c_str(), t.c_str());
    }
  }
  PrintLogprobs(logprobs);
  std::printf("\nrequest %s:", request_id.c_str());
  for (const auto& [index, r] : finish) {
    std::printf(" [%u] %s%s", index, FinishName(r),
                stop_reason[index].empty() ? "" : (" (" + stop_reason[index] + ")").c_str());
  }
  std::printf("\nusage: %u prompt tokens (%u cached), %u completion tokens\n",
              usage.prompt_tokens(), usage.cached_prompt_tokens(), usage.completion_tokens());
  // Inter-token latency: the mean gap between responses that carried tokens, per token of a
  // sequence (the n sequences of a request advance together).
  const double per_seq_tokens = num_tokens / std::max(1.0, double(a.n));
  const double itl =
      per_seq_tokens > 1 && ttft >= 0 ? (token_times.back() - ttft) / (per_seq_tokens - 1) : 0.0;
  std::printf(
      "timing: %.3f s total; time to first token %.1f ms; inter-token latency %.2f ms; "
      "%.1f tokens/s\n",
      total, std::max(ttft, 0.0) * 1e3, itl * 1e3, total > 0 ? num_tokens / total : 0.0);
  return 0;
}

int Info(const Args& a, v1::LLMService::Stub& stub) {
  grpc::ClientContext ctx;
  SetDeadline(a, &ctx);
  v1::GetModelInfoResponse r;
  const grpc::Status s = stub.GetModelInfo(&ctx, v1::GetModelInfoRequest(), &r);
  if (!s.ok()) return RpcFailed(s);
  std::printf(
      "model:                %s\nmax_model_len:        %u\nvocab_size:           %u\n"
      "tensor_parallel_size: %u\nblock_size:           %u\nnum_gpu_blocks:       %u\n"
      "num_cpu_blocks:       %u\n",
      r.model_name().c_str(), r.max_model_len(), r.vocab_size(), r.tensor_parallel_size(),
      r.block_size(), r.num_gpu_blocks(), r.num_cpu_blocks());
  return 0;
}

int Stats(const Args& a, v1::LLMService::Stub& stub) {
  grpc::ClientContext ctx;
  SetDeadline(a, &ctx);
  v1::GetStatsResponse r;
  const grpc::Status s = stub.GetStats(&ctx, v1::GetStatsRequest(), &r);
  if (!s.ok()) return RpcFailed(s);
  if (a.json) {
    std::string line;
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    options.always_print_primitive_fields = true;
    (void)google::protobuf::util::MessageToJsonString(r, &line, options);
    std::printf("%s\n", line.c_str());
    return 0;
  }
  std::printf(
      "requests:         %u running, %u waiting, %u swapped\n"
      "gpu kv usage:     %.1f%% (%u blocks free)\n"
      "cpu kv usage:     %.1f%% (%u blocks free)\n"
      "prefix cache hit: %.1f%%\n"
      "preemptions:      %llu\n",
      r.num_running(), r.num_waiting(), r.num_swapped(), r.gpu_kv_usage() * 100,
      r.num_free_gpu_blocks(), r.cpu_kv_usage() * 100, r.num_free_cpu_blocks(),
      r.prefix_cache_hit_rate() * 100, static_cast<unsigned long long>(r.num_preemptions()));
  if (r.num_window_released_blocks() > 0) {
    std::printf("window released:  %llu blocks (before their sequences ended)\n",
                static_cast<unsigned long long>(r.num_window_released_blocks()));
  }
  if (r.has_worker()) {
    const v1::WorkerStats& w = r.worker();
    auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
    std::printf(
        "worker sampler:   %s (%llu steps sampled on the device, %llu on the host)\n"
        "cuda graphs:      %s, %u captured, %llu of %llu steps replayed from one\n"
        "cuBLASLt plans:   %llu cached, %llu hits, %llu misses\n"
        "structured:       %llu samples under a grammar mask (%.1f ms filling masks)\n",
        w.sampler() == v1::WorkerStats::SAMPLER_KIND_DEVICE ? "device" : "host",
        u(w.device_sampled_steps()), u(w.host_sampled_steps()),
        w.cuda_graphs_enabled() ? "on" : "off", w.graphs_captured(), u(w.graph_steps()),
        u(w.steps()), u(w.linear_plans()), u(w.linear_plan_hits()), u(w.linear_plan_misses()),
        u(w.constrained_samples()), w.grammar_mask_micros() / 1000.0);
    const v1::WorkerStats::Memory& m = w.memory();
    auto mib = [](uint64_t bytes) { return bytes / 1048576.0; };
    std::printf(
        "worker memory:    %.1f MiB resident: weights %.1f MiB (coded copies %.1f), KV cache "
        "%.1f of %.1f MiB reserved, swap %.1f of %.1f MiB, activations %.1f MiB, other %.1f "
        "MiB\n",
        mib(m.resident()), mib(m.weights()), mib(m.coded_weights()), mib(m.kv_cache_resident()),
        mib(m.kv_cache_reserved()), mib(m.swap_resident()), mib(m.swap_reserved()),
        mib(m.activations()), mib(OtherResidentBytes(m)));
  }
  return 0;
}

int Run(int argc, char** argv) {
  Args a = Parse(argc, argv);
  a.channel.api_key = ApiKeyFromFlagOrEnv(a.channel.api_key);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      CreatePublicChannel(a.address, a.channel);
  if (!channel.ok()) {
    std::fprintf(stderr, "llm-client: %s\n", std::string(channel.status().message()).c_str());
    return 2;
  }
  if (a.command == "health") {
    const HealthChecker::Answer h = HealthChecker(*channel).Check(
        "", a.timeout_s > 0 ? absl::Seconds(a.timeout_s) : absl::Seconds(5));
    std::printf("%s\n", HealthChecker::Name(h));
    return h == HealthChecker::kServing ? 0 : 1;
  }
  auto stub = v1::LLMService::NewStub(*channel);
  if (a.command == "generate" || a.command == "chat") return Generate(a, *stub);
  if (a.command == "info") return Info(a, *stub);
  return Stats(a, *stub);
}

}  // namespace
}  // namespace llm

int main(int argc, char** argv) { return llm::Run(argc, argv); }
