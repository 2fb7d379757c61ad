// bench_gpu_model: decode steps of the GPU worker's model (LlamaModel on cuda, bf16 weights,
// activations and KV cache) with Llama-3-8B shapes (hidden 4096, 32 query / 8 KV heads, head
// 128, intermediate 14,336, 32 layers, vocabulary 128,256; random weights: 16 GB) at batch 1,
// 2, 4, ..., 256, every sequence with a context of 512 tokens.
//
// Each iteration is one engine step as the worker runs it: LlamaModel::Forward enqueues the
// step on the context's stream (inputs packed into pinned memory and uploaded in one copy,
// then embedding, 32 layers, final norm, LM head, f32 logits for every sequence), timed with
// CUDA events recorded on that stream around it; the host wall time of the same span (launch
// overhead included) is the wall_ms counter. BM_DecodeStep runs the step eagerly (a launch per
// kernel); with --graphs BM_DecodeStepGraphs also runs it from CUDA graphs
// (LlamaModel::EnableCudaGraphs, as the served worker runs decode steps: one graph per batch
// size, captured in the warm-up step), in the same process, so that the two wall_ms say what
// the launches cost. The KV cache holds zeros for the context instead of a prefill's keys and
// values (a step's cost does not depend on their values); each step writes one token per
// sequence at position `context`, the same slot every time, so the work per step stays the
// same.
//
// A decode step is bound by memory bandwidth: it reads every weight once (the embedding table
// only for its looked-up rows) and the K and V of every context token of every layer. Two
// references, both in the JSON counters of every decode benchmark:
//   - the baseline measured in the same run, BM_Baseline_DeviceCopy: a device-to-device
//     cudaMemcpyAsync of 1 GiB, its bandwidth counting the bytes read and written;
//   - the paper bound: the step's bytes at the device's nominal memory bandwidth
//     (bench/hbm_bandwidth.h: memory clock x 2 x bus width from the driver, else a table by
//     name), the step time no kernel schedule can beat.
// Counters of BM_DecodeStep and BM_DecodeStepGraphs (per step; the run's time is step_ms):
//   batch, graphs (0 or 1); step_ms (CUDA events), wall_ms (host clock, launches included);
//   tokens/s; read_GB (weights + KV bytes the step reads), kv_GB; read_GB/s; copy_GB/s (the
//   baseline's) and of_copy (read_GB/s over it); paper_ms (read_GB at the nominal bandwidth)
//   and of_paper (paper_ms / step_ms). The JSON's context has device, hbm_nominal_GB/s and
//   hbm_nominal_source. The summary prints the same table.
//
// Flags (before Google Benchmark's own):
//   --layers=N     decoder layers (1..32; also env LLM_BENCH_LAYERS), for devices with less
//                  memory: each layer is 436 MiB of weights plus 64 KiB of KV cache per token
//                  of context per sequence;
//   --context=N    tokens of context per sequence (default 512);
//   --max_batch=N  largest batch size (power of two up to it; default 256);
//   --graphs       also run every batch size from CUDA graphs (BM_DecodeStepGraphs);
//   --tiny         tiny shapes (2 layers, hidden 512, 4 query / 1 KV heads of 128, vocabulary
//                  1024, context 64, batch up to 4, 2 iterations) whose logits must come out
//                  finite: the smoke check that runs under the CUDA emulation (the target
//                  bench_gpu_model_emu, ctest emu.bench_gpu_model_tiny). Not a benchmark there.
//
// Without a usable device it prints why and exits 0. It exits 1 when a step fails.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "bench/hbm_bandwidth.h"
#include "bench/summary_reporter.h"
#include "benchmark/benchmark.h"
#include "common/model_config.h"
#include "kernels/cuda/device.h"
#include "worker_service/cache_engine.h"
#include "worker_service/model/device_context.h"
#include "worker_service/model/llama.h"

