#include "worker_service/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "kernels/philox.h"

namespace llm {
namespace {

// log_softmax of a row, in double.
std::vector<double> LogSoftmax(std::span<const float> row) {
  const double mx = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (float x : row) sum += std::exp(static_cast<double>(x) - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(row.size());
  for (size_t i = 0; i < row.size(); ++i) out[i] = row[i] - lse;
  return out;
}

// The temperature-scaled logits (-0 made +0, so that equal values compare equal as bits too)
// and their maximum.
float Scale(const SamplingParams& p, std::span<const float> row, std::vector<float>* s) {
  const float t = static_cast<float>(p.temperature);
  s->resize(row.size());
  float m = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < row.size(); ++i) {
    (*s)[i] = row[i] / t + 0.0f;
    m = std::max(m, (*s)[i]);
  }
  return m;
}

std::vector<TokenId> Kept(const SamplingParams& p, const std::vector<float>& s, float m) {
  const float log_min_p = Sampler::LogMinP(p);
  std::vector<TokenId> kept;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] - m >= log_min_p) kept.push_back(static_cast<TokenId>(i));
  }
  const bool top_k = p.top_k > 0 && p.top_k < static_cast<int>(kept.size());
  const bool top_p = p.top_p < 1.0;
  if (!top_k && !top_p) return kept;
  // Most likely first: s descending, then token id ascending.
  auto more_likely = [&](TokenId a, TokenId b) { return s[a] > s[b] || (s[a] == s[b] && a < b); };
  if (top_k) {
    std::partial_sort(kept.begin(), kept.begin() + p.top_k, kept.end(), more_likely);
    kept.resize(p.top_k);
  } else {
    std::sort(kept.begin(), kept.end(), more_likely);
  }
  if (top_p) {
    uint64_t total = 0;
    for (TokenId t : kept) total += philox::MassFixed(s[t] - m);
    const uint64_t target = philox::TopPTarget(p.top_p, total);
    uint64_t cum = 0;
    size_t n = 0;
    while (n < kept.size()) {
      cum += philox::MassFixed(s[kept[n++]] - m);
      if (cum >= target) break;
    }
    kept.resize(n);
  }
  return kept;
}

// The exponential race (philox::RaceScore) over `kept`, exactly: most tokens are ruled out by
// philox::RaceBound against the best score so far (starting from the most likely token's), without
// their logarithms. -1 when `kept` is empty.
TokenId Race(const std::vector<float>& s, const std::vector<TokenId>& kept, uint64_t key,
             uint64_t k) {
  if (kept.empty()) return -1;
  TokenId token = kept[0];
  for (TokenId t : kept) {
    if (s[t] > s[token] || (s[t] == s[token] && t < token)) token = t;
  }
  double best = philox::RaceScore(s[token], philox::DrawBits(key, k, token));
  uint32_t group = 0xffffffffu;
  philox::U32x4 bits4{};
  for (TokenId t : kept) {
    if (static_cast<double>(s[t]) + philox::kMaxRaceBound < best) continue;
    if (static_cast<uint32_t>(t) >> 2 != group) {
      group = static_cast<uint32_t>(t) >> 2;
      bits4 = philox::DrawBits4(key, k, group);
    }
    const uint32_t bits = bits4.v[t & 3];
    if (static_cast<double>(s[t]) + philox::RaceBound(bits) < best) continue;
    const double score = philox::RaceScore(s[t], bits);
    if (score > best || (score == best && t < token)) {
      token = t;
      best = score;
    }
  }
  return token;
}

}  // namespace

SampleRow SampleRowOf(BatchState& batch, int32_t slot, int seq_index) {
  const BatchState::Request& req = *batch.FindRequest(slot);
  return {.params = &req.params,
          .prompt_tokens = req.prompt_token_set,
          .key = philox::SequenceKey(req.seed, seq_index),
          .state = batch.MutableSamplingState(slot, seq_index)};
}

void Sampler::ApplyLogitBias(const SamplingParams& p, std::span<float> row) {
  const int vocab = static_cast<int>(row.size());
  for (const auto& [t, bias] : p.logit_bias) {
    if (t >= 0 && t < vocab) row[t] += bias;
  }
}

