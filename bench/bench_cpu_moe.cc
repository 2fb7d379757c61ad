// bench_cpu_moe: steps of the CPU model on one decoder layer shaped like Qwen3-30B-A3B's (hidden
// 2048, 32 query / 4 KV heads of 128, q/k norm, 128 experts of 768 of which each token runs 8,
// norm_topk_prob; vocabulary cut to 32,768, tied) with random weights, in f32, against the same
// layer with a dense MLP of the active width (8 x 768 = 6144): decode steps at batch 1, 8 and
// 32 (context 256) and a prefill of 256 tokens. At batch 1 the two read the same weights, so
// their ratio is the routing's overhead (the router GEMM, the host softmax / top-k, eight GEMM
// pairs instead of one); at larger batches the tokens spread over more experts and the mixture
// reads more weights per step (up to all 128 experts', 24x the dense MLP's). The summary prints
// the ratios. One layer only: its experts alone are 2.4 GB in f32.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "bench/summary_reporter.h"
#include "benchmark/benchmark.h"
#include "common/model_config.h"
#include "kernels/cpu/thread_pool.h"
#include "worker_service/cache_engine.h"
#include "worker_service/model/llama.h"

namespace llm {
namespace {

constexpr int kBlockSize = 16;
constexpr int kContext = 256;
constexpr int kMaxTokens = 256;

ModelConfig Layer(bool moe) {
  ModelConfig c;
  c.architecture = moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM";
  c.vocab_size = 32768;
  c.hidden_size = 2048;
  c.intermediate_size = 8 * 768;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 4;
  c.head_dim = 128;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1000000.0;
  c.tie_word_embeddings = true;
  c.qk_norm = true;
  if (moe) {
    c.num_experts = 128;
    c.num_experts_per_tok = 8;
    c.moe_intermediate_size = 768;
    c.norm_topk_prob = true;
    c.moe_layers = {true};
  }
  return c;
}

struct Fixture {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<CacheEngine> cache;
};

int BlocksPerSeq() { return (kContext + kMaxTokens) / kBlockSize + 1; }

Fixture& Get(bool moe) {
  static std::map<bool, Fixture*> fixtures;
  Fixture*& f = fixtures[moe];
  if (f != nullptr) return *f;
  f = new Fixture;
  absl::StatusOr<std::unique_ptr<LlamaModel>> model =
      LlamaModel::CreateRandom(Layer(moe), 1, nullptr, {nullptr, DType::kF32});
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    std::exit(1);
  }
  f->model = std::move(*model);
  f->cache = std::make_unique<CacheEngine>(
      CacheShape{1, f->model->num_local_kv_heads(), f->model->head_dim(), kBlockSize, DType::kF32},
      32 * BlocksPerSeq(), 1);
  for (const LayerKvCache& l : f->cache->device_caches()) {
    std::memset(l.key.data, 0, l.key.nbytes());
    std::memset(l.value.data, 0, l.value.nbytes());
  }
  const absl::Status st = f->model->Reserve(kMaxTokens, 32, kContext + kMaxTokens);
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    std::exit(1);
  }
  return *f;
}

// `batch` sequences each computing `tokens` tokens after kContext of context (zeros in the
// cache, as bench_cpu_model's decode steps); every step rewrites the same slots.
void RunSteps(benchmark::State& state, bool moe, int batch, int tokens) {
  Fixture& f = Get(moe);
  const int bps = BlocksPerSeq();
  std::vector<int32_t> tables(batch * bps);
  std::iota(tables.begin(), tables.end(), 0);
  std::vector<int32_t> ids, pos, lens, qsl{0}, rows;
  std::vector<int64_t> slots;
  for (int s = 0; s < batch; ++s) {
    for (int i = 0; i < tokens; ++i) {
      const int p = kContext + i;
      ids.push_back((s * 131 + i * 7919) % 32768);  // tokens that route apart
      pos.push_back(p);
      slots.push_back(static_cast<int64_t>(tables[s * bps + p / kBlockSize]) * kBlockSize +
                      p % kBlockSize);
    }
    lens.push_back(kContext + tokens);
    qsl.push_back(qsl.back() + tokens);
    rows.push_back(qsl.back() - 1);
  }
  HostTensor logits;
  for (auto _ : state) {
    const absl::Status st = f.model->Forward({ids, pos, slots, tables, bps, lens, qsl, rows},
                                             f.cache->device_caches(), &logits);
    if (!st.ok()) state.SkipWithError(st.ToString().c_str());
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(batch * tokens),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

// moe 1: 128 experts, top-8; 0: the dense MLP of the active width.
void BM_Decode(benchmark::State& state) {
  RunSteps(state, state.range(0) == 1, static_cast<int>(state.range(1)), 1);
}
BENCHMARK(BM_Decode)
    ->ArgNames({"moe", "batch"})
    ->ArgsProduct({{0, 1}, {1, 8, 32}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_Prefill(benchmark::State& state) { RunSteps(state, state.range(0) == 1, 1, kMaxTokens); }
BENCHMARK(BM_Prefill)->ArgName("moe")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void PrintSummary(const SummaryReporter& r) {
  std::printf("\nmixture of experts (128 experts, top-8) / dense MLP of the active width:\n");
  for (int batch : {1, 8, 32}) {
    const double moe = r.ns("BM_Decode/moe:1/batch:" + std::to_string(batch));
    const double dense = r.ns("BM_Decode/moe:0/batch:" + std::to_string(batch));
    if (moe > 0 && dense > 0) {
      std::printf("  decode, batch %2d: %.2f ms / %.2f ms = %.2fx\n", batch, moe / 1e6, dense / 1e6,
                  moe / dense);
    }
  }
  const double moe = r.ns("BM_Prefill/moe:1"), dense = r.ns("BM_Prefill/moe:0");
  if (moe > 0 && dense > 0) {
    std::printf("  prefill of %d tokens: %.1f ms / %.1f ms = %.2fx\n", kMaxTokens, moe / 1e6,
                dense / 1e6, moe / dense);
  }
}

}  // namespace
}  // namespace llm

int main(int argc, char** argv) {
  llm::cpu::ReexecWithOpenMpSettings(argv);
  for (int i = 1; i < argc;) {
    if (std::strncmp(argv[i], "--threads=", 10) != 0) {
      ++i;
      continue;
    }
    llm::cpu::SetThreadPoolSize(std::atoi(argv[i] + 10));
    for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
    --argc;
  }
  llm::SummaryReporter reporter;
  return llm::RunBenchmarksWithSummary(argc, argv, reporter, llm::PrintSummary);
}
