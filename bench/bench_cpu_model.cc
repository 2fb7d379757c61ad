// bench_cpu_model: decode steps of the CPU worker on a model shaped like Qwen2.5-0.5B (24
// layers, hidden 896, 14 query / 2 KV heads, intermediate 4864, vocabulary 151,936, tied
// embeddings, qkv bias) with random weights, at batch 1, 8 and 32, with f32 and with bf16 GEMM
// weights (kernels/cpu/packed_linear.h; bf16 only on CPUs with AVX512_BF16 or AMX), on the
// one thread pool (kernels/cpu/thread_pool.h: --threads=N, default the cpuset's CPUs).
// --shape=smollm2: SmolLM2-135M's shape instead (30 layers, hidden 576, 9 query / 3 KV heads,
// intermediate 1536, vocabulary 49,152, tied embeddings), the model bench/peers serves.
// --model=PATH: a model's own weights instead (a directory or a GGUF file, e.g. SmolLM2's Q4_1
// GGUF), its linear weights kept as the file's blocks, or with --quantized-weights=false
// dequantized at load (ModelOptions::quantized_weights).
//
// Two baselines in the same process: a large streaming copy (memcpy of 1 GiB; bandwidth counts
// the bytes read and written), for batch 1, which is bound by reading every weight once; and
// a large oneDNN GEMM per dtype (PackedLinear, 256 x 4096 x 4096), the compute peak the larger
// batches are measured against. The summary prints per dtype and batch the step time, tokens/s,
// GFLOP/s (the GEMMs' 2 * batch * weights plus the attention's 4 * batch * context * q_dim per
// layer), their share of that dtype's GEMM peak, and batch 1's weight bytes per second as a
// share of the copy bandwidth. Targets: a step at batch 8 costs at most 1.5x batch 1, and
// batch 32 reaches 60% of the GEMM peak.
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
#include "cblas.h"
#include "common/model_config.h"
#include "kernels/cpu/blas_setup.h"
#include "kernels/cpu/packed_linear.h"
#include "kernels/cpu/thread_pool.h"
#include "worker_service/cache_engine.h"
#include "worker_service/model/llama.h"

