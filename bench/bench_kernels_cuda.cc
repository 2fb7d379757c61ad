// Paged-attention decode on CUDA with Llama-3-8B shapes (32 query heads, 8 KV heads, head
// size 128, block size 16) at batch 1, 16, 64 and 256 and contexts 512 to 8,192, v1 and v2,
// with a bf16 KV cache (as Llama-3-8B is served) and an f32 one (the CPU reference's dtype).
//
// Time: CUDA events around each launch (manual time). Bandwidth: the K and V bytes the batch
// reads (batch * context * 8 heads * 128 * 2 K and V * 2 or 4 bytes) over that time, printed as
// GB/s and as a fraction of the bandwidth of a device-to-device cudaMemcpy of 1 GiB measured first
// in the same run (bytes read + bytes written over its time). The target: 80% or more of
// the copy's bandwidth at batch 64 and context 2,048.
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

double g_copy_bytes_per_s = 0.0;  // device-to-device copy: (read + written) bytes per second

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

// The best of 20 device-to-device copies of 1 GiB.
double MeasureCopyBandwidth() {
  constexpr size_t kBytes = size_t{1} << 30;
  void *src = nullptr, *dst = nullptr;
  if (!Check(cudaMalloc(&src, kBytes), "cudaMalloc") ||
      !Check(cudaMalloc(&dst, kBytes), "cudaMalloc")) {
    return 0.0;
  }
  cudaMemset(src, 0, kBytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  float best_ms = 1e30f;
  for (int i = 0; i < 20; ++i) {
    cudaEventRecord(start);
    cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    if (!Check(cudaEventSynchronize(stop), "cudaMemcpyAsync")) break;
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    best_ms = std::min(best_ms, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * kBytes / (best_ms * 1e-3);
}

struct DeviceBuffer {
  void* p = nullptr;
  ~DeviceBuffer() { cudaFree(p); }
};

// Args: batch, context, version (1 or 2), KV element bits (16: bf16, 32: f32).
void BM_PagedAttentionDecode(benchmark::State& state) {
  const int64_t batch = state.range(0), context = state.range(1);
  const auto version = state.range(2) == 1 ? ops::cuda::PagedAttentionVersion::kV1
                                           : ops::cuda::PagedAttentionVersion::kV2;
  const DType kv_dtype = state.range(3) == 16 ? DType::kBF16 : DType::kF32;
  const size_t kv_elem = state.range(3) == 16 ? 2 : 4;
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
  const size_t q_bytes = batch * kNumHeads * kHeadSize * sizeof(float);
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
      TensorView::Contiguous(q.p, DType::kF32, {batch, kNumHeads, kHeadSize}, dev);
  const TensorView out_view =
      TensorView::Contiguous(out.p, DType::kF32, {batch, kNumHeads, kHeadSize}, dev);
  ops::AttentionMetadata md;
  md.block_tables = TensorView::Contiguous(tables.p, DType::kI32, {batch, blocks_per_seq}, dev);
  md.seq_lens = TensorView::Contiguous(lens.p, DType::kI32, {batch}, dev);
  md.query_start_loc = TensorView::Contiguous(qsl.p, DType::kI32, {batch + 1}, dev);
  md.max_seq_len = static_cast<int>(context);
  md.query_start_loc_host = starts;  // decode only: no prefill kernel
  // v2's workspace, allocated once as a worker would (outside the timed loop).
  ops::OpContext ctx;
  ctx.workspace_bytes =
      ops::cuda::SplitKWorkspaceBytes(batch, kNumHeads, kHeadSize, md.max_seq_len);
  if (ctx.workspace_bytes > 0 &&
      !Check(cudaMalloc(&workspace.p, ctx.workspace_bytes), "cudaMalloc workspace", &state)) {
    return;
  }
  ctx.workspace = workspace.p;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadSize));

  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (auto _ : state) {
    cudaEventRecord(start);
    const ops::OpStatus s = ops::cuda::PagedAttention(ctx, out_view, q_view, kv_shape[0],
                                                      kv_shape[1], md, scale, version);
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
  const double kv_bytes = 2.0 * batch * context * kNumKvHeads * kHeadSize * kv_elem;
  state.counters["KV_GB/s"] =
      benchmark::Counter(kv_bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["of_copy"] =
      benchmark::Counter(g_copy_bytes_per_s > 0 ? kv_bytes / g_copy_bytes_per_s : 0.0,
                         benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_PagedAttentionDecode)
    ->ArgNames({"batch", "context", "v", "kv_bits"})
    ->ArgsProduct({{1, 16, 64, 256}, {512, 1024, 2048, 4096, 8192}, {1, 2}, {16, 32}})
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
  llm::g_copy_bytes_per_s = llm::MeasureCopyBandwidth();
  std::printf("device 0: %s (sm_%d%d); device-to-device cudaMemcpy: %.0f GB/s (read + write)\n",
              info.name.c_str(), info.major, info.minor, llm::g_copy_bytes_per_s / 1e9);
  std::printf("KV_GB/s: K and V bytes read per second; of_copy: that over the copy's GB/s\n");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
