// Paged attention on CUDA with Llama-3-8B shapes (32 query heads, 8 KV heads, head size 128,
// block size 16) through the production dispatcher (ops::PagedAttention, as the worker calls
// it, with the q_lens and seq_lens on the host and the workspace from
// PagedAttentionWorkspaceBytes):
//
// Decode (BM_PagedAttentionDecode, one query row per sequence) at batch 1, 16, 64 and 256 and
// contexts 512, 2,048 and 8,192, on two paths:
//   path 16  bf16 query, output and cache: the GQA-shared split-KV decode kernel;
//   path 32  f32 query and output, bf16 cache: the fp32 path (v1 / v2 row kernels).
// Each iteration first flushes the L2 (a cudaMemsetAsync over twice its size, untimed), then
// times the op with CUDA events (manual time). Baseline, in the same run and per benchmark: a
// device-to-device cudaMemcpyAsync of the same K and V bytes the batch reads (batch * context *
// 8 heads * 128 * 2 (K and V) * 2 bytes), also after an L2 flush, best of 5; its bandwidth
// counts bytes read + written. Counters: KV_GB/s, the K and V bytes over the op's time;
// copy_GB/s; of_copy, their ratio. The target: 80% or more of the copy at batch 64,
// context 2,048.
//
// Prefill (BM_PagedAttentionPrefill, bf16 query, output and cache: the tensor-core prefill
// kernel) at batch x prompt 1 x 2,048, 4 x 2,048, 1 x 8,192 and 16 x 512: each sequence's whole
// prompt in one step from position 0 (q_len = seq_len), causal, its K and V already in the
// cache (the worker writes them with ReshapeAndCache before the attention), blocks scattered,
// inputs uniform in [-1, 1]. Prefill is bound by the tensor cores, not by memory: the L2 is not
// flushed. Each iteration times a burst of 10 back-to-back calls with CUDA events (so the
// host's planning between calls is hidden, as it is behind a layer's other kernels in a
// step) and counts their mean as its time. FLOPs of a causal prefill, the formula
// tools/gpu/torch_attention_bench.py uses too (QK^T and PV, 2 FLOPs per multiply-add, over
// the key positions each row sees, the diagonal included):
//   FLOPs = 4 * heads * head_dim * sum over sequences of q_len * (q_len + 1) / 2.
// Counters: TFLOP/s (FLOPs over the mean call time), call_us (the mean call time), batch,
// q_len, tokens (query rows per call). The baseline stands outside this program: torch's
// scaled_dot_product_attention at the same shapes (tools/gpu/torch_attention_bench.py).
//
// The static roofline of the decode kernel's main loop (tools/cuda/sass_report.py, asserted
// >= 3.6 by ctest -L sass) is printed first.
//
// Flags (before Google Benchmark's own):
//   --tiny  small shapes (8 query / 2 KV heads of 128; decode batch 1 and 3 at context 40,
//           prefill 1 x 64 and 2 x 40; 2 iterations, bursts of 1) whose outputs must come out
//           finite: the smoke check that runs under the CUDA emulation (the target
//           bench_kernels_cuda_emu, ctest emu.bench_kernels_cuda_tiny). Not a benchmark there.
//
// Without a usable device it prints why and exits 0. It exits 1 when a call fails or (--tiny)
// an output is not finite.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/half.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.h"
#include "kernels/ops.h"

namespace llm {
namespace {

constexpr int64_t kHeadSize = 128, kBlockSize = 16;

struct Heads {
  int64_t q = 32, kv = 8;
};
Heads g_heads;        // --tiny: 8 and 2
bool g_tiny = false;  // --tiny
bool g_failed = false;

bool Check(cudaError_t err, const char* what, benchmark::State* state = nullptr) {
  if (err == cudaSuccess) return true;
  const std::string msg = std::string(what) + ": " + cudaGetErrorString(err);
  if (state != nullptr) {
    state->SkipWithError(msg.c_str());
    g_failed = true;
  } else {
    std::fprintf(stderr, "%s\n", msg.c_str());
  }
  return false;
}

void Fail(benchmark::State& state, const std::string& msg) {
  state.SkipWithError(msg.c_str());
  g_failed = true;
}

// The static roofline of DecodeAttentionKernel<__nv_bfloat16, 128, 4>'s main loop, as
// tools/cuda/sass_report.py measures it (bytes of K and V per warp-instruction, each byte
// counted once per GQA group): sm_90, 4096 B per 821 warp-instructions in the worse of its two
// main loops (662 in the one power-of-two block sizes run: 6.19). Update with the kernel.
constexpr double kDecodeRooflineBytesPerInst = 4.99;
constexpr double kH100IssueRate = 132 * 4 * 1.755e9;  // warp-instructions per second

struct DeviceBuffer {
  void* p = nullptr;
  ~DeviceBuffer() { cudaFree(p); }
};

// Evicts the L2 by writing a buffer of twice its size, on the default stream.
class L2Flusher {
 public:
  L2Flusher() {
    int device = 0;
    cudaDeviceProp prop{};
    cudaGetDevice(&device);
    cudaGetDeviceProperties(&prop, device);
    bytes_ = std::max<size_t>(2 * static_cast<size_t>(prop.l2CacheSize), size_t{1} << 20);
    if (cudaMalloc(&buf_.p, bytes_) != cudaSuccess) bytes_ = 0;
  }
  void Flush() {
    if (bytes_ > 0) cudaMemsetAsync(buf_.p, 0x5a, bytes_);
  }

