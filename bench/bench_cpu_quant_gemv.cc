// bench_cpu_quant_gemv: a decode step's GEMMs on GGUF-quantized weights kept as their blocks
// (kernels/cpu/quantized_linear.h) against the same weights dequantized to f32 and run through
// oneDNN (PackedLinear, what a dequantized GGUF runs on a CPU without native bf16), in one
// process. Two model shapes:
//   shape:0  SmolLM2-135M: 30 layers of qkv 960x576, o 576x576, gate_up 3072x576, down 576x1536
//            and the 49152x576 LM head (32-weight block types only: K = 576 is no multiple of
//            256);
//   shape:1  Llama-3.2-1B, two layers: qkv 3072x2048, o 2048x2048, gate_up 16384x2048, down
//            2048x8192 (every type);
//   shape:2  the experts one token runs in two layers of Qwen3-30B-A3B: 8 per layer, each a
//            gate_up 1536x2048 and a down 2048x768 GEMM (every type; rows 1 and 2 only, the
//            rows an expert sees in a decode step at small batches: the mixture of experts'
//            decode, worker_service/model/llama.cc MoeMlp, apart from the routing).
// impl:0 the f32 baseline, impl:1 the integer path (activations quantized to int8), impl:2 the
// dequantized-tile path (QuantizedLinear's prefill path, forced at every row count). The rows
// from 8 up measure where QuantizedLinear switches from the one to the other. The weights are
// random blocks (random bytes, scales of a weight's size): the speed does not depend on values.
// The summary gives ms per pass, the quantized bytes read per second and the speed-up over f32.
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/summary_reporter.h"
#include "benchmark/benchmark.h"
#include "common/half.h"
#include "kernels/cpu/packed_linear.h"
#include "kernels/cpu/quant_gemv.h"
#include "kernels/cpu/quantized_linear.h"
#include "kernels/cpu/thread_pool.h"

