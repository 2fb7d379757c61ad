// bench_cpu_ops: the CPU ops that dominate a step. Each figure stands beside its baseline:
//   BM_Linear         (OpenBLAS sgemm)   GFLOP/s, naive_GFLOP/s of the naive triple loop timed
//                                        once per shape in this process, x_naive = the ratio
//   BM_LinearNaive    the triple loop itself (small shapes only; it is slow)
//   BM_PagedAttentionDecode  one decode token per sequence over a paged cache: tokens/s and
//                            the KV bytes read per second
//   BM_SiluAndMul     (the formula in a scalar loop with std::exp, on the calling thread, timed
//                     once per shape in this process)  elements/s, x_scalar = the ratio
// Rates are per wall-clock second (UseRealTime): OpenBLAS runs on several threads.
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace llm::ops {
namespace {

HostTensor Random(std::initializer_list<int64_t> shape, uint32_t seed) {
  HostTensor t(DType::kF32, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// out[m][n] = sum_k x[m][k] * w[n][k]
void NaiveLinear(const float* x, const float* w, float* out, int64_t m, int64_t k, int64_t n) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t l = 0; l < k; ++l) acc += x[i * k + l] * w[j * k + l];
      out[i * n + j] = acc;
    }
  }
}

// Seconds of one naive run for (m, k, n), measured once.
double NaiveSeconds(int64_t m, int64_t k, int64_t n) {
  static std::map<std::tuple<int64_t, int64_t, int64_t>, double> cache;
  auto it = cache.find({m, k, n});
  if (it != cache.end()) return it->second;
  HostTensor x = Random({m, k}, 1), w = Random({n, k}, 2), out(DType::kF32, {m, n});
  const auto start = std::chrono::steady_clock::now();
  NaiveLinear(x.data<float>(), w.data<float>(), out.data<float>(), m, k, n);
  benchmark::DoNotOptimize(out.data<float>()[0]);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  cache[{m, k, n}] = s;
  return s;
}

void BM_Linear(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  HostTensor x = Random({m, k}, 1), w = Random({n, k}, 2), out(DType::kF32, {m, n});
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    if (!Linear({}, out.view(), x.view(), w.view(), {}).ok()) state.SkipWithError("Linear");
    benchmark::DoNotOptimize(out.data<float>()[0]);
  }
  const double flops = 2.0 * m * k * n;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  // After the loop, so that neither the naive run nor this is timed.
  const double seconds_per_run =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
      static_cast<double>(state.iterations());
  const double naive = NaiveSeconds(m, k, n);
  state.counters["naive_GFLOP/s"] = flops * 1e-9 / naive;
  state.counters["x_naive"] = naive / seconds_per_run;
}
// A decode step (1 token), a small batch of decode tokens, a prefill chunk.
BENCHMARK(BM_Linear)
    ->ArgNames({"m", "k", "n"})
    ->Args({1, 2048, 2048})
    ->Args({16, 2048, 2048})
    ->Args({128, 1024, 1024})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