namespace llm {
namespace {

constexpr int kBlockSize = 16;
constexpr size_t kGiB = size_t{1} << 30;

struct Options {
  int layers = 32;
  int context = 512;
  int max_batch = 256;
  bool graphs = false;
  bool tiny = false;
};
Options g_options;
bool g_failed = false;          // a step failed, or (--tiny) the logits were not finite
double g_copy_bytes_per_s = 0;  // BM_Baseline_DeviceCopy's (read + written), once it has run
NominalBandwidth g_nominal;     // the device's nominal memory bandwidth, from main()

// What one decode benchmark measured, for the summary: the figures of its JSON counters.
struct StepFigures {
  double step_s = 0, wall_s = 0;
};
std::map<std::pair<bool, int>, StepFigures> g_steps;  // by (graphs, batch)

ModelConfig Llama3_8B(int layers) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.model_type = "llama";
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.max_position_embeddings = 8192;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  return c;
}

ModelConfig Tiny() {
  ModelConfig c = Llama3_8B(2);
  c.vocab_size = 1024;
  c.hidden_size = 512;
  c.intermediate_size = 1024;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 1;
  c.max_position_embeddings = 1024;
  return c;
}

ModelConfig Config() { return g_options.tiny ? Tiny() : Llama3_8B(g_options.layers); }

int BlocksPerSeq() { return g_options.context / kBlockSize + 1; }  // context + 1 tokens

// Bytes of bf16 weights one decode step of `batch` sequences reads: every matrix and norm once,
// the LM head whole, `batch` rows of the embedding table.
double WeightBytesRead(const ModelConfig& c, int batch) {
  const double h = c.hidden_size, d = c.head_dim, q = c.num_attention_heads * d,
               kv = c.num_key_value_heads * d, i = c.intermediate_size;
  const double per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h;
  return 2.0 * (c.num_hidden_layers * per_layer + c.vocab_size * h + h + batch * h);
}

// Bytes of bf16 K and V the step reads: context + 1 tokens per sequence (the new one too).
double KvBytesRead(const ModelConfig& c, int batch) {
  return 2.0 * 2 * c.num_key_value_heads * c.head_dim * c.num_hidden_layers *
         static_cast<double>(batch) * (g_options.context + 1);
}

bool Check(cudaError_t err, const char* what, benchmark::State* state) {
  if (err == cudaSuccess) return true;
  const std::string msg = std::string(what) + ": " + cudaGetErrorString(err);
  state->SkipWithError(msg.c_str());
  g_failed = true;
  return false;
}

struct Fixture {
  std::unique_ptr<DeviceContext> context;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<CacheEngine> cache;
  std::string error;  // why the fixture could not be built
};

// The model, its activation buffers for the largest batch and a zeroed KV cache, built once.
Fixture& Get() {
  static Fixture* f = [] {
    auto* fx = new Fixture;
    const ModelConfig config = Config();
    absl::StatusOr<std::unique_ptr<DeviceContext>> ctx =
        DeviceContext::Create(TensorDevice::Cuda(0));
    if (!ctx.ok()) {
      fx->error = ctx.status().ToString();
      return fx;
    }
    fx->context = std::move(*ctx);
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<std::unique_ptr<LlamaModel>> model =
        LlamaModel::CreateRandom(config, 1, nullptr, {fx->context.get(), DType::kBF16});
    if (!model.ok()) {
      fx->error = model.status().ToString();
      return fx;
    }
    fx->model = std::move(*model);
    const int max_batch = g_options.max_batch;
    if (absl::Status s = fx->model->Reserve(max_batch, max_batch, g_options.context + 1); !s.ok()) {
      fx->error = s.ToString();
      return fx;
    }
    absl::StatusOr<std::unique_ptr<CacheEngine>> cache =
        CacheEngine::Create(CacheShape{config.num_hidden_layers, fx->model->num_local_kv_heads(),
                                       fx->model->head_dim(), kBlockSize, DType::kBF16},
                            max_batch * BlocksPerSeq(), 1, fx->context.get());
    if (!cache.ok()) {
      fx->error = cache.status().ToString();
      return fx;
    }
    fx->cache = std::move(*cache);
    auto stream = static_cast<cudaStream_t>(fx->context->stream());
    for (const LayerKvCache& l : fx->cache->device_caches()) {
      cudaMemsetAsync(l.key.data, 0, l.key.nbytes(), stream);
      cudaMemsetAsync(l.value.data, 0, l.value.nbytes(), stream);
    }
    if (absl::Status s = fx->context->Synchronize(); !s.ok()) {
      fx->error = s.ToString();
      return fx;
    }
    std::printf(
        "model ready in %.1f s: %.2f GB of bf16 weights on the device, KV cache %.2f GB\n",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
        fx->model->weight_bytes() / 1e9,
        2.0 * fx->cache->device_caches().size() * fx->cache->device_caches()[0].key.nbytes() / 1e9);
    return fx;
  }();
  return *f;
}

// Baseline: a device-to-device copy of 1 GiB (16 MiB with --tiny; far beyond the L2 either way
// on an H100), timed with CUDA events; bytes processed count what is read and written.
void BM_Baseline_DeviceCopy(benchmark::State& state) {
  const size_t bytes = g_options.tiny ? (size_t{16} << 20) : kGiB;
  void *src = nullptr, *dst = nullptr;
  if (!Check(cudaMalloc(&src, bytes), "cudaMalloc copy source", &state)) return;
  if (!Check(cudaMalloc(&dst, bytes), "cudaMalloc copy destination", &state)) {
    cudaFree(src);
    return;
  }
  cudaMemset(src, 1, bytes);
  cudaMemset(dst, 2, bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  double total_s = 0;
  bool ok = true;
  for (auto _ : state) {
    cudaEventRecord(start);
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    if (!Check(cudaEventSynchronize(stop), "cudaMemcpyAsync", &state)) {
      ok = false;
      break;
    }
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    total_s += ms * 1e-3;
    state.SetIterationTime(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(src);
  cudaFree(dst);
  if (!ok || total_s <= 0) return;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * bytes));
  g_copy_bytes_per_s = 2.0 * bytes * static_cast<double>(state.iterations()) / total_s;
  state.counters["copy_GB/s"] = g_copy_bytes_per_s / 1e9;
}

// Args: batch. `graphs`: run the steps from CUDA graphs (else eagerly).
void BM_DecodeStep(benchmark::State& state, bool graphs) {
  const int batch = static_cast<int>(state.range(0));
  Fixture& f = Get();
  if (!f.error.empty()) {
    state.SkipWithError(f.error.c_str());
    g_failed = true;
    return;
  }
  f.model->EnableCudaGraphs(graphs ? g_options.max_batch : 0);
  const int bps = BlocksPerSeq(), context = g_options.context;
  // Blocks scattered over the cache, as after a while of serving.
  std::vector<int32_t> tables(batch * bps);
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), std::mt19937(batch));
  std::vector<int32_t> ids(batch), pos(batch, context), lens(batch, context + 1), qsl(batch + 1),
      rows(batch);
  std::vector<int64_t> slots(batch);
  for (int s = 0; s < batch; ++s) {
    ids[s] = (s * 7919 + 42) % Config().vocab_size;
    qsl[s + 1] = s + 1;
    rows[s] = s;
    slots[s] = static_cast<int64_t>(tables[s * bps + context / kBlockSize]) * kBlockSize +
               context % kBlockSize;
  }
  const ForwardInput input{ids, pos, slots, tables, bps, lens, qsl, rows};
  auto stream = static_cast<cudaStream_t>(f.context->stream());
  TensorView logits;
  // Warm-up (first-use costs: cuBLASLt's algorithm choice, buffers; with graphs the capture).
  absl::Status st = f.model->Forward(input, f.cache->device_caches(), &logits);
  if (st.ok()) st = f.model->Synchronize();
  if (!st.ok()) {
    state.SkipWithError(st.ToString().c_str());
    g_failed = true;
    return;
  }
  const int64_t replays_before = f.model->graph_replays();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  double wall_s = 0, step_s = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    cudaEventRecord(start, stream);
    st = f.model->Forward(input, f.cache->device_caches(), &logits);
    cudaEventRecord(stop, stream);
    if (!st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      g_failed = true;
      break;
    }
    if (!Check(cudaEventSynchronize(stop), "decode step", &state)) break;
    wall_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    step_s += ms * 1e-3;
    state.SetIterationTime(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!st.ok() || state.iterations() == 0) return;
  // A graphs benchmark whose steps ran eagerly would report eager figures under its name.
  const int64_t replays = f.model->graph_replays() - replays_before;
  if (graphs && replays != static_cast<int64_t>(state.iterations())) {
    const std::string msg = "graphs: " + std::to_string(replays) + " of " +
                            std::to_string(state.iterations()) + " steps ran from a graph";
    state.SkipWithError(msg.c_str());
    g_failed = true;
    return;
  }
  // The last step's logits: [batch, vocab] f32, all finite.
  std::vector<float> host(static_cast<size_t>(logits.numel()));
  if (!Check(cudaMemcpy(host.data(), logits.data, host.size() * 4, cudaMemcpyDeviceToHost),
             "logits to the host", &state)) {
    return;
  }
  const bool finite =
      std::all_of(host.begin(), host.end(), [](float x) { return std::isfinite(x); });
  if (host.size() != static_cast<size_t>(batch) * Config().vocab_size || !finite) {
    const std::string msg = "logits: expected " + std::to_string(batch) + " x " +
                            std::to_string(Config().vocab_size) + " finite values, got " +
                            std::to_string(host.size()) + (finite ? "" : " with non-finite ones");
    if (g_options.tiny) {
      state.SkipWithError(msg.c_str());
      g_failed = true;
      return;
    }
    std::printf("warning: %s\n", msg.c_str());
  }
  const double n = static_cast<double>(state.iterations());
  const StepFigures fig{step_s / n, wall_s / n};
  g_steps[{graphs, batch}] = fig;
  const ModelConfig c = Config();
  const double kv = KvBytesRead(c, batch), bytes = WeightBytesRead(c, batch) + kv;
  const double paper_s = g_nominal.bytes_per_s > 0 ? bytes / g_nominal.bytes_per_s : 0.0;
  const double read_bytes_per_s = bytes / fig.step_s;
  state.counters["batch"] = batch;
  state.counters["graphs"] = graphs ? 1 : 0;
  state.counters["step_ms"] = fig.step_s * 1e3;
  state.counters["wall_ms"] = fig.wall_s * 1e3;
  state.counters["tokens/s"] = batch / fig.step_s;
  state.counters["read_GB"] = bytes / 1e9;
  state.counters["kv_GB"] = kv / 1e9;
  state.counters["read_GB/s"] = read_bytes_per_s / 1e9;
  state.counters["copy_GB/s"] = g_copy_bytes_per_s / 1e9;
  state.counters["of_copy"] = g_copy_bytes_per_s > 0 ? read_bytes_per_s / g_copy_bytes_per_s : 0.0;
  state.counters["paper_ms"] = paper_s * 1e3;
  state.counters["of_paper"] = paper_s / fig.step_s;
}

