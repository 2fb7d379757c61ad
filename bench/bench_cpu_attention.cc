// bench_cpu_attention: the CPU PagedAttention (kernels/cpu/paged_attention.cc) at a 0.5B-like
// attention shape (14 query heads, 2 kv heads, head size 64, block size 16, blocks scattered):
//   BM_Decode/impl/seqs/context   one query token per sequence: KV_GB/s = K and V bytes read
//                                 per second
//   BM_Prefill/impl/prompt        one sequence's prompt from scratch (causal): GFLOP/s =
//                                 4 * D * heads * prompt * (prompt + 1) / 2 per second
// impl 0 is the production op (cpu::PagedAttention: tiled; AVX-512, or AVX2 and FMA, on the OpenMP
// pool), impl 1 the single-threaded reference (cpu::PagedAttentionReference), impl 2 the
// production op on bf16 caches (a bf16 model's; KV_GB/s counts 2-byte elements), impl 3 the
// production op's tiling with its portable loops (cpu::PagedAttentionPortable: what a CPU
// without AVX2 or AVX-512 runs), in the same process; each row of impls 0, 2 and 3 also reports
// x_reference, its speed-up over impl 1 on the same shape (the
// reference timed once per shape). Rates are per wall-clock second (UseRealTime); the thread count
// is OpenMP's (OMP_NUM_THREADS). BM_EmptyParallelRegion is the pool's fork-join cost on this
// machine, the floor of every threaded row (calls below the op's work threshold run on one).
// --shape=smollm2: SmolLM2-135M's 9 query / 3 kv heads instead of 14 / 2.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/half.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace llm::ops {
namespace {

constexpr int64_t kHeadSize = 64, kBlockSize = 16;
// Query and kv heads: 14 / 2 (Qwen2.5-0.5B, the default) or, with --shape=smollm2, 9 / 3
// (SmolLM2-135M, the model bench/peers serves).
int64_t kHeads = 14, kKvHeads = 2;

HostTensor Random(std::initializer_list<int64_t> shape, uint32_t seed) {
  HostTensor t(DType::kF32, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// num_seqs sequences of context_len tokens each, the last q_len of them this step's queries.
struct Batch {
  Batch(int64_t num_seqs, int64_t context_len, int64_t q_len)
      : blocks_per_seq((context_len + kBlockSize - 1) / kBlockSize),
        key_cache(Random({num_seqs * blocks_per_seq, kBlockSize, kKvHeads, kHeadSize}, 3)),
        value_cache(Random({num_seqs * blocks_per_seq, kBlockSize, kKvHeads, kHeadSize}, 4)),
        query(Random({num_seqs * q_len, kHeads, kHeadSize}, 5)),
        out(DType::kF32, {num_seqs * q_len, kHeads, kHeadSize}),
        tables(DType::kI32, {num_seqs, blocks_per_seq}),
        seq_lens(DType::kI32, {num_seqs}),
        qsl(DType::kI32, {num_seqs + 1}) {
    std::vector<int32_t> ids(num_seqs * blocks_per_seq);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(6));
    std::copy(ids.begin(), ids.end(), tables.data<int32_t>());
    for (int64_t s = 0; s < num_seqs; ++s) seq_lens.data<int32_t>()[s] = context_len;
    for (int64_t s = 0; s <= num_seqs; ++s) qsl.data<int32_t>()[s] = s * q_len;
    md = {tables.view(), seq_lens.view(), qsl.view(), static_cast<int>(context_len)};
  }

  // impl 0: the production op; 1: the reference; 2: the production op on bf16 caches; 3: its
  // portable loops.
  bool Run(int impl) {
    const float scale = 1.0f / std::sqrt(float(kHeadSize));
    if (impl == 2 && key_cache16.view().data == nullptr) {
      key_cache16 = ToBf16(key_cache);
      value_cache16 = ToBf16(value_cache);
    }
    const OpStatus s =
        impl == 1   ? cpu::PagedAttentionReference(out.view(), query.view(), key_cache.view(),
                                                   value_cache.view(), md, scale)
        : impl == 2 ? cpu::PagedAttention(out.view(), query.view(), key_cache16.view(),
                                          value_cache16.view(), md, scale)
        : impl == 3 ? cpu::PagedAttentionPortable(out.view(), query.view(), key_cache.view(),
                                                  value_cache.view(), md, scale)
                    : cpu::PagedAttention(out.view(), query.view(), key_cache.view(),
                                          value_cache.view(), md, scale);
    benchmark::DoNotOptimize(out.data<float>()[0]);
    return s.ok();
  }

  int64_t blocks_per_seq;
  HostTensor key_cache, value_cache, query, out, tables, seq_lens, qsl;
  HostTensor key_cache16, value_cache16;  // impl 2's, made on first use
  AttentionMetadata md;

 private:
  static HostTensor ToBf16(const HostTensor& f32) {
    const TensorView& v = f32.view();
    HostTensor b(DType::kBF16, std::span<const int64_t>(v.shape.data(), v.ndim));
    for (int64_t i = 0; i < f32.numel(); ++i) {
      b.data<uint16_t>()[i] = FloatToBf16(f32.data<float>()[i]);
    }
    return b;
  }
};

// Seconds of one reference run on this shape, measured once per process (the best of 3).
double ReferenceSeconds(int64_t num_seqs, int64_t context_len, int64_t q_len) {
  static std::map<std::tuple<int64_t, int64_t, int64_t>, double> cache;
  auto it = cache.find({num_seqs, context_len, q_len});
  if (it != cache.end()) return it->second;
  Batch b(num_seqs, context_len, q_len);
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    b.Run(/*impl=*/1);
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return cache[{num_seqs, context_len, q_len}] = best;
}

void Measure(benchmark::State& state, int64_t num_seqs, int64_t context_len, int64_t q_len) {
  const int impl = static_cast<int>(state.range(0));
  const bool reference = impl == 1;
  Batch b(num_seqs, context_len, q_len);
  b.Run(impl);  // warm (and impl 2's bf16 caches made)
  const auto start = std::chrono::steady_clock::now();
  int64_t runs = 0;
  for (auto _ : state) {
    if (!b.Run(impl)) state.SkipWithError("PagedAttention failed");
    ++runs;
  }
  const double per_run =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / runs;
  if (!reference) {
    state.counters["x_reference"] = ReferenceSeconds(num_seqs, context_len, q_len) / per_run;
  }
  state.SetLabel(reference ? "reference, 1 thread"
                           : std::string(impl == 2   ? "tiled bf16 KV, "
                                         : impl == 3 ? "tiled portable, "
                                                     : "tiled, ") +
                                 std::to_string(omp_get_max_threads()) + " threads");
}

void BM_Decode(benchmark::State& state) {
  const int64_t num_seqs = state.range(1), context_len = state.range(2);
  Measure(state, num_seqs, context_len, 1);
  state.counters["KV_GB/s"] =
      benchmark::Counter(2.0 * num_seqs * context_len * kKvHeads * kHeadSize *
                             (state.range(0) == 2 ? 2 : sizeof(float)) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Decode)
    ->ArgNames({"impl", "seqs", "context"})
    ->ArgsProduct({{0, 1, 2, 3}, {1, 8, 32}, {512, 2048}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

void BM_Prefill(benchmark::State& state) {
  const int64_t prompt = state.range(1);
  Measure(state, 1, prompt, prompt);
  state.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * kHeadSize * kHeads * prompt * (prompt + 1) / 2 * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Prefill)
    ->ArgNames({"impl", "prompt"})
    ->ArgsProduct({{0, 1, 2, 3}, {512, 2048}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// The pool's fork-join cost: an empty parallel region on all OpenMP threads. Where it is
// large (a loaded or oversubscribed machine), the threaded rows above measure it, not the op.
void BM_EmptyParallelRegion(benchmark::State& state) {
  int sink = 0;
  for (auto _ : state) {
#pragma omp parallel
    {
      if (omp_get_thread_num() == 0) sink = omp_get_num_threads();
    }
    benchmark::DoNotOptimize(sink);
  }
  state.SetLabel(std::to_string(omp_get_max_threads()) + " threads");
}
BENCHMARK(BM_EmptyParallelRegion)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace llm::ops

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) != "--shape=smollm2") continue;
    llm::ops::kHeads = 9;
    llm::ops::kKvHeads = 3;
    for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
    --argc;
    --i;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::printf("Attention shape: %lld query heads, %lld kv heads, head size %lld\n",
              static_cast<long long>(llm::ops::kHeads), static_cast<long long>(llm::ops::kKvHeads),
              static_cast<long long>(llm::ops::kHeadSize));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
