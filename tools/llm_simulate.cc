// llm-simulate: the scheduler (EngineCore) under a synthetic workload, with the FakeExecutor
// standing in for the workers: Poisson arrivals per step, prompts sharing a few system
// prompts, random lengths, n, priorities and aborts. Checks the block manager's invariants
// and the workers' view of the KV cache at every step, and prints what a capacity planner
// wants: steps, tokens per step, queue lengths, KV usage, preemptions, swaps, prefix hits.
// Exits non-zero when an invariant breaks or a stream fails.
//
//   llm-simulate [--requests=2000] [--rate=3] [--num-gpu-blocks=2048] [--preemption-mode=swap]
//                [--enable-chunked-prefill] [--enable-prefix-caching] ...   (--help lists all)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/flag_parser.h"
#include "scheduler_service/engine/engine_core.h"
#include "tests/testing/fake_executor.h"

namespace llm {
namespace {

struct Options {
  int requests = 2000;
  double rate = 3.0;  // mean new requests per step
  int num_gpu_blocks = 2048;
  int num_cpu_blocks = 1024;
  int block_size = 16;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int max_model_len = 2048;
  bool enable_chunked_prefill = false;
  int long_prefill_token_threshold = 0;
  bool enable_prefix_caching = false;
  std::string preemption_mode = "recompute";
  std::string scheduling_policy = "fcfs";
  double abort_fraction = 0.02;
  int64_t seed = 1;
  bool async_scheduling = false;
  int sliding_window = 0;
};

Options ParseOptions(int argc, char** argv) {
  Options o;
  FlagParser f("usage: llm-simulate [--flag=value ...]: the scheduler under a synthetic load");
  f.Add("requests", &o.requests, "requests to send (2000)");
  f.Add("rate", &o.rate, "mean new requests per engine step, Poisson (3)");
  f.Add("num-gpu-blocks", &o.num_gpu_blocks, "KV blocks on the device (2048)");
  f.Add("num-cpu-blocks", &o.num_cpu_blocks, "KV blocks of swap space (1024)");
  f.Add("block-size", &o.block_size, "tokens per KV block (16)");
  f.Add("max-num-seqs", &o.max_num_seqs, "sequences per step (256)");
  f.Add("max-num-batched-tokens", &o.max_num_batched_tokens, "tokens per step (2048)");
  f.Add("max-model-len", &o.max_model_len, "prompt + output tokens (2048)");
  f.Add("enable-chunked-prefill", &o.enable_chunked_prefill, "chunk long prompts (off)");
  f.Add("long-prefill-token-threshold", &o.long_prefill_token_threshold,
        "chunk cap per request per step (0: none)");
  f.Add("enable-prefix-caching", &o.enable_prefix_caching, "share full prompt blocks (off)");
  f.Add("preemption-mode", &o.preemption_mode, "recompute or swap (recompute)");
  f.Add("scheduling-policy", &o.scheduling_policy, "fcfs or priority (fcfs)");
  f.Add("abort-fraction", &o.abort_fraction, "share of requests the client cancels (0.02)");
  f.Add("seed", &o.seed, "workload seed (1)");
  f.Add("async-scheduling", &o.async_scheduling,
        "plan each step with the one before in flight, as llm-scheduler does (off)");
  f.Add("sliding-window", &o.sliding_window,
        "the model attends to the last N positions in every layer, and the blocks before "
        "them are given back (0: none)");
  f.Parse(argc, argv);
  return o;
}

int Run(int argc, char** argv) {
  const Options o = ParseOptions(argc, argv);
  SchedulerConfig sc;
  sc.max_num_seqs = o.max_num_seqs;
  sc.max_num_batched_tokens = o.max_num_batched_tokens;
  sc.max_model_len = o.max_model_len;
  sc.enable_chunked_prefill = o.enable_chunked_prefill;
  sc.long_prefill_token_threshold = o.long_prefill_token_threshold;
  sc.preemption_mode =
      o.preemption_mode == "swap" ? PreemptionMode::kSwap : PreemptionMode::kRecompute;
  sc.policy =
      o.scheduling_policy == "priority" ? SchedulingPolicy::kPriority : SchedulingPolicy::kFcfs;
  sc.eos_token_id = 2;
  if ((o.preemption_mode != "swap" && o.preemption_mode != "recompute") ||
      (o.scheduling_policy != "fcfs" && o.scheduling_policy != "priority")) {
    std::fprintf(stderr,
                 "error: --preemption-mode is recompute or swap; --scheduling-policy "
                 "is fcfs or priority\n");
    return 2;
  }
  const BlockSpaceManagerConfig bc{.block_size = o.block_size,
                                   .num_gpu_blocks = o.num_gpu_blocks,
                                   .num_cpu_blocks = o.num_cpu_blocks,
                                   .watermark = 0.01,
                                   .enable_prefix_caching = o.enable_prefix_caching,
                                   .sliding_window = o.sliding_window};
  for (const absl::Status& s : {sc.Validate(), bc.Validate()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  FakeExecutor executor({.num_gpu_blocks = o.num_gpu_blocks,
                         .num_cpu_blocks = o.num_cpu_blocks,
                         .block_size = o.block_size,
                         .vocab_size = 32000,
                         .eos_token_id = 2,
                         .eos_probability = 0.01,
                         .seed = static_cast<uint64_t>(o.seed),
                         .attention_window = o.sliding_window});
  EngineCore engine(sc, bc, &executor);
  engine.set_async_scheduling(o.async_scheduling);

  std::mt19937_64 rng(o.seed);
  std::vector<std::vector<TokenId>> system_prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<TokenId> p(std::uniform_int_distribution<int>(32, 256)(rng));
    for (TokenId& t : p) t = std::uniform_int_distribution<int>(3, 31999)(rng);
    system_prompts.push_back(std::move(p));
  }
  std::poisson_distribution<int> arrivals(o.rate);
  int sent = 0, finished = 0, failed = 0, aborted = 0;
  int64_t output_tokens = 0, prompt_tokens = 0, cached_tokens = 0;
  std::vector<std::string> in_flight;
  int max_waiting = 0, max_swapped = 0, max_running = 0;
  double max_usage = 0;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t steps = 0;
  while (sent < o.requests || !in_flight.empty()) {
    for (int k = arrivals(rng); k > 0 && sent < o.requests; --k, ++sent) {
      EngineRequest r;
      r.request_id = "r" + std::to_string(sent);
      if (std::bernoulli_distribution(0.5)(rng)) {
        r.prompt_token_ids = system_prompts[rng() % system_prompts.size()];
      }
      const int tail = std::uniform_int_distribution<int>(8, 384)(rng);
      for (int i = 0; i < tail; ++i) {
        r.prompt_token_ids.push_back(std::uniform_int_distribution<int>(3, 31999)(rng));
      }
      SamplingParams& p = r.sampling_params;
      p.max_tokens = std::uniform_int_distribution<int>(8, 256)(rng);
      const double u = std::uniform_real_distribution<double>()(rng);
      p.n = u < 0.85 ? 1 : u < 0.95 ? 2 : 4;
      p.seed = rng();
      r.priority = std::uniform_int_distribution<int>(0, 3)(rng);
      prompt_tokens += static_cast<int64_t>(r.prompt_token_ids.size());
      const std::string id = r.request_id;
      const absl::Status s = engine.AddRequest(std::move(r), [&, id](const StreamUpdate& up) {
        if (!up.status.ok()) {
          if (absl::IsCancelled(up.status)) {
            ++aborted;
          } else {
            ++failed;
            std::fprintf(stderr, "request %s failed: %s\n", id.c_str(),
                         up.status.ToString().c_str());
          }
          std::erase(in_flight, id);
          return;
        }
        for (const SequenceOutput& seq : up.outputs->Seqs(*up.output)) {
          output_tokens += seq.new_token_ids.size;
        }
        if (up.output->finished) {
          ++finished;
          cached_tokens += up.output->num_cached_prompt_tokens;
          std::erase(in_flight, id);
        }
      });
      if (!s.ok()) {
        std::fprintf(stderr, "request %s refused: %s\n", id.c_str(), s.ToString().c_str());
        ++failed;
        continue;
      }
      in_flight.push_back(id);
    }
    if (!in_flight.empty() && std::bernoulli_distribution(o.abort_fraction / 20)(rng)) {
      (void)engine.Abort(in_flight[rng() % in_flight.size()]);
    }
    const absl::StatusOr<bool> stepped = engine.Step();
    if (!stepped.ok()) {
      std::fprintf(stderr, "step failed: %s\n", stepped.status().ToString().c_str());
      return 1;
    }
    ++steps;
    const SchedulerStats st = engine.scheduler().stats();
    max_waiting = std::max(max_waiting, st.num_waiting);
    max_swapped = std::max(max_swapped, st.num_swapped);
    max_running = std::max(max_running, st.num_running);
    max_usage = std::max(max_usage, st.gpu_kv_usage);
    if (const absl::Status inv = engine.scheduler().CheckInvariants(); !inv.ok()) {
      std::fprintf(stderr, "invariant broken at step %lld: %s\n", static_cast<long long>(steps),
                   inv.ToString().c_str());
      return 1;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const SchedulerStats st = engine.scheduler().stats();
  const BlockSpaceManagerStats blocks = engine.scheduler().block_manager().stats();
  std::printf("requests: %d sent, %d finished, %d cancelled, %d failed\n", sent, finished, aborted,
              failed);
  std::printf("steps: %lld (%.1f ms of scheduling and fake execution per step)\n",
              static_cast<long long>(steps), 1e3 * seconds / std::max<int64_t>(1, steps));
  std::printf("tokens: %lld prompt, %lld output; %.1f scheduled per step on average\n",
              static_cast<long long>(prompt_tokens), static_cast<long long>(output_tokens),
              static_cast<double>(st.total_num_scheduled_tokens) / std::max<int64_t>(1, steps));
  std::printf("peaks: %d running, %d waiting, %d swapped requests; GPU KV usage %.0f%%\n",
              max_running, max_waiting, max_swapped, 100 * max_usage);
  std::printf(
      "preemptions: %lld (%lld by swap); prefix cache: %lld cached prompt tokens, "
      "hit rate %.1f%%\n",
      static_cast<long long>(st.num_preemptions), static_cast<long long>(st.num_swap_outs),
      static_cast<long long>(cached_tokens), 100 * st.prefix_cache_hit_rate);
  if (o.async_scheduling) {
    std::printf(
        "async scheduling: %lld steps planned with the one before in flight; %lld "
        "samples dropped (their sequence had ended)\n",
        static_cast<long long>(st.num_steps_planned_ahead),
        static_cast<long long>(st.num_samples_discarded));
  }
  if (o.sliding_window > 0) {
    std::printf("sliding window of %d: %lld blocks given back before their sequences ended\n",
                o.sliding_window, static_cast<long long>(st.num_window_released_blocks));
  }
  const bool all_free = blocks.num_free_gpu_blocks == o.num_gpu_blocks &&
                        blocks.num_free_cpu_blocks == o.num_cpu_blocks;
  std::printf("afterwards: %d/%d GPU and %d/%d CPU blocks free; invariants held at every step\n",
              blocks.num_free_gpu_blocks, o.num_gpu_blocks, blocks.num_free_cpu_blocks,
              o.num_cpu_blocks);
  return failed == 0 && all_free ? 0 : 1;
}

}  // namespace
}  // namespace llm

int main(int argc, char** argv) { return llm::Run(argc, argv); }
