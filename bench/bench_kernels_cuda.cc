// Paged-attention decode on CUDA with Llama-3-8B shapes (32 query heads, 8 KV heads, head
// size 128, block size 16) at batch 1, 16, 64 and 256 and contexts 512, 2,048 and 8,192, through
// the production dispatcher (ops::PagedAttention, as the worker calls it, with the q_lens and
// seq_lens on the host and the workspace from PagedAttentionWorkspaceBytes), on two paths:
//   path 16  bf16 query, output and cache: the GQA-shared split-KV decode kernel;
//   path 32  f32 query and output, bf16 cache: the fp32 path (v1 / v2 row kernels).
//
// Each iteration first flushes the L2 (a cudaMemsetAsync over twice its size, untimed), then
// times the op with CUDA events (manual time). Baseline, in the same run and per benchmark: a
// device-to-device cudaMemcpyAsync of the same K and V bytes the batch reads (batch * context *
// 8 heads * 128 * 2 (K and V) * 2 bytes), also after an L2 flush, best of 5; its bandwidth
// counts bytes read + written. Counters: KV_GB/s, the K and V bytes over the op's time;
// copy_GB/s; of_copy, their ratio. The target: 80% or more of the copy at batch 64,
// context 2,048.
//
// The static roofline of the decode kernel's main loop (tools/cuda/sass_report.py, asserted
// >= 3.6 by ctest -L sass) is printed first.
//
// Without a usable device it prints why and exits 0.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.h"
#include "kernels/ops.h"

namespace llm {
namespace {

constexpr int64_t kNumHeads = 32, kNumKvHeads = 8, kHeadSize = 128, kBlockSize = 16;

bool Check(cudaError_t err, const char* what, benchmark::State* state = nullptr) {
  if (err == cudaSuccess) return true;
  const std::string msg = std::string(what) + ": " + cudaGetErrorString(err);
  if (state != nullptr) {
    state->SkipWithError(msg.c_str());
  } else {
    std::fprintf(stderr, "%s\n", msg.c_str());
  }
  return false;
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
    int device = 0, l2 = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
    bytes_ = std::max<size_t>(2 * static_cast<size_t>(l2), size_t{1} << 20);
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

// Args: batch, context, path (16: all bf16; 32: f32 query and output, bf16 cache).
void BM_PagedAttentionDecode(benchmark::State& state) {
  const int64_t batch = state.range(0), context = state.range(1);
  const bool path16 = state.range(2) == 16;
  const DType kv_dtype = DType::kBF16, q_dtype = path16 ? DType::kBF16 : DType::kF32;
  const size_t kv_elem = 2, q_elem = path16 ? 2 : 4;
  const int64_t blocks_per_seq = (context + kBlockSize - 1) / kBlockSize;
  const int64_t num_blocks = batch * blocks_per_seq;
  const size_t cache_bytes = num_blocks * kBlockSize * kNumKvHeads * kHeadSize * kv_elem;
  DeviceBuffer kc, vc, q, out, tables, lens, qsl, workspace;
  if (!Check(cudaMalloc(&kc.p, cache_bytes), "cudaMalloc key cache", &state) ||
      !Check(cudaMalloc(&vc.p, cache_bytes), "cudaMalloc value cache", &state)) {
    return;
  }
  cudaMemset(kc.p, 0, cache_bytes);
  cudaMemset(vc.p, 0, cache_bytes);
  const size_t q_bytes = batch * kNumHeads * kHeadSize * q_elem;
  cudaMalloc(&q.p, q_bytes);
  cudaMalloc(&out.p, q_bytes);
  cudaMemset(q.p, 0, q_bytes);
  // Blocks scattered over the cache, as after a while of serving.
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(1));
  std::vector<int32_t> seq_lens(batch, static_cast<int32_t>(context)), starts(batch + 1);
  std::iota(starts.begin(), starts.end(), 0);
  cudaMalloc(&tables.p, ids.size() * sizeof(int32_t));
  cudaMalloc(&lens.p, batch * sizeof(int32_t));
  cudaMalloc(&qsl.p, (batch + 1) * sizeof(int32_t));
  cudaMemcpy(tables.p, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice);
  cudaMemcpy(lens.p, seq_lens.data(), batch * sizeof(int32_t), cudaMemcpyHostToDevice);
  cudaMemcpy(qsl.p, starts.data(), (batch + 1) * sizeof(int32_t), cudaMemcpyHostToDevice);
  if (!Check(cudaGetLastError(), "setup", &state)) return;

  const TensorDevice dev = TensorDevice::Cuda(0);
  const TensorView kv_shape[] = {
      TensorView::Contiguous(kc.p, kv_dtype, {num_blocks, kBlockSize, kNumKvHeads, kHeadSize}, dev),
      TensorView::Contiguous(vc.p, kv_dtype, {num_blocks, kBlockSize, kNumKvHeads, kHeadSize},
                             dev)};
  const TensorView q_view =
      TensorView::Contiguous(q.p, q_dtype, {batch, kNumHeads, kHeadSize}, dev);
  const TensorView out_view =
      TensorView::Contiguous(out.p, q_dtype, {batch, kNumHeads, kHeadSize}, dev);
  ops::AttentionMetadata md;
  md.block_tables = TensorView::Contiguous(tables.p, DType::kI32, {batch, blocks_per_seq}, dev);
  md.seq_lens = TensorView::Contiguous(lens.p, DType::kI32, {batch}, dev);
  md.query_start_loc = TensorView::Contiguous(qsl.p, DType::kI32, {batch + 1}, dev);
  md.max_seq_len = static_cast<int>(context);
  md.query_start_loc_host = starts;  // decode only: no prefill kernel
  md.seq_lens_host = seq_lens;
  // The workspace, allocated once as a worker would (outside the timed loop).
  ops::OpContext ctx;
  ctx.workspace_bytes = ops::PagedAttentionWorkspaceBytes(batch, kNumHeads, kHeadSize, 8192);
  if (ctx.workspace_bytes > 0 &&
      !Check(cudaMalloc(&workspace.p, ctx.workspace_bytes), "cudaMalloc workspace", &state)) {
    return;
  }
  ctx.workspace = workspace.p;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadSize));