namespace llm {
namespace {

constexpr int kBlockSize = 16;
constexpr int kContext = 256;  // tokens of context per sequence during the decode steps

ModelConfig SmolLm2() {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 49152;
  c.hidden_size = 576;
  c.intermediate_size = 1536;
  c.num_hidden_layers = 30;
  c.num_attention_heads = 9;
  c.num_key_value_heads = 3;
  c.head_dim = 64;
  c.max_position_embeddings = 8192;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 100000.0;
  c.tie_word_embeddings = true;
  c.attention_bias = false;
  return c;
}

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

// Elements of the GEMM weights (every layer's and the LM head's).
double GemmWeights(const ModelConfig& c) {
  const double h = c.hidden_size, d = c.head_dim, q = c.num_attention_heads * d,
               kv = c.num_key_value_heads * d, i = c.intermediate_size;
  return c.num_hidden_layers * (h * q + 2 * h * kv + q * h + 3 * h * i) + c.vocab_size * h;
}

// Weight bytes one decode step reads: every GEMM weight once in its dtype (the embedding only
// for the LM head, which reads all of it; the lookup reads a few rows), the f32 vectors once.
double WeightBytes(const ModelConfig& c, DType dtype) {
  const double h = c.hidden_size, d = c.head_dim, q = c.num_attention_heads * d,
               kv = c.num_key_value_heads * d;
  const double vectors = c.num_hidden_layers * (q + 2 * kv + 2 * h) + h;
  return DTypeSize(dtype) * GemmWeights(c) + 4.0 * vectors;
}

// Floating-point operations of one decode step of `batch` sequences at context kContext.
double StepFlops(const ModelConfig& c, int batch) {
  const double q = c.num_attention_heads * c.head_dim;
  return 2.0 * batch * GemmWeights(c) + 4.0 * batch * (kContext + 1) * q * c.num_hidden_layers;
}

// --shape=qwen0.5b (default) or --shape=smollm2 (SmolLM2-135M, the model bench/peers serves).
bool g_smollm2 = false;
std::string g_model;      // --model
bool g_quantized = true;  // --quantized-weights
ModelConfig BenchConfig() {
  if (!g_model.empty()) {
    static const ModelConfig* config = [] {
      absl::StatusOr<ModelConfig> c = ModelConfig::FromModelDir(g_model);
      if (!c.ok()) {
        std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
        std::exit(1);
      }
      return new ModelConfig(*c);
    }();
    return *config;
  }
  return g_smollm2 ? SmolLm2() : Qwen25HalfB();
}

struct Fixture {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<CacheEngine> cache;
};

bool HasBf16() { return cpu::CpuHasNativeBf16(); }

Fixture& Get(DType dtype) {
  static std::map<DType, Fixture*> fixtures;
  Fixture*& f = fixtures[dtype];
  if (f != nullptr) return *f;
  f = [dtype] {
    auto* fx = new Fixture;
    ModelOptions options;
    options.dtype = dtype;
    options.quantized_weights = g_quantized;
    auto model = g_model.empty() ? LlamaModel::CreateRandom(BenchConfig(), 1, nullptr, options)
                                 : LlamaModel::Load(g_model, BenchConfig(), nullptr, options);
    if (!model.ok()) {
      std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
      std::exit(1);
    }
    fx->model = std::move(*model);
    const int blocks_per_seq = (kContext + 64) / kBlockSize + 1;
    // The KV cache in the model's dtype, as llm-worker's kv_cache_dtype auto keeps it.
    fx->cache = std::make_unique<CacheEngine>(
        CacheShape{fx->model->num_layers(), fx->model->num_local_kv_heads(), fx->model->head_dim(),
                   kBlockSize, dtype},
        32 * blocks_per_seq, 1);
    for (const LayerKvCache& l : fx->cache->device_caches()) {
      std::memset(l.key.data, 0, l.key.nbytes());
      std::memset(l.value.data, 0, l.value.nbytes());
    }
    // The GEMMs' primitives and scratch up front: the steps measured allocate nothing.
    const absl::Status st = fx->model->Reserve(32, 32, kContext + 64);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      std::exit(1);
    }
    return fx;
  }();
  return *f;
}

DType DTypeArg(int64_t arg) { return arg == 1 ? DType::kBF16 : DType::kF32; }

// Decode steps for `batch` sequences whose context is kContext tokens. The cache holds zeros
// for that context instead of a prefill's keys and values (the step's cost does not depend on
// their values, and a prefill of 32 x 256 tokens would take minutes); each step decodes one
// token per sequence at position kContext, overwriting the same slot, so the work per step
// stays the same.
void BM_DecodeStep(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  const DType dtype = DTypeArg(state.range(1));
  if (dtype == DType::kBF16 && !HasBf16()) {
    state.SkipWithError("no AVX512_BF16 or AMX on this CPU");
    return;
  }
  Fixture& f = Get(dtype);
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
// dtype 0: f32 weights; 1: bf16 weights.
BENCHMARK(BM_DecodeStep)
    ->ArgNames({"batch", "bf16"})
    ->ArgsProduct({{1, 8, 32}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Baseline: the compute peak of a large GEMM on packed weights in each dtype.
constexpr int64_t kPeakM = 256, kPeakK = 4096, kPeakN = 4096;
void BM_Baseline_Gemm(benchmark::State& state) {
  const DType dtype = DTypeArg(state.range(0));
  if (dtype == DType::kBF16 && !HasBf16()) {
    state.SkipWithError("no AVX512_BF16 or AMX on this CPU");
    return;
  }
  cpu::EnterThreadPool();
  std::vector<float> w(kPeakN * kPeakK), x(kPeakM * kPeakK), out(kPeakM * kPeakN);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 17) * 0.01f - 0.08f;
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 13) * 0.01f - 0.06f;
  std::unique_ptr<cpu::PackedLinear> p;
  const ops::OpStatus created = cpu::PackedLinear::Create(
      TensorView::Contiguous(w.data(), DType::kF32, {kPeakN, kPeakK}), {}, dtype, &p);
  if (!created.ok()) {
    state.SkipWithError(created.message.c_str());
    return;
  }
  const TensorView xv = TensorView::Contiguous(x.data(), DType::kF32, {kPeakM, kPeakK});
  const TensorView ov = TensorView::Contiguous(out.data(), DType::kF32, {kPeakM, kPeakN});
  (void)p->Reserve(kPeakM);
  (void)p->Forward(ov, xv);  // warm
  for (auto _ : state) {
    const ops::OpStatus st = p->Forward(ov, xv);
    if (!st.ok()) state.SkipWithError(st.message.c_str());
  }
}
BENCHMARK(BM_Baseline_Gemm)
    ->ArgName("bf16")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// One row (batch 1's GEMMs) on a gate_up-shaped weight (2 x 4864 x 896, 35 MB in f32): OpenBLAS
// sgemv (ops::Linear, the fp32 reference; OpenBLAS given the pool's thread count) against the
// packed oneDNN matmul in f32 and bf16. impl 0: OpenBLAS f32; 1: oneDNN f32; 2: oneDNN bf16.
constexpr int64_t kRowN = 2 * 4864, kRowK = 896;
void BM_OneRow(benchmark::State& state) {
  const int impl = static_cast<int>(state.range(0));
  if (impl == 2 && !HasBf16()) {
    state.SkipWithError("no AVX512_BF16 or AMX on this CPU");
    return;
  }
  cpu::EnterThreadPool();
  openblas_set_num_threads(impl == 0 ? cpu::ThreadPoolSize() : 1);
  std::vector<float> w(kRowN * kRowK), x(kRowK), out(kRowN);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 17) * 0.01f - 0.08f;
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 13) * 0.01f - 0.06f;
  const TensorView wv = TensorView::Contiguous(w.data(), DType::kF32, {kRowN, kRowK});
  const TensorView xv = TensorView::Contiguous(x.data(), DType::kF32, {1, kRowK});
  const TensorView ov = TensorView::Contiguous(out.data(), DType::kF32, {1, kRowN});
  std::unique_ptr<cpu::PackedLinear> p;
  if (impl > 0) {
    const ops::OpStatus st =
        cpu::PackedLinear::Create(wv, {}, impl == 2 ? DType::kBF16 : DType::kF32, &p);
    if (!st.ok()) {
      state.SkipWithError(st.message.c_str());
      return;
    }
    (void)p->Reserve(1);
  }
  for (auto _ : state) {
    const ops::OpStatus st = p != nullptr ? p->Forward(ov, xv) : ops::Linear({}, ov, xv, wv, {});
    if (!st.ok()) state.SkipWithError(st.message.c_str());
  }
  openblas_set_num_threads(1);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kRowN * kRowK *
                          (impl == 2 ? 2 : 4));
}
BENCHMARK(BM_OneRow)->ArgName("impl")->Arg(0)->Arg(1)->Arg(2)->UseRealTime();

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
  const ModelConfig c = BenchConfig();
  if (g_model.empty()) {
    std::printf("\nModel shape: %s\n", g_smollm2 ? "SmolLM2-135M" : "Qwen2.5-0.5B");
  } else {
    std::printf("\nModel: %s, weights %s\n", g_model.c_str(),
                g_quantized ? "kept as the file's blocks where they can" : "dequantized");
  }
  const double copy_s = r.seconds("BM_Baseline_StreamingCopy");
  const double bandwidth = copy_s > 0 ? 2.0 * (size_t{1} << 30) / copy_s : 0;
  std::printf("\nThreads: %d (pinned: %s); CPU bf16 (AVX512_BF16 or AMX): %s\n",
              cpu::ThreadPoolSize(), cpu::ThreadPoolPinned() ? "yes" : "no",
              HasBf16() ? "yes" : "no");
  std::printf("Streaming copy bandwidth (read + write): %.2f GB/s\n", bandwidth / 1e9);
  for (int d : {0, 1}) {
    const DType dtype = DTypeArg(d);
    const double gemm_s = r.seconds("BM_Baseline_Gemm/bf16:" + std::to_string(d));
    if (gemm_s <= 0) continue;
    const double peak = 2.0 * kPeakM * kPeakK * kPeakN / gemm_s;
    // A loaded model's own bytes (its blocks, when kept quantized).
    const double weights = g_model.empty() ? WeightBytes(c, dtype)
                                           : static_cast<double>(Get(dtype).model->weight_bytes());
    std::printf(
        "\n%s weights: GEMM peak %.1f GFLOP/s (%lldx%lldx%lld); %.2f GB of weights read "
        "per step\n",
        DTypeName(dtype), peak / 1e9, static_cast<long long>(kPeakM),
        static_cast<long long>(kPeakK), static_cast<long long>(kPeakN), weights / 1e9);
    std::printf("%-6s %10s %10s %9s %8s %10s %8s %10s\n", "batch", "step (ms)", "tokens/s",
                "GFLOP/s", "of peak", "vs batch1", "GB/s", "of copy bw");
    const double s1 = r.seconds("BM_DecodeStep/batch:1/bf16:" + std::to_string(d));
    for (int batch : {1, 8, 32}) {
      const double s =
          r.seconds("BM_DecodeStep/batch:" + std::to_string(batch) + "/bf16:" + std::to_string(d));
      if (s <= 0) continue;
      const double flops = StepFlops(c, batch) / s;
      std::printf("%-6d %10.1f %10.1f %9.1f %7.0f%% %9.2fx %8.2f %9.0f%%\n", batch, s * 1e3,
                  batch / s, flops / 1e9, 100.0 * flops / peak, s1 > 0 ? s / s1 : 0.0,
                  weights / s / 1e9, 100.0 * weights / s / bandwidth);
    }
  }
  const char* names[] = {"OpenBLAS sgemv f32", "oneDNN packed f32", "oneDNN packed bf16"};
  std::printf("\nOne row x [%lld, %lld] weight:\n", static_cast<long long>(kRowN),
              static_cast<long long>(kRowK));
  for (int impl = 0; impl < 3; ++impl) {
    const double s = r.seconds("BM_OneRow/impl:" + std::to_string(impl));
    if (s <= 0) continue;
    const double bytes = static_cast<double>(kRowN) * kRowK * (impl == 2 ? 2 : 4);
    std::printf("  %-20s %8.3f ms %8.2f GB/s of weights (%3.0f%% of copy bw)\n", names[impl],
                s * 1e3, bytes / s / 1e9, 100.0 * bytes / s / bandwidth);
  }
  std::printf(
      "Targets: batch 8 at most 1.5x batch 1's step; batch 32 at 60%% or more of the GEMM "
      "peak; batch 1 at 70%% or more of the copy bandwidth.\n");
}

}  // namespace
}  // namespace llm

