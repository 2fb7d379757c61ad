// llm-generate: generates text in one process with the whole engine: the tokenizer, the
// scheduler (EngineCore) and the CPU worker (ModelRunner over LlamaModel). Streams the text
// as it is produced and prints timings. The distributed system (llm-scheduler, llm-worker,
// llm-cluster) runs the same parts across processes.
//
//   llm-generate [--model=DIR] [--prompt=TEXT] [--max-tokens=N] [--temperature=T]
//                [--top-p=P] [--top-k=K] [--seed=S] [--n=N]     (--help lists them)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/flag_parser.h"
#include "common/model_config.h"
#include "kernels/cpu/blas_setup.h"
#include "scheduler_service/engine/engine_core.h"
#include "scheduler_service/tokenizer/tokenizer.h"
#include "tools/local_engine.h"

namespace llm {
namespace {

struct Args {
  std::string model = "models/fortune-llama";
  std::string prompt = "Once upon a time";
  SamplingParams params;
};

[[noreturn]] void Fail(const std::string& msg) {
  std::fprintf(stderr, "llm-generate: %s\n", msg.c_str());
  std::exit(1);
}

Args Parse(int argc, char** argv) {
  Args a;
  a.params.max_tokens = 64;
  a.params.temperature = 0.8;
  a.params.top_p = 0.95;
  a.params.top_k = 40;
  int64_t seed = 0;
  FlagParser flags("usage: llm-generate [--flag=value ...]: generates text in one process");
  flags.Add("model", &a.model, "Hugging Face model directory (models/fortune-llama)");
  flags.Add("prompt", &a.prompt, "text to continue (\"Once upon a time\")");
  flags.Add("max-tokens", &a.params.max_tokens, "tokens to generate per sequence (64)");
  flags.Add("temperature", &a.params.temperature, "0 is greedy (0.8)");
  flags.Add("top-p", &a.params.top_p, "nucleus sampling mass (0.95)");
  flags.Add("top-k", &a.params.top_k, "-1 or the number of most likely tokens kept (40)");
  flags.Add("seed", &seed, "sampling seed (0)");
  flags.Add("n", &a.params.n, "sequences to generate (1)");
  flags.Parse(argc, argv);
  a.params.seed = static_cast<uint64_t>(seed);
  if (const absl::Status s = a.params.Validate(); !s.ok()) Fail(std::string(s.message()));
  return a;
}

int Run(int argc, char** argv) {
  const Args args = Parse(argc, argv);
  using Clock = std::chrono::steady_clock;
  const auto t_load = Clock::now();
  absl::StatusOr<std::unique_ptr<LocalEngine>> local =
      LocalEngine::Create(args.model, {.max_model_len = 1024, .max_seqs = args.params.n});
  if (!local.ok()) Fail(local.status().ToString());
  const ModelConfig& config = (*local)->config();
  const Tokenizer& tok = (*local)->tokenizer();
  EngineCore& engine = (*local)->engine();
  const double load_s = std::chrono::duration<double>(Clock::now() - t_load).count();

  EngineRequest req;
  req.request_id = "generate";
  req.prompt_token_ids = tok.Encode(args.prompt, /*add_special_tokens=*/true);
  req.sampling_params = args.params;
  std::printf("model %s (%s, %d layers, vocab %d), loaded in %.2f s\n", args.model.c_str(),
              config.architecture.c_str(), config.num_hidden_layers, config.vocab_size, load_s);
  std::printf("prompt: %zu tokens; sampling: temperature %.2f, top_p %.2f, top_k %d, n %d\n\n",
              req.prompt_token_ids.size(), args.params.temperature, args.params.top_p,
              args.params.top_k, args.params.n);

  // The engine's text of each sequence (its detokenizer, with the prompt as context). With
  // n = 1 the text streams as it is produced; with n > 1 each sequence prints at the end.
  std::map<int, std::string> shown;
  int num_tokens = 0;
  double ttft = -1;
  const auto t0 = Clock::now();
  absl::Status add = engine.AddRequest(std::move(req), [&](const StreamUpdate& u) {
    if (!u.status.ok()) Fail(u.status.ToString());
    for (const SequenceOutput& seq : u.outputs->Seqs(*u.output)) {
      const auto ids = u.outputs->NewTokenIds(seq);
      num_tokens += static_cast<int>(ids.size());
      if (ttft < 0 && !ids.empty()) ttft = std::chrono::duration<double>(Clock::now() - t0).count();
      const std::string delta(u.outputs->Text(seq));
      shown[seq.index] += delta;
      if (args.params.n == 1) {
        std::fputs(delta.c_str(), stdout);
        std::fflush(stdout);
      }
    }
  });
  if (!add.ok()) Fail(add.ToString());
  if (args.params.n == 1) std::fputs(args.prompt.c_str(), stdout);
  if (const absl::Status s = engine.RunUntilIdle(); !s.ok()) Fail(s.ToString());
  const double total = std::chrono::duration<double>(Clock::now() - t0).count();
  if (args.params.n > 1) {
    for (const auto& [index, text] : shown) {
      std::printf("[%d] %s%s\n\n", index, args.prompt.c_str(), text.c_str());
    }
  } else {
    std::printf("\n\n");
  }
  std::printf(
      "%d tokens in %.2f s: %.1f tokens/s; time to first token %.0f ms, then %.1f ms "
      "per token\n",
      num_tokens, total, num_tokens / total, ttft * 1e3,
      num_tokens > args.params.n
          ? (total - ttft) * 1e3 / ((num_tokens - args.params.n) / double(args.params.n))
          : 0.0);
  return 0;
}

}  // namespace
}  // namespace llm

int main(int argc, char** argv) {
  llm::cpu::ReexecWithMatchingBlasKernels(argv);
  return llm::Run(argc, argv);
}
