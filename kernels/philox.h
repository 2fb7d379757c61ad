// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator, the same bits on the host and on the device, and the sampler's draw
// built on it.
//
// The draw is the exponential race (vLLM v1's `probs / q` argmax with q ~ Exponential(1),
// equivalently Gumbel-max): token = argmax_i over the kept tokens of
//   s_i - log(q_i),  q_i = -log(u_i),
// where s_i is the token's (penalized, temperature-scaled) logit and u_i a uniform in (0, 1)
// that depends only on (sequence key, sample index k, token id i): so a sequence's k-th token
// is the same whatever shares its batch, on the host and on the device. Ties go to the lowest
// token id.
//
// Header-only; usable from .cu files under nvcc (functions are __host__ __device__ there) and
// from plain C++ (the host sampler, the CUDA emulation).
#ifndef LLM_KERNELS_PHILOX_H_
#define LLM_KERNELS_PHILOX_H_

#include <math.h>

#include <cstdint>

#ifdef __CUDACC__
#define LLM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LLM_HOST_DEVICE inline
#endif

namespace llm::philox {

struct U32x4 {
  uint32_t v[4];
};

// Philox4x32 with 10 rounds; matches Random123's philox4x32_10 (its known-answer vectors are
// in tests/unit/worker_service/sampler_test.cc).
LLM_HOST_DEVICE U32x4 Philox4x32_10(U32x4 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * ctr.v[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * ctr.v[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    ctr = U32x4{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return ctr;
}

// The sequence key: sequence i of a seeded request gets its own stream (sequence 0 uses the
// seed as given).
LLM_HOST_DEVICE uint64_t SequenceKey(uint64_t seed, int seq_index) {
  return seed + 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(seq_index);
}

// The counter of token `i` of sample `k` is (i / 4, k lo, k hi, 0); the token takes lane i % 4,
// so one Philox call serves four consecutive tokens (DrawBits4).
LLM_HOST_DEVICE U32x4 DrawBits4(uint64_t key, uint64_t k, uint32_t group) {
  return Philox4x32_10(U32x4{{group, static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32), 0u}},
                       static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
}

LLM_HOST_DEVICE uint32_t DrawBits(uint64_t key, uint64_t k, uint32_t token) {
  return DrawBits4(key, k, token >> 2).v[token & 3];
}

// A uniform in (0, 1) from 32 bits: (bits + 0.5) / 2^32, exact in double, never 0 or 1.
LLM_HOST_DEVICE double Uniform(uint32_t bits) {
  return (static_cast<double>(bits) + 0.5) * (1.0 / 4294967296.0);
}

// The race score of a token with scaled logit `s` and random bits `bits`: s - log(q),
// q = -log(u) ~ Exponential(1). The largest score wins. In double: the device's and the host's
// log differ by at most an ulp of a double, so that they pick different winners only when two
// scores agree to ~1e-16 (in float, ~1e-7 would do).
LLM_HOST_DEVICE double RaceScore(float s, uint32_t bits) {
  const double q = -log(Uniform(bits));
  return static_cast<double>(s) - log(q);
}

// An upper bound of RaceScore(s, bits) - s = -log(q) without a logarithm, so that most tokens
// of a race are ruled out cheaply: q = -log(u) >= 1 - u = (n + 0.5) / 2^32 with
// n = 2^32 - 1 - bits, >= 2^(floor(log2(n)) - 32) (2^-33 for n = 0); plus a margin for the
// rounding of the exact score. kMaxRaceBound: the bound over all bits (33 ln 2).
LLM_HOST_DEVICE double RaceBound(uint32_t bits) {
  const uint32_t n = 0xffffffffu - bits;
#ifdef __CUDA_ARCH__
  const int fl = n == 0 ? -1 : 31 - __clz(static_cast<int>(n));
#else
  const int fl = n == 0 ? -1 : 31 - __builtin_clz(n);
#endif
  return (32 - fl) * 0.6931471805599453 + 1e-9;
}
inline constexpr double kMaxRaceBound = 33 * 0.6931471805599453 + 1e-9;

// The rest of the sampler's arithmetic that the host and the device must do alike.

// top-p works on fixed-point probabilities, exp(s - max) * 2^40 rounded down (exp in double,
// so that the device and the host agree but for an ulp of a double), summed as integers: the
// sums are exact and do not depend on the order of the additions.
LLM_HOST_DEVICE uint64_t MassFixed(float s_minus_max) {
  return static_cast<uint64_t>(exp(static_cast<double>(s_minus_max)) * 1099511627776.0);
}

// The number of the top_p share of `total` (at least 1): the prefix of the kept tokens, most
// likely first, whose mass first reaches it survives top-p.
LLM_HOST_DEVICE uint64_t TopPTarget(double top_p, uint64_t total) {
  const uint64_t t = static_cast<uint64_t>(top_p * static_cast<double>(total));
  return t < 1 ? 1 : t;
}

// Penalties on one logit, in the host sampler's order and precision: repetition (when the token
// is in the prompt or the output), then frequency and presence (when in the output).
LLM_HOST_DEVICE float Penalize(float x, bool seen, int output_count, float repetition,
                               double frequency, double presence) {
  if (seen) x = x > 0 ? x / repetition : x * repetition;
  if (output_count > 0) {
    x -= static_cast<float>(frequency * output_count + presence);
  }
  return x;
}

}  // namespace llm::philox

#endif  // LLM_KERNELS_PHILOX_H_
