// Softcap on the CPU: x[...] = cap * tanh(x[...] / cap), in place (Gemma 2's final logit
// soft-capping, over f32 logits [T, vocab]). On AVX2 + FMA CPUs through Tanh256 (Cephes' tanhf,
// relative error about 2.5e-7; the last partial register masked), else std::tanh. Chunks run on
// the OpenMP pool when there are enough elements.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/avx2_math.h"
#include "kernels/cpu/cpu_ops.h"

namespace llm::ops::cpu {
namespace {

constexpr int64_t kMinParallelElements = int64_t{1} << 15;
constexpr int64_t kChunk = int64_t{1} << 13;  // a multiple of 8: chunks split no register

void ChunkPortable(float* p, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) p[i] = cap * std::tanh(p[i] / cap);
}

LLM_AVX2 void ChunkAvx2(float* p, int64_t n, float cap) {
  const __m256 c = _mm256_set1_ps(cap);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = LoadFirst(p + i, n - i);
    StoreFirst(p + i, n - i, _mm256_mul_ps(c, Tanh256(_mm256_div_ps(v, c))));
  }
}

}  // namespace

OpStatus Softcap(const TensorView& x, float cap) {
  const int64_t n = x.numel();
  float* p = x.data_as<float>();
  const bool avx2 = HasAvx2Fma();
  const int64_t num_chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t c = 0; c < num_chunks; ++c) {
    const int64_t begin = c * kChunk, len = std::min(n, begin + kChunk) - begin;
    if (avx2) {
      ChunkAvx2(p + begin, len, cap);
    } else {
      ChunkPortable(p + begin, len, cap);
    }
  }
  return OpStatus::Ok();
}

}  // namespace llm::ops::cpu