namespace llm {
namespace {

using cpu::QuantType;

struct Shape {
  int64_t n, k;
};

constexpr int kShapes = 3;
const char* kShapeNames[kShapes] = {"SmolLM2-135M step", "Llama-3.2-1B, 2 layers",
                                    "Qwen3-30B-A3B, one token's 8 experts in 2 layers"};

std::vector<Shape> StepShapes(int shape) {
  std::vector<Shape> shapes;
  if (shape == 0) {
    for (int layer = 0; layer < 30; ++layer) {
      shapes.insert(shapes.end(), {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}});
    }
    shapes.push_back({49152, 576});
  } else if (shape == 1) {
    for (int layer = 0; layer < 2; ++layer) {
      shapes.insert(shapes.end(), {{3072, 2048}, {2048, 2048}, {16384, 2048}, {2048, 8192}});
    }
  } else {
    for (int expert = 0; expert < 2 * 8; ++expert) {
      shapes.insert(shapes.end(), {{1536, 2048}, {2048, 768}});
    }
  }
  return shapes;
}

constexpr QuantType kTypes[] = {QuantType::kQ4_0, QuantType::kQ4_1, QuantType::kQ5_0,
                                QuantType::kQ8_0, QuantType::kQ4_K, QuantType::kQ5_K,
                                QuantType::kQ6_K};

std::vector<uint8_t> RandomBlocks(QuantType type, int64_t rows, int64_t k, std::mt19937& rng) {
  std::vector<uint8_t> b(static_cast<size_t>(rows * cpu::QuantRowBytes(type, k)));
  for (uint8_t& v : b) v = static_cast<uint8_t>(rng());
  const int64_t bytes = cpu::QuantBlockBytes(type);
  const int d_at = type == QuantType::kQ6_K ? 208 : 0;
  const bool two = type == QuantType::kQ4_1 || type == QuantType::kQ4_K || type == QuantType::kQ5_K;
  const uint16_t h = FloatToHalf(0.004f);
  for (size_t at = 0; at < b.size(); at += bytes) {
    std::memcpy(&b[at + d_at], &h, 2);
    if (two) std::memcpy(&b[at + 2], &h, 2);
  }
  return b;
}

// The quantized matrices of a shape and type, and their f32 copies packed for oneDNN (made once
// per shape: the baseline's speed does not depend on the type).
struct Matrices {
  std::vector<std::unique_ptr<cpu::QuantizedLinear>> quant;
  size_t quant_bytes = 0;
};
struct Baseline {
  std::vector<std::unique_ptr<cpu::PackedLinear>> f32;
  size_t f32_bytes = 0;
};

const Matrices& GetQuant(int shape, QuantType type) {
  static std::map<std::pair<int, int>, std::unique_ptr<Matrices>> cache;
  auto& slot = cache[{shape, static_cast<int>(type)}];
  if (slot == nullptr) {
    slot = std::make_unique<Matrices>();
    std::mt19937 rng(7);
    for (const Shape& s : StepShapes(shape)) {
      std::vector<cpu::QuantizedLinear::Part> parts;
      parts.push_back({type, s.n, RandomBlocks(type, s.n, s.k, rng)});
      std::unique_ptr<cpu::QuantizedLinear> q;
      if (!cpu::QuantizedLinear::Create(s.k, std::move(parts), {}, &q).ok()) std::exit(1);
      slot->quant_bytes += q->bytes();
      slot->quant.push_back(std::move(q));
    }
  }
  return *slot;
}

const Baseline& GetBaseline(int shape) {
  static std::unique_ptr<Baseline> cache[kShapes];
  if (cache[shape] == nullptr) {
    cache[shape] = std::make_unique<Baseline>();
    std::mt19937 rng(7);
    for (const Shape& s : StepShapes(shape)) {
      const std::vector<uint8_t> b = RandomBlocks(QuantType::kQ8_0, s.n, s.k, rng);
      HostTensor t(DType::kF32, {s.n, s.k});
      cpu::DequantizeRows(QuantType::kQ8_0, b.data(), cpu::QuantRowBytes(QuantType::kQ8_0, s.k),
                          s.n, s.k, t.data<float>());
      std::unique_ptr<cpu::PackedLinear> p;
      if (!cpu::PackedLinear::Create(t.view(), {}, DType::kF32, &p).ok()) std::exit(1);
      cache[shape]->f32_bytes += static_cast<size_t>(s.n * s.k * 4);
      cache[shape]->f32.push_back(std::move(p));
    }
  }
  return *cache[shape];
}

void BM_Gemms(benchmark::State& state) {
  const int shape = static_cast<int>(state.range(0));
  const QuantType type = kTypes[state.range(1)];
  const int impl = static_cast<int>(state.range(2));
  const int64_t rows = state.range(3);
  cpu::EnterThreadPool();
  const std::vector<Shape> shapes = StepShapes(shape);
  HostTensor x(DType::kF32, {rows, 8192}), out(DType::kF32, {rows, 49152});
  for (int64_t i = 0; i < rows * 8192; ++i) x.data<float>()[i] = 0.01f * static_cast<float>(i % 97);
  const Baseline* base = impl == 0 ? &GetBaseline(shape) : nullptr;
  const Matrices* quant = impl == 0 ? nullptr : &GetQuant(shape, type);
  if (quant != nullptr) {
    for (const auto& q : quant->quant) {
      q->set_dequant_min_rows(impl == 1 ? 1 << 30 : 0);
      q->Reserve(rows);
    }
  }
  for (auto _ : state) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const TensorView xv =
          TensorView::Contiguous(x.data<float>(), DType::kF32, {rows, shapes[i].k});
      const TensorView ov =
          TensorView::Contiguous(out.data<float>(), DType::kF32, {rows, shapes[i].n});
      const ops::OpStatus s =
          impl == 0 ? base->f32[i]->Forward(ov, xv) : quant->quant[i]->Forward(ov, xv);
      if (!s.ok()) {
        state.SkipWithError(s.message.c_str());
        return;
      }
    }
    benchmark::DoNotOptimize(out.data<float>()[0]);
  }
  state.SetLabel(impl == 0 ? base->f32[0]->ImplementationName(rows)
                           : quant->quant[0]->ImplementationName(rows));
  if (quant != nullptr) {
    for (const auto& q : quant->quant)
      q->set_dequant_min_rows(cpu::QuantizedLinear::kDequantMinRows);
  }
}