// The table of the decode benchmarks' counters (the figures of each one's last run, the one
// Google Benchmark reports), batch by batch, eager then graphs.
void PrintSummary(const SummaryReporter& /*times: the counters have them*/) {
  const ModelConfig c = Config();
  std::printf(
      "\nDevice-to-device copy bandwidth (read + write): %.1f GB/s; nominal memory "
      "bandwidth %.1f GB/s (%s)\n",
      g_copy_bytes_per_s / 1e9, g_nominal.bytes_per_s / 1e9, g_nominal.source.c_str());
  std::printf("%d layers, context %d tokens per sequence; weights read per step: %.2f GB (bf16)\n",
              c.num_hidden_layers, g_options.context, WeightBytesRead(c, 1) / 1e9);
  std::printf("%-6s %-6s %10s %10s %12s %9s %10s %10s %8s %9s %9s\n", "batch", "mode", "step (ms)",
              "wall (ms)", "tokens/s", "KV (GB)", "read (GB)", "read GB/s", "of copy", "paper ms",
              "of paper");
  for (int batch = 1; batch <= g_options.max_batch; batch *= 2) {
    for (const bool graphs : {false, true}) {
      auto it = g_steps.find({graphs, batch});
      if (it == g_steps.end()) continue;
      const StepFigures& fig = it->second;
      const double kv = KvBytesRead(c, batch), bytes = WeightBytesRead(c, batch) + kv;
      const double paper_s = g_nominal.bytes_per_s > 0 ? bytes / g_nominal.bytes_per_s : 0.0;
      std::printf("%-6d %-6s %10.3f %10.3f %12.1f %9.2f %10.2f %10.1f %7.0f%% %9.3f %8.0f%%\n",
                  batch, graphs ? "graphs" : "eager", fig.step_s * 1e3, fig.wall_s * 1e3,
                  batch / fig.step_s, kv / 1e9, bytes / 1e9, bytes / fig.step_s / 1e9,
                  g_copy_bytes_per_s > 0 ? 100.0 * bytes / fig.step_s / g_copy_bytes_per_s : 0.0,
                  paper_s * 1e3, 100.0 * paper_s / fig.step_s);
    }
  }
  std::printf(
      "step: CUDA events around Forward on the model's stream; wall: the host's clock over the "
      "same span (launches included); paper ms: the bytes read at the nominal bandwidth (what a "
      "step would take if it only streamed its bytes at the data sheet's rate); of paper: paper "
      "ms / step.\n");
}