int main(int argc, char** argv) {
  llm::cpu::ReexecWithOpenMpSettings(argv);
  llm::cpu::ReexecWithMatchingBlasKernels(argv);
  // --threads=N: the pool size (default: the cpuset's CPUs); --pin-threads=true: pinned;
  // --coded-weights=false: bf16 steps of 1 to 4 rows on oneDNN, not the 12-bit coded weights;
  // --model=PATH, --quantized-weights=false: see the file comment.
  for (int i = 1; i < argc; ++i) {
    const bool threads = std::strncmp(argv[i], "--threads=", 10) == 0;
    const bool pin = std::strncmp(argv[i], "--pin-threads=", 14) == 0;
    const bool shape = std::strncmp(argv[i], "--shape=", 8) == 0;
    const bool coded = std::strncmp(argv[i], "--coded-weights=", 16) == 0;
    const bool model = std::strncmp(argv[i], "--model=", 8) == 0;
    const bool quantized = std::strncmp(argv[i], "--quantized-weights=", 20) == 0;
    if (!threads && !pin && !shape && !coded && !model && !quantized) continue;
    if (model) llm::g_model = argv[i] + 8;
    if (quantized) llm::g_quantized = std::strcmp(argv[i] + 20, "true") == 0;
    if (coded) llm::cpu::SetCodedWeights(std::strcmp(argv[i] + 16, "true") == 0);
    if (shape) llm::g_smollm2 = std::strcmp(argv[i] + 8, "smollm2") == 0;
    if (threads) llm::cpu::SetThreadPoolSize(std::atoi(argv[i] + 10));
    if (pin) llm::cpu::SetThreadPoolPinning(std::strcmp(argv[i] + 14, "true") == 0);
    for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
    --argc;
    --i;
  }
  llm::SummaryReporter reporter;
  return llm::RunBenchmarksWithSummary(argc, argv, reporter, llm::PrintSummary);
}