  L2Flusher flusher;
  const double kv_bytes = 2.0 * batch * context * kNumKvHeads * kHeadSize * kv_elem;
  const double copy_bytes_per_s = CopyBandwidth(static_cast<size_t>(kv_bytes), flusher);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (auto _ : state) {
    flusher.Flush();
    cudaEventRecord(start);
    const ops::OpStatus s =
        ops::PagedAttention(ctx, out_view, q_view, kv_shape[0], kv_shape[1], md, scale);
    cudaEventRecord(stop);
    if (!s.ok()) {
      state.SkipWithError(s.message.c_str());
      break;
    }
    if (!Check(cudaEventSynchronize(stop), "PagedAttention", &state)) break;
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  state.counters["KV_GB/s"] =
      benchmark::Counter(kv_bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["copy_GB/s"] = copy_bytes_per_s / 1e9;
  state.counters["of_copy"] =
      benchmark::Counter(copy_bytes_per_s > 0 ? kv_bytes / copy_bytes_per_s : 0.0,
                         benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_PagedAttentionDecode)
    ->ArgNames({"batch", "context", "path"})
    ->ArgsProduct({{1, 16, 64, 256}, {512, 2048, 8192}, {16, 32}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace llm

int main(int argc, char** argv) {
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
  std::printf(
      "static roofline of the bf16 decode kernel's main loop (Llama-3-8B shapes): %.2f bytes "
      "per warp-instruction -> issue-bound at %.2f TB/s on an H100 SXM (a figure recorded from "
      "tools/cuda/sass_report.py; `ctest -R sass_report` recomputes it and asserts >= 3.6)\n",
      llm::kDecodeRooflineBytesPerInst,
      llm::kDecodeRooflineBytesPerInst * llm::kH100IssueRate / 1e12);
  std::printf(
      "KV_GB/s: K and V bytes read per second (L2 flushed before each iteration); copy_GB/s: an "
      "L2-flushed device-to-device copy of the same bytes (read + write); of_copy: their ratio\n");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