 private:
  DeviceBuffer buf_;
  size_t bytes_ = 0;
};

// The best of 5 L2-flushed device-to-device copies of `bytes`: (read + written) bytes per second.
double CopyBandwidth(size_t bytes, L2Flusher& flusher) {
  DeviceBuffer src, dst;
  if (!Check(cudaMalloc(&src.p, bytes), "cudaMalloc") ||
      !Check(cudaMalloc(&dst.p, bytes), "cudaMalloc")) {
    return 0.0;
  }
  cudaMemset(src.p, 0, bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  float best_ms = 1e30f;
  for (int i = 0; i < 5; ++i) {
    flusher.Flush();
    cudaEventRecord(start);
    cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    if (!Check(cudaEventSynchronize(stop), "cudaMemcpyAsync")) break;
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    best_ms = std::min(best_ms, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 2.0 * bytes / (best_ms * 1e-3);
}

// `n` bf16 values uniform in [-1, 1] uploaded to `dst`.
bool FillRandomBf16(void* dst, size_t n, uint32_t seed, benchmark::State& state) {
  std::vector<uint16_t> host(n);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (uint16_t& x : host) x = FloatToBf16(u(rng));
  return Check(cudaMemcpy(dst, host.data(), n * 2, cudaMemcpyHostToDevice), "upload", &state);
}

// Whether the `n` values of `dtype` (bf16 or f32) at device address `src` are all finite: an
// output that is not says the op read what it should not (or the inputs were bad).
bool AllFinite(const void* src, size_t n, DType dtype, benchmark::State& state) {
  const size_t elem = dtype == DType::kF32 ? 4 : 2;
  std::vector<unsigned char> host(n * elem);
  if (!Check(cudaMemcpy(host.data(), src, host.size(), cudaMemcpyDeviceToHost), "download",
             &state)) {
    return false;
  }
  for (size_t i = 0; i < n; ++i) {
    float v = 0;
    if (elem == 4) {
      std::memcpy(&v, &host[4 * i], 4);
    } else {
      uint16_t b = 0;
      std::memcpy(&b, &host[2 * i], 2);
      v = Bf16ToFloat(b);
    }
    if (!std::isfinite(v)) return false;
  }
  return true;
}

// A batch's block tables and lengths, on the host and the device: `batch` sequences of
// `seq_len` tokens each with `q_len` query rows (the last q_len positions), blocks scattered
// over the cache as after a while of serving.
struct PagedBatch {
  std::vector<int32_t> block_ids, seq_lens, starts;
  DeviceBuffer tables, lens, qsl;
  int64_t blocks_per_seq = 0, num_blocks = 0;

  bool Build(int64_t batch, int64_t seq_len, int64_t q_len, benchmark::State& state) {
    blocks_per_seq = (seq_len + kBlockSize - 1) / kBlockSize;
    num_blocks = batch * blocks_per_seq;
    block_ids.resize(num_blocks);
    std::iota(block_ids.begin(), block_ids.end(), 0);
    std::shuffle(block_ids.begin(), block_ids.end(), std::mt19937(1));
    seq_lens.assign(batch, static_cast<int32_t>(seq_len));
    starts.resize(batch + 1);
    for (int64_t s = 0; s <= batch; ++s) starts[s] = static_cast<int32_t>(s * q_len);
    return Upload(&tables, block_ids, state) && Upload(&lens, seq_lens, state) &&
           Upload(&qsl, starts, state);
  }

  // The metadata as the worker fills it (llama.cc's Upload).
  ops::AttentionMetadata Metadata() const {
    const TensorDevice dev = TensorDevice::Cuda(0);
    const int64_t batch = static_cast<int64_t>(seq_lens.size());
    ops::AttentionMetadata md;
    md.block_tables = TensorView::Contiguous(tables.p, DType::kI32, {batch, blocks_per_seq}, dev);
    md.seq_lens = TensorView::Contiguous(lens.p, DType::kI32, {batch}, dev);
    md.query_start_loc = TensorView::Contiguous(qsl.p, DType::kI32, {batch + 1}, dev);
    md.max_seq_len = *std::max_element(seq_lens.begin(), seq_lens.end());
    md.query_start_loc_host = starts;
    md.seq_lens_host = seq_lens;
    return md;
  }

 private:
  static bool Upload(DeviceBuffer* dst, const std::vector<int32_t>& v, benchmark::State& state) {
    const size_t bytes = v.size() * sizeof(int32_t);
    return Check(cudaMalloc(&dst->p, bytes), "cudaMalloc", &state) &&
           Check(cudaMemcpy(dst->p, v.data(), bytes, cudaMemcpyHostToDevice), "upload", &state);
  }
};

// Args: batch, context, path (16: all bf16; 32: f32 query and output, bf16 cache).
void BM_PagedAttentionDecode(benchmark::State& state) {
  const int64_t batch = state.range(0), context = state.range(1);
  const bool path16 = state.range(2) == 16;
  const DType kv_dtype = DType::kBF16, q_dtype = path16 ? DType::kBF16 : DType::kF32;
  const size_t kv_elem = 2, q_elem = path16 ? 2 : 4;
  PagedBatch pb;
  if (!pb.Build(batch, context, 1, state)) return;
  const int64_t num_blocks = pb.num_blocks;
  const size_t cache_bytes = num_blocks * kBlockSize * g_heads.kv * kHeadSize * kv_elem;
  DeviceBuffer kc, vc, q, out, workspace;
  if (!Check(cudaMalloc(&kc.p, cache_bytes), "cudaMalloc key cache", &state) ||
      !Check(cudaMalloc(&vc.p, cache_bytes), "cudaMalloc value cache", &state)) {
    return;
  }
  cudaMemset(kc.p, 0, cache_bytes);
  cudaMemset(vc.p, 0, cache_bytes);
  const size_t q_bytes = batch * g_heads.q * kHeadSize * q_elem;
  cudaMalloc(&q.p, q_bytes);
  cudaMalloc(&out.p, q_bytes);
  cudaMemset(q.p, 0, q_bytes);
  if (!Check(cudaGetLastError(), "setup", &state)) return;

  const TensorDevice dev = TensorDevice::Cuda(0);
  const TensorView kv_shape[] = {
      TensorView::Contiguous(kc.p, kv_dtype, {num_blocks, kBlockSize, g_heads.kv, kHeadSize}, dev),
      TensorView::Contiguous(vc.p, kv_dtype, {num_blocks, kBlockSize, g_heads.kv, kHeadSize}, dev)};
  const TensorView q_view =
      TensorView::Contiguous(q.p, q_dtype, {batch, g_heads.q, kHeadSize}, dev);
  const TensorView out_view =
      TensorView::Contiguous(out.p, q_dtype, {batch, g_heads.q, kHeadSize}, dev);
  const ops::AttentionMetadata md = pb.Metadata();  // decode only: no prefill kernel
  // The workspace, allocated once as a worker would (outside the timed loop).
  ops::OpContext ctx;
  ctx.workspace_bytes = ops::PagedAttentionWorkspaceBytes(batch, g_heads.q, kHeadSize, 8192);
  if (ctx.workspace_bytes > 0 &&
      !Check(cudaMalloc(&workspace.p, ctx.workspace_bytes), "cudaMalloc workspace", &state)) {
    return;
  }
  ctx.workspace = workspace.p;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadSize));

  L2Flusher flusher;
  const double kv_bytes = 2.0 * batch * context * g_heads.kv * kHeadSize * kv_elem;
  const double copy_bytes_per_s = CopyBandwidth(static_cast<size_t>(kv_bytes), flusher);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  bool ok = true;
  for (auto _ : state) {
    flusher.Flush();
    cudaEventRecord(start);
    const ops::OpStatus s =
        ops::PagedAttention(ctx, out_view, q_view, kv_shape[0], kv_shape[1], md, scale);
    cudaEventRecord(stop);
    if (!s.ok()) {
      Fail(state, s.message);
      ok = false;
      break;
    }
    if (!Check(cudaEventSynchronize(stop), "PagedAttention", &state)) {
      ok = false;
      break;
    }
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!ok) return;
  if (!AllFinite(out.p, batch * g_heads.q * kHeadSize, q_dtype, state)) {
    Fail(state, "PagedAttention: an output is not finite");
    return;
  }
  state.counters["KV_GB/s"] =
      benchmark::Counter(kv_bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["copy_GB/s"] = copy_bytes_per_s / 1e9;
  state.counters["of_copy"] =
      benchmark::Counter(copy_bytes_per_s > 0 ? kv_bytes / copy_bytes_per_s : 0.0,
                         benchmark::Counter::kIsIterationInvariantRate);
}

// FLOPs of causal attention over prompts of q_len tokens from position 0 (the header's
// formula): row j sees j + 1 keys, 2 * head_dim multiply-adds each (QK^T and PV).
double CausalPrefillFlops(int64_t batch, int64_t q_len) {
  const double pairs = static_cast<double>(q_len) * (q_len + 1) / 2;
  return 4.0 * g_heads.q * kHeadSize * batch * pairs;
}

// Args: batch, q_len (each sequence's whole prompt, from position 0, in one step).
void BM_PagedAttentionPrefill(benchmark::State& state) {
  const int64_t batch = state.range(0), q_len = state.range(1), tokens = batch * q_len;
  const int burst = g_tiny ? 1 : 10;
  PagedBatch pb;
  if (!pb.Build(batch, q_len, q_len, state)) return;
  const int64_t num_blocks = pb.num_blocks;
  const size_t cache_elems = num_blocks * kBlockSize * g_heads.kv * kHeadSize;
  const size_t q_elems = tokens * g_heads.q * kHeadSize;
  DeviceBuffer kc, vc, q, out, workspace;
  if (!Check(cudaMalloc(&kc.p, cache_elems * 2), "cudaMalloc key cache", &state) ||
      !Check(cudaMalloc(&vc.p, cache_elems * 2), "cudaMalloc value cache", &state) ||
      !Check(cudaMalloc(&q.p, q_elems * 2), "cudaMalloc query", &state) ||
      !Check(cudaMalloc(&out.p, q_elems * 2), "cudaMalloc output", &state) ||
      !FillRandomBf16(kc.p, cache_elems, 1, state) ||
      !FillRandomBf16(vc.p, cache_elems, 2, state) || !FillRandomBf16(q.p, q_elems, 3, state)) {
    return;
  }
  const TensorDevice dev = TensorDevice::Cuda(0);
  const TensorView k_view = TensorView::Contiguous(
      kc.p, DType::kBF16, {num_blocks, kBlockSize, g_heads.kv, kHeadSize}, dev);
  const TensorView v_view = TensorView::Contiguous(
      vc.p, DType::kBF16, {num_blocks, kBlockSize, g_heads.kv, kHeadSize}, dev);
  const TensorView q_view =
      TensorView::Contiguous(q.p, DType::kBF16, {tokens, g_heads.q, kHeadSize}, dev);
  const TensorView out_view =
      TensorView::Contiguous(out.p, DType::kBF16, {tokens, g_heads.q, kHeadSize}, dev);
  const ops::AttentionMetadata md = pb.Metadata();
  ops::OpContext ctx;
  ctx.workspace_bytes = ops::PagedAttentionWorkspaceBytes(tokens, g_heads.q, kHeadSize, q_len);
  if (ctx.workspace_bytes > 0 &&
      !Check(cudaMalloc(&workspace.p, ctx.workspace_bytes), "cudaMalloc workspace", &state)) {
    return;
  }
  ctx.workspace = workspace.p;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadSize));
  const auto call = [&] {
    return ops::PagedAttention(ctx, out_view, q_view, k_view, v_view, md, scale);
  };
  // Warm-up: first-launch costs (module loading) stay out of the figures.
  if (ops::OpStatus s = call(); !s.ok()) return Fail(state, s.message);
  if (!Check(cudaDeviceSynchronize(), "PagedAttention", &state)) return;

  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  double total_s = 0;
  bool ok = true;
  for (auto _ : state) {
    cudaEventRecord(start);
    for (int i = 0; i < burst && ok; ++i) {
      if (ops::OpStatus s = call(); !s.ok()) {
        Fail(state, s.message);
        ok = false;
      }
    }
    cudaEventRecord(stop);
    if (!ok || !Check(cudaEventSynchronize(stop), "PagedAttention", &state)) {
      ok = false;
      break;
    }
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    const double call_s = ms * 1e-3 / burst;
    total_s += call_s;
    state.SetIterationTime(call_s);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!ok || state.iterations() == 0) return;
  if (!AllFinite(out.p, q_elems, DType::kBF16, state)) {
    Fail(state, "PagedAttention: an output is not finite");
    return;
  }
  const double call_s = total_s / static_cast<double>(state.iterations());
  state.counters["TFLOP/s"] = CausalPrefillFlops(batch, q_len) / call_s / 1e12;
  state.counters["call_us"] = call_s * 1e6;
  state.counters["batch"] = static_cast<double>(batch);
  state.counters["q_len"] = static_cast<double>(q_len);
  state.counters["tokens"] = static_cast<double>(tokens);
}

void RegisterBenchmarks() {
  auto* decode = benchmark::RegisterBenchmark("BM_PagedAttentionDecode", BM_PagedAttentionDecode)
                     ->ArgNames({"batch", "context", "path"})
                     ->UseManualTime()
                     ->Unit(benchmark::kMicrosecond);
  auto* prefill = benchmark::RegisterBenchmark("BM_PagedAttentionPrefill", BM_PagedAttentionPrefill)
                      ->ArgNames({"batch", "q_len"})
                      ->UseManualTime()
                      ->Unit(benchmark::kMicrosecond);
  if (g_tiny) {
    decode->ArgsProduct({{1, 3}, {40}, {16, 32}})->Iterations(2);
    prefill->Args({1, 64})->Args({2, 40})->Iterations(2);
    return;
  }
  decode->ArgsProduct({{1, 16, 64, 256}, {512, 2048, 8192}, {16, 32}});
  prefill->Args({1, 2048})->Args({4, 2048})->Args({1, 8192})->Args({16, 512});
}

// Takes this program's flags out of argv (Google Benchmark rejects flags it does not know).
void ParseFlags(int* argc, char** argv) {
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    if (std::string_view(argv[i]) == "--tiny") {
      g_tiny = true;
      g_heads = {8, 2};
      continue;
    }
    argv[kept++] = argv[i];
  }
  *argc = kept;
}

}  // namespace
}  // namespace llm