void BM_LinearNaive(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  HostTensor x = Random({m, k}, 1), w = Random({n, k}, 2), out(DType::kF32, {m, n});
  for (auto _ : state) {
    NaiveLinear(x.data<float>(), w.data<float>(), out.data<float>(), m, k, n);
    benchmark::DoNotOptimize(out.data<float>()[0]);
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * k * n * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_LinearNaive)
    ->ArgNames({"m", "k", "n"})
    ->Args({1, 2048, 2048})
    ->Args({16, 2048, 2048})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Decode: num_seqs sequences of context_len tokens each, one query token each; Llama-3-8B
// attention shape (32 query heads, 8 kv heads, head size 128), block size 16, blocks scattered.
void BM_PagedAttentionDecode(benchmark::State& state) {
  const int64_t num_seqs = state.range(0), context_len = state.range(1);
  constexpr int64_t kHeads = 32, kKvHeads = 8, kHeadSize = 128, kBlockSize = 16;
  const int64_t blocks_per_seq = (context_len + kBlockSize - 1) / kBlockSize;
  const int64_t num_blocks = num_seqs * blocks_per_seq;
  HostTensor key_cache = Random({num_blocks, kBlockSize, kKvHeads, kHeadSize}, 3);
  HostTensor value_cache = Random({num_blocks, kBlockSize, kKvHeads, kHeadSize}, 4);
  HostTensor query = Random({num_seqs, kHeads, kHeadSize}, 5);
  HostTensor out(DType::kF32, {num_seqs, kHeads, kHeadSize});
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(6));
  HostTensor tables(DType::kI32, {num_seqs, blocks_per_seq});
  HostTensor seq_lens(DType::kI32, {num_seqs}), qsl(DType::kI32, {num_seqs + 1});
  std::copy(ids.begin(), ids.end(), tables.data<int32_t>());
  for (int64_t s = 0; s < num_seqs; ++s) seq_lens.data<int32_t>()[s] = context_len;
  for (int64_t s = 0; s <= num_seqs; ++s) qsl.data<int32_t>()[s] = s;
  const AttentionMetadata md{tables.view(), seq_lens.view(), qsl.view(),
                             static_cast<int>(context_len)};
  const float scale = 1.0f / std::sqrt(float(kHeadSize));
  for (auto _ : state) {
    if (!PagedAttention({}, out.view(), query.view(), key_cache.view(), value_cache.view(), md,
                        scale)
             .ok()) {
      state.SkipWithError("PagedAttention");
    }
    benchmark::DoNotOptimize(out.data<float>()[0]);
  }
  state.counters["tokens/s"] =
      benchmark::Counter(double(num_seqs), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["KV_GB/s"] =
      benchmark::Counter(2.0 * num_seqs * context_len * kKvHeads * kHeadSize * sizeof(float) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_PagedAttentionDecode)
    ->ArgNames({"seqs", "context"})
    ->Args({1, 512})
    ->Args({8, 512})
    ->Args({8, 2048})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Seconds of the scalar silu(gate) * up loop over x [tokens, 2 inter], measured once per shape.
double ScalarSiluSeconds(const HostTensor& x, int64_t tokens, int64_t inter) {
  static std::map<std::pair<int64_t, int64_t>, double> cache;
  auto it = cache.find({tokens, inter});
  if (it != cache.end()) return it->second;
  std::vector<float> out(tokens * inter);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t t = 0; t < tokens; ++t) {
    const float* gate = x.data<float>() + t * 2 * inter;
    for (int64_t i = 0; i < inter; ++i) {
      out[t * inter + i] = gate[i] / (1.0f + std::exp(-gate[i])) * gate[inter + i];
    }
  }
  benchmark::DoNotOptimize(out.data());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  cache[{tokens, inter}] = s;
  return s;
}

// The gated MLP activation of a decode step and of a 512-token prefill chunk (SmolLM2's 1536).
void BM_SiluAndMul(benchmark::State& state) {
  const int64_t tokens = state.range(0), inter = state.range(1);
  HostTensor x = Random({tokens, 2 * inter}, 7), out(DType::kF32, {tokens, inter});
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    if (!SiluAndMul({}, out.view(), x.view()).ok()) state.SkipWithError("SiluAndMul");
    benchmark::DoNotOptimize(out.data<float>()[0]);
  }
  const double per_run =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
      static_cast<double>(state.iterations());
  state.counters["elements/s"] = benchmark::Counter(static_cast<double>(tokens * inter),
                                                    benchmark::Counter::kIsIterationInvariantRate);
  state.counters["x_scalar"] = ScalarSiluSeconds(x, tokens, inter) / per_run;
}
BENCHMARK(BM_SiluAndMul)
    ->ArgNames({"tokens", "inter"})
    ->Args({1, 1536})
    ->Args({512, 1536})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace llm::ops

BENCHMARK_MAIN();
