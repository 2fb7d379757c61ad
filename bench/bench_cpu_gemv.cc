// bench_cpu_gemv: the GEMMs of one SmolLM2-135M decode step (30 layers of qkv 960x576, o
// 576x576, gate_up 3072x576 and down 576x1536, then the 49152x576 LM head: 0.27 GB of bf16
// weights, so each pass reads them from memory) at 1, 2 and 4 rows, two ways in one process:
//   impl:0  oneDNN on the packed bf16 weights (PackedLinear with SetCodedWeights(false)), the
//           baseline;
//   impl:1  the same weights coded in 12 bits (kernels/cpu/coded_gemv.h), through PackedLinear.
// The weights are normal (sigma 0.04, as trained weights' scale), rounded to bf16. The summary
// gives ms per pass, the weight bytes read per second and the speed-up over the baseline.
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/summary_reporter.h"
#include "benchmark/benchmark.h"
#include "common/half.h"
#include "kernels/cpu/coded_gemv.h"
#include "kernels/cpu/packed_linear.h"
#include "kernels/cpu/thread_pool.h"

namespace llm {
namespace {

struct Shape {
  int64_t n, k;
};

std::vector<Shape> StepShapes() {
  std::vector<Shape> shapes;
  for (int layer = 0; layer < 30; ++layer) {
    shapes.insert(shapes.end(), {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}});
  }
  shapes.push_back({49152, 576});
  return shapes;
}

// [impl][matrix], made once: both impls over the same weights.
struct Weights {
  std::vector<std::unique_ptr<cpu::PackedLinear>> by_impl[2];
  size_t bf16_bytes = 0, coded_bytes = 0;
  int64_t exceptions = 0;
};

const Weights& GetWeights() {
  static const Weights* weights = [] {
    auto* w = new Weights();
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 0.04f);
    for (const Shape& s : StepShapes()) {
      HostTensor t(DType::kF32, {s.n, s.k});
      for (int64_t i = 0; i < s.n * s.k; ++i) t.data<float>()[i] = normal(rng);
      for (int impl = 0; impl < 2; ++impl) {
        cpu::SetCodedWeights(impl == 1);
        std::unique_ptr<cpu::PackedLinear> p;
        if (!cpu::PackedLinear::Create(t.view(), {}, DType::kBF16, &p).ok() ||
            !p->Reserve(cpu::CodedBf16Matrix::kMaxRows).ok()) {
          std::fprintf(stderr, "bench_cpu_gemv: packing %lldx%lld failed\n",
                       static_cast<long long>(s.n), static_cast<long long>(s.k));
          std::exit(1);
        }
        w->by_impl[impl].push_back(std::move(p));
      }
      w->bf16_bytes += static_cast<size_t>(s.n * s.k * 2);
      // Code once more to count the coded bytes and exceptions (the PackedLinear hides them).
      std::vector<uint16_t> bits(static_cast<size_t>(s.n * s.k));
      for (int64_t i = 0; i < s.n * s.k; ++i) bits[i] = FloatToBf16(t.data<float>()[i]);
      std::unique_ptr<cpu::CodedBf16Matrix> c = cpu::CodedBf16Matrix::Create(bits.data(), s.n, s.k);
      if (c != nullptr) w->coded_bytes += c->bytes(), w->exceptions += c->num_exceptions();
    }
    cpu::SetCodedWeights(true);
    return w;
  }();
  return *weights;
}

void BM_DecodeGemms(benchmark::State& state) {
  const int impl = static_cast<int>(state.range(0));
  const int64_t rows = state.range(1);
  if (impl == 1 && !cpu::CodedGemvSupported()) {
    state.SkipWithError("this CPU lacks AVX512_BF16 or AVX512_VBMI");
    return;
  }
  cpu::EnterThreadPool();
  const Weights& w = GetWeights();
  const std::vector<Shape> shapes = StepShapes();
  HostTensor x(DType::kF32, {rows, 1536}), out(DType::kF32, {rows, 49152});
  for (int64_t i = 0; i < rows * 1536; ++i) x.data<float>()[i] = 0.01f * static_cast<float>(i % 97);
  for (auto _ : state) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const TensorView xv =
          TensorView::Contiguous(x.data<float>(), DType::kF32, {rows, shapes[i].k});
      const TensorView ov =
          TensorView::Contiguous(out.data<float>(), DType::kF32, {rows, shapes[i].n});
      if (!w.by_impl[impl][i]->Forward(ov, xv).ok()) {
        state.SkipWithError("Forward failed");
        return;
      }
    }
    benchmark::DoNotOptimize(out.data<float>()[0]);
  }
  state.SetLabel(w.by_impl[impl][0]->ImplementationName(rows));
}
BENCHMARK(BM_DecodeGemms)
    ->ArgNames({"impl", "rows"})
    ->ArgsProduct({{0, 1}, {1, 2, 4}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void PrintSummary(const SummaryReporter& r) {
  const Weights& w = GetWeights();
  std::printf(
      "\nSmolLM2-135M decode GEMMs, %d threads: %.1f MB of bf16 weights; coded %.1f MB "
      "(%.1f%%), %lld exceptions (%.4f%% of the weights)\n",
      cpu::ThreadPoolSize(), w.bf16_bytes / 1e6, w.coded_bytes / 1e6,
      100.0 * w.coded_bytes / w.bf16_bytes, static_cast<long long>(w.exceptions),
      100.0 * w.exceptions / (w.bf16_bytes / 2.0));
  std::printf("%-5s %16s %16s %18s %10s\n", "rows", "oneDNN (ms)", "coded (ms)", "coded GB/s read",
              "speed-up");
  for (int rows : {1, 2, 4}) {
    const std::string suffix = "/rows:" + std::to_string(rows);
    const double base = r.seconds("BM_DecodeGemms/impl:0" + suffix);
    const double coded = r.seconds("BM_DecodeGemms/impl:1" + suffix);
    if (base <= 0 || coded <= 0) continue;
    std::printf("%-5d %8.3f (%4.1f GB/s) %8.3f %18.1f %9.2fx\n", rows, base * 1e3,
                w.bf16_bytes / base / 1e9, coded * 1e3, w.coded_bytes / coded / 1e9, base / coded);
  }
}

}  // namespace
}  // namespace llm

int main(int argc, char** argv) {
  llm::cpu::ReexecWithOpenMpSettings(argv);
  llm::SummaryReporter reporter;
  return llm::RunBenchmarksWithSummary(argc, argv, reporter, llm::PrintSummary);
}