int main(int argc, char** argv) {
  llm::ParseFlags(&argc, argv);
  std::string why_none;
  if (llm::cuda::DeviceCount(&why_none) == 0) {
    std::printf("bench_kernels_cuda: skipped: no usable CUDA device: %s\n", why_none.c_str());
    return 0;
  }
  llm::cuda::DeviceInfo info;
  if (std::string err = llm::cuda::GetDeviceInfo(0, &info); !err.empty()) {
    std::printf("bench_kernels_cuda: %s\n", err.c_str());
    return 1;
  }
  std::printf("device 0: %s (sm_%d%d)\n", info.name.c_str(), info.major, info.minor);
#ifdef LLM_CUDA_EMU
  std::printf(
      "EMULATED CUDA (cuda_emu): this run checks that the code path works; its times "
      "are not a GPU's.\n");
#endif
  benchmark::AddCustomContext("device", info.name);
  std::printf(
      "static roofline of the bf16 decode kernel's main loop (Llama-3-8B shapes): %.2f bytes "
      "per warp-instruction -> issue-bound at %.2f TB/s on an H100 SXM (a figure recorded from "
      "tools/cuda/sass_report.py; `ctest -R sass_report` recomputes it and asserts >= 3.6)\n",
      llm::kDecodeRooflineBytesPerInst,
      llm::kDecodeRooflineBytesPerInst * llm::kH100IssueRate / 1e12);
  std::printf(
      "decode: KV_GB/s: K and V bytes read per second (L2 flushed before each iteration); "
      "copy_GB/s: an L2-flushed device-to-device copy of the same bytes (read + write); "
      "of_copy: their ratio\n"
      "prefill: TFLOP/s = 4 * heads * head_dim * sum over sequences of q_len * (q_len + 1) / 2 "
      "over the mean call time (call_us) of bursts of back-to-back calls, L2 not flushed\n");
  llm::RegisterBenchmarks();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return llm::g_failed ? 1 : 0;
}