constexpr int kDecodeRows[] = {1, 2, 4, 8};
constexpr int kCrossoverRows[] = {8, 16, 32, 64, 128};

bool TypeFits(int shape, QuantType type) { return shape > 0 || cpu::QuantBlockElems(type) == 32; }

void Add(int shape, int type, int impl, int rows) {
  benchmark::RegisterBenchmark("BM_Gemms", BM_Gemms)
      ->Args({shape, type, impl, rows})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

void Register() {
  for (int shape = 0; shape < kShapes; ++shape) {
    for (int rows : kDecodeRows) {
      if (shape == 2 && rows > 2) continue;
      Add(shape, 0, 0, rows);
      for (int t = 0; t < 7; ++t) {
        if (TypeFits(shape, kTypes[t])) Add(shape, t, 1, rows);
      }
    }
    // The crossover: the served default's type (Q4_1) on SmolLM2, Q4_K on the 1B shape.
    if (shape == 2) continue;
    const int t = shape == 0 ? 1 : 4;
    for (int rows : kCrossoverRows) {
      if (rows != 8) Add(shape, 0, 0, rows);
      if (rows != 8) Add(shape, t, 1, rows);
      Add(shape, t, 2, rows);
    }
  }
}

std::string Name(int shape, int type, int impl, int rows) {
  return "BM_Gemms/" + std::to_string(shape) + "/" + std::to_string(type) + "/" +
         std::to_string(impl) + "/" + std::to_string(rows);
}

void PrintSummary(const SummaryReporter& r) {
  std::printf("\n%d threads, AVX2 kernels: %s\n", cpu::ThreadPoolSize(),
              cpu::QuantKernelsUseAvx2() ? "yes" : "no");
  for (int shape = 0; shape < kShapes; ++shape) {
    double f32_mb = 0;
    for (const Shape& s : StepShapes(shape)) f32_mb += s.n * s.k * 4 / 1e6;
    std::printf("\n%s: f32 weights %.1f MB (oneDNN, the dequantized path)\n", kShapeNames[shape],
                f32_mb);
    std::printf("%-6s %-5s %10s %10s %12s %10s\n", "type", "rows", "MB", "ms", "GB/s read",
                "vs f32");
    for (int rows : {1, 2, 4, 8, 16, 32, 64, 128}) {
      const double base = r.seconds(Name(shape, 0, 0, rows));
      if (base > 0) {
        std::printf("%-6s %-5d %10.1f %10.3f %12.1f %10s\n", "f32", rows, f32_mb, base * 1e3,
                    f32_mb / 1e3 / base, "1.00x");
      }
      for (int t = 0; t < 7; ++t) {
        for (int impl = 1; impl <= 2; ++impl) {
          const double s = r.seconds(Name(shape, t, impl, rows));
          if (s <= 0 || base <= 0) continue;
          const double mb = GetQuant(shape, kTypes[t]).quant_bytes / 1e6;
          std::printf("%-6s %-5d %10.1f %10.3f %12.1f %9.2fx%s\n",
                      std::string(cpu::QuantTypeName(kTypes[t])).c_str(), rows, mb, s * 1e3,
                      mb / 1e3 / s, base / s, impl == 2 ? "  (dequantized tiles)" : "");
        }
      }
    }
  }
}

}  // namespace
}  // namespace llm

int main(int argc, char** argv) {
  llm::cpu::ReexecWithOpenMpSettings(argv);
  llm::Register();
  llm::SummaryReporter reporter;
  return llm::RunBenchmarksWithSummary(argc, argv, reporter, llm::PrintSummary);
}