void Sampler::ApplyPenalties(const SampleRow& r, std::span<float> row) {
  const SamplingParams& p = *r.params;
  if (!p.has_penalties()) return;
  const absl::flat_hash_map<TokenId, int>& counts = r.state->output_counts;
  const int vocab = static_cast<int>(row.size());
  const float rp = static_cast<float>(p.repetition_penalty);
  const bool repetition = p.repetition_penalty != 1.0;
  if (repetition) {
    for (TokenId t : r.prompt_tokens) {
      if (t < 0 || t >= vocab || counts.contains(t)) continue;
      row[t] = philox::Penalize(row[t], true, 0, rp, 0, 0);
    }
  }
  for (const auto& [t, count] : counts) {
    if (t < 0 || t >= vocab) continue;
    row[t] =
        philox::Penalize(row[t], repetition, count, rp, p.frequency_penalty, p.presence_penalty);
  }
}

bool Sampler::IsGreedy(const SamplingParams& p) { return p.temperature < kGreedyBelow; }

float Sampler::LogMinP(const SamplingParams& p) {
  return p.min_p > 0 ? std::log(static_cast<float>(p.min_p))
                     : -std::numeric_limits<float>::infinity();
}

std::vector<TokenId> Sampler::KeptTokens(const SamplingParams& p, std::span<const float> row) {
  std::vector<float> s;
  const float m = Scale(p, row, &s);
  return Kept(p, s, m);
}

std::vector<double> Sampler::FilteredProbs(const SamplingParams& p, std::span<const float> row) {
  std::vector<float> s;
  const float m = Scale(p, row, &s);
  std::vector<double> probs(row.size());
  double sum = 0;
  for (size_t i = 0; i < row.size(); ++i) sum += probs[i] = std::exp(double{s[i]} - m);
  std::vector<double> filtered(row.size(), 0.0);
  for (TokenId t : Kept(p, s, m)) filtered[t] = probs[t] / sum;
  return filtered;
}

void Sampler::ApplyAllowed(const uint32_t* allowed, std::span<float> logits) {
  const size_t n = logits.size();
  for (size_t w = 0; w * 32 < n; ++w) {
    const uint32_t bits = allowed[w];
    if (bits == ~uint32_t{0}) continue;
    const size_t end = std::min(n, w * 32 + 32);
    for (size_t i = w * 32; i < end; ++i) {
      if (((bits >> (i % 32)) & 1u) == 0) logits[i] = -std::numeric_limits<float>::infinity();
    }
  }
}

std::vector<SampledToken> Sampler::Sample(std::span<float> logits, int vocab_size,
                                          std::span<const SampleRow> rows) {
  std::vector<SampledToken> out(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    const SampleRow& seq = rows[r];
    const SamplingParams& p = *seq.params;
    std::span<float> row = logits.subspan(r * vocab_size, vocab_size);
    std::vector<double> raw_logprobs;
    if (p.logprobs.has_value()) raw_logprobs = LogSoftmax(row);
    ApplyLogitBias(p, row);
    if (seq.allowed != nullptr) ApplyAllowed(seq.allowed, row);
    ApplyPenalties(seq, row);
    // The argmax: greedy's token, and the fallback should nothing survive the filters (logits
    // that overflow to inf when scaled).
    TokenId token = static_cast<TokenId>(std::max_element(row.begin(), row.end()) - row.begin());
    if (!IsGreedy(p)) {
      const TokenId argmax = token;
      std::vector<float> s;
      const float m = Scale(p, row, &s);
      token = Race(s, Kept(p, s, m), seq.key, seq.state->num_samples);
      if (token < 0) token = argmax;
    }
    out[r].token = token;
    if (p.logprobs.has_value()) {
      out[r].logprob = static_cast<float>(raw_logprobs[token]);
      const int n = std::min(*p.logprobs, vocab_size);
      std::vector<int> idx(vocab_size);
      std::iota(idx.begin(), idx.end(), 0);
      std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int a, int b) {
        return raw_logprobs[a] > raw_logprobs[b] || (raw_logprobs[a] == raw_logprobs[b] && a < b);
      });
      for (int i = 0; i < n; ++i) {
        out[r].top_logprobs.push_back({idx[i], static_cast<float>(raw_logprobs[idx[i]])});
      }
    }
  }
  return out;
}

}  // namespace llm