// Parses --name=<int> into *out (in [lo, hi]); false when `arg` is not that flag. Exits 2 with
// the flag, the range and what was given when the value is bad.
bool IntFlag(std::string_view arg, std::string_view name, int lo, int hi, int* out) {
  if (arg.substr(0, name.size()) != name || arg.size() <= name.size() || arg[name.size()] != '=') {
    return false;
  }
  const std::string value(arg.substr(name.size() + 1));
  char* end = nullptr;
  const long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || v < lo || v > hi) {
    std::fprintf(stderr, "bench_gpu_model: %.*s: expected an integer in [%d, %d], got '%s'\n",
                 static_cast<int>(name.size()), name.data(), lo, hi, value.c_str());
    std::exit(2);
  }
  *out = static_cast<int>(v);
  return true;
}

// Takes this program's flags out of argv (Google Benchmark rejects flags it does not know).
void ParseFlags(int* argc, char** argv) {
  if (const char* env = std::getenv("LLM_BENCH_LAYERS"); env != nullptr && *env != '\0') {
    IntFlag(std::string("--layers=") + env, "--layers", 1, 32, &g_options.layers);
  }
  int kept = 1;
  bool context_set = false, batch_set = false;
  for (int i = 1; i < *argc; ++i) {
    const std::string_view arg = argv[i];
    if (IntFlag(arg, "--layers", 1, 32, &g_options.layers)) continue;
    if (IntFlag(arg, "--context", 1, 8000, &g_options.context)) {
      context_set = true;
      continue;
    }
    if (IntFlag(arg, "--max_batch", 1, 4096, &g_options.max_batch)) {
      batch_set = true;
      continue;
    }
    if (arg == "--tiny") {
      g_options.tiny = true;
      continue;
    }
    if (arg == "--graphs") {
      g_options.graphs = true;
      continue;
    }
    argv[kept++] = argv[i];
  }
  *argc = kept;
  if (g_options.tiny) {
    if (!context_set) g_options.context = 64;
    if (!batch_set) g_options.max_batch = 4;
    if (g_options.context >= Tiny().max_position_embeddings) {
      std::fprintf(stderr, "bench_gpu_model: --context: expected < %d with --tiny, got %d\n",
                   Tiny().max_position_embeddings, g_options.context);
      std::exit(2);
    }
  }
}

