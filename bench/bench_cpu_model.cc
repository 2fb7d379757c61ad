// bench_cpu_model: decode steps of the CPU worker on a model shaped like Qwen2.5-0.5B (24
// layers, hidden 896, 14 query / 2 KV heads, intermediate 4864, vocabulary 151,936, tied
// embeddings, qkv bias) with random fp32 weights, at batch 1, 8 and 32.
//
// Decode is bound by memory bandwidth: every step reads every weight once. The baseline, in
// the same process, is a large streaming copy (memcpy of 1 GiB; bandwidth counts the bytes
// read and written). The summary prints tokens/s and the weight bytes read per second as a
// share of that bandwidth (target: 70% at batch 1).
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "bench/summary_reporter.h"
#include "benchmark/benchmark.h"
#include "common/model_config.h"
#include "kernels/cpu/blas_setup.h"
#include "worker_service/cache_engine.h"
#include "worker_service/model/llama.h"

namespace llm {
namespace {

constexpr int kBlockSize = 16;
constexpr int kContext = 256;  // tokens of context per sequence during the decode steps

ModelConfig Qwen25HalfB() {
  ModelConfig c;
  c.architecture = "Qwen2ForCausalLM";
  c.vocab_size = 151936;
  c.hidden_size = 896;
  c.intermediate_size = 4864;
  c.num_hidden_layers = 24;
  c.num_attention_heads = 14;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.max_position_embeddings = 32768;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1000000.0;
  c.tie_word_embeddings = true;
  c.attention_bias = true;
  return c;
}

// Weight bytes one decode step reads: every matrix and vector once (the embedding only for
// the LM head, which reads all of it; the lookup reads a few rows).
double WeightBytes(const ModelConfig& c) {
  const double h = c.hidden_size, d = c.head_dim, q = c.num_attention_heads * d,
               kv = c.num_key_value_heads * d, i = c.intermediate_size;
  const double per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + q + 2 * kv + 2 * h;
  return 4.0 * (c.num_hidden_layers * per_layer + c.vocab_size * h + h);
}

struct Fixture {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<CacheEngine> cache;
};

Fixture& Get() {
  static Fixture* f = [] {
    auto* fx = new Fixture;
    auto model = LlamaModel::CreateRandom(Qwen25HalfB(), 1, nullptr);
    if (!model.ok()) {
      std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
      std::exit(1);
    }
    fx->model = std::move(*model);
    const int blocks_per_seq = (kContext + 64) / kBlockSize + 1;
    fx->cache = std::make_unique<CacheEngine>(
        CacheShape{fx->model->num_layers(), fx->model->num_local_kv_heads(), fx->model->head_dim(),
                   kBlockSize},
        32 * blocks_per_seq, 1);
    for (const LayerKvCache& l : fx->cache->device_caches()) {
      std::memset(l.key.data, 0, l.key.nbytes());
      std::memset(l.value.data, 0, l.value.nbytes());
    }
    return fx;
  }();
  return *f;
}

// Decode steps for `batch` sequences whose context is kContext tokens. The cache holds zeros
// for that context instead of a prefill's keys and values (the step's cost does not depend on
// their values, and a prefill of 32 x 256 tokens would take minutes); each step decodes one
// token per sequence at position kContext, overwriting the same slot, so the work per step
// stays the same.
void BM_DecodeStep(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  Fixture& f = Get();
  const int blocks_per_seq = (kContext + 64) / kBlockSize + 1;
  std::vector<int32_t> tables(batch * blocks_per_seq);
  std::iota(tables.begin(), tables.end(), 0);
  std::vector<int32_t> ids(batch, 42), pos(batch, kContext), lens(batch, kContext + 1),
      qsl(batch + 1), rows(batch);
  std::vector<int64_t> slots(batch);
  for (int s = 0; s < batch; ++s) {
    qsl[s + 1] = s + 1;
    rows[s] = s;
    slots[s] =
        static_cast<int64_t>(tables[s * blocks_per_seq + kContext / kBlockSize]) * kBlockSize +
        kContext % kBlockSize;
  }
  HostTensor logits;
  for (auto _ : state) {
    const absl::Status st =
        f.model->Forward({ids, pos, slots, tables, blocks_per_seq, lens, qsl, rows},
                         f.cache->device_caches(), &logits);
    if (!st.ok()) state.SkipWithError(st.ToString().c_str());
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DecodeStep)
    ->ArgName("batch")
    ->Arg(1)
    ->Arg(8)
    ->Arg(32)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Baseline: a 1 GiB streaming copy.
void BM_Baseline_StreamingCopy(benchmark::State& state) {
  const size_t n = size_t{1} << 30;
  std::unique_ptr<char[]> a(new char[n]), b(new char[n]);
  std::memset(a.get(), 1, n);
  std::memset(b.get(), 2, n);
  for (auto _ : state) {
    std::memcpy(b.get(), a.get(), n);
    benchmark::DoNotOptimize(b.get());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * n);
}
BENCHMARK(BM_Baseline_StreamingCopy)->Unit(benchmark::kMillisecond)->UseRealTime();

void PrintSummary(const SummaryReporter& r) {
  const double copy_s = r.seconds("BM_Baseline_StreamingCopy");
  const double bandwidth = copy_s > 0 ? 2.0 * (size_t{1} << 30) / copy_s : 0;
  const double weights = WeightBytes(Qwen25HalfB());
  std::printf("\nOpenBLAS kernels: %s\n", cpu::BlasCoreName().c_str());
  std::printf("Streaming copy bandwidth (read + write): %.2f GB/s\n", bandwidth / 1e9);
  std::printf("Weights read per decode step: %.2f GB (fp32)\n", weights / 1e9);
  std::printf("%-8s %12s %12s %14s %12s\n", "batch", "step (ms)", "tokens/s", "weights GB/s",
              "of copy bw");
  for (int batch : {1, 8, 32}) {
    const double s = r.seconds("BM_DecodeStep/batch:" + std::to_string(batch));
    if (s <= 0) continue;
    std::printf("%-8d %12.1f %12.1f %14.2f %11.0f%%\n", batch, s * 1e3, batch / s,
                weights / s / 1e9, 100.0 * weights / s / bandwidth);
  }
  std::printf("Target: batch 1 at 70%% or more of the copy bandwidth.\n");
}

}  // namespace
}  // namespace llm

int main(int argc, char** argv) {
  llm::cpu::ReexecWithMatchingBlasKernels(argv);
  llm::SummaryReporter reporter;
  return llm::RunBenchmarksWithSummary(argc, argv, reporter, llm::PrintSummary);
}