// Bytes the run puts on the device, roughly: weights, KV cache, 1 GiB of activations, logits
// and workspaces, 2 GiB for the baseline's buffers.
double BytesNeeded(int layers) {
  const ModelConfig c = g_options.tiny ? Tiny() : Llama3_8B(layers);
  const double kv = 2.0 * 2 * c.num_key_value_heads * c.head_dim * layers *
                    static_cast<double>(g_options.max_batch) * BlocksPerSeq() * kBlockSize;
  return WeightBytesRead(c, 0) + 2.0 * c.vocab_size * c.hidden_size + kv + 3.0 * kGiB;
}

}  // namespace
}  // namespace llm

int main(int argc, char** argv) {
  using llm::g_options;
  llm::ParseFlags(&argc, argv);
  std::string why_none;
  if (llm::cuda::DeviceCount(&why_none) == 0) {
    std::printf("bench_gpu_model: skipped: no usable CUDA device: %s\n", why_none.c_str());
    return 0;
  }
  llm::cuda::DeviceInfo info;
  if (std::string err = llm::cuda::GetDeviceInfo(0, &info); !err.empty()) {
    std::printf("bench_gpu_model: %s\n", err.c_str());
    return 1;
  }
  std::printf("device 0: %s (sm_%d%d), %.1f GB\n", info.name.c_str(), info.major, info.minor,
              info.total_memory / 1e9);
  llm::g_nominal = llm::NominalHbmBandwidth(0, info.name);
  benchmark::AddCustomContext("device", info.name);
  benchmark::AddCustomContext("hbm_nominal_GB/s", std::to_string(llm::g_nominal.bytes_per_s / 1e9));
  benchmark::AddCustomContext("hbm_nominal_source", llm::g_nominal.source);
#ifdef LLM_CUDA_EMU
  std::printf(
      "EMULATED CUDA (cuda_emu): this run checks that the code path works; its times "
      "are not a GPU's.\n");
#endif
  if (!g_options.tiny) {
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess &&
        llm::BytesNeeded(g_options.layers) > static_cast<double>(free_bytes)) {
      int fits = 0;
      while (fits < g_options.layers &&
             llm::BytesNeeded(fits + 1) <= static_cast<double>(free_bytes)) {
        ++fits;
      }
      const std::string advice =
          fits > 0 ? "run with --layers=" + std::to_string(fits) +
                         " (or a smaller --max_batch or --context)"
                   : std::string(
                         "even one layer does not fit: use a smaller --max_batch or "
                         "--context");
      std::fprintf(stderr,
                   "bench_gpu_model: %d layers at batch %d and context %d need about %.1f GB, "
                   "the device has %.1f GB free: %s\n",
                   g_options.layers, g_options.max_batch, g_options.context,
                   llm::BytesNeeded(g_options.layers) / 1e9, free_bytes / 1e9, advice.c_str());
      return 1;
    }
  }
  benchmark::RegisterBenchmark("BM_Baseline_DeviceCopy", llm::BM_Baseline_DeviceCopy)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  for (const bool graphs : {false, true}) {
    if (graphs && !g_options.graphs) break;
    auto* decode = benchmark::RegisterBenchmark(graphs ? "BM_DecodeStepGraphs" : "BM_DecodeStep",
                                                llm::BM_DecodeStep, graphs)
                       ->ArgName("batch")
                       ->UseManualTime()
                       ->Unit(benchmark::kMillisecond);
    for (int batch = 1; batch <= g_options.max_batch; batch *= 2) decode->Arg(batch);
    if (g_options.tiny) decode->Iterations(2);
  }
  llm::SummaryReporter reporter;
  const int rc = llm::RunBenchmarksWithSummary(argc, argv, reporter, llm::PrintSummary);
  return rc != 0 ? rc : (llm::g_failed ? 1 : 0);
}
