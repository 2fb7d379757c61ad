#include "worker_service/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace llm {
namespace {

uint64_t SeedFor(const SamplingParams& params, int seq_index) {
  if (!params.seed.has_value())
    return std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32);
  // Sequence i of a seeded request gets its own stream; sequence 0 uses the seed as given.
  return *params.seed + 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(seq_index);
}

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

}  // namespace

SequenceSampler::SequenceSampler(const SamplingParams& params, int seq_index,
                                 std::span<const TokenId> prompt_token_ids)
    : params_(params), rng_(SeedFor(params, seq_index)) {
  if (params.repetition_penalty != 1.0) {
    prompt_tokens_.insert(prompt_token_ids.begin(), prompt_token_ids.end());
  }
}

void SequenceSampler::AddOutputToken(TokenId token) { ++output_counts_[token]; }

void Sampler::ApplyPenalties(const SequenceSampler& seq, std::span<float> row) {
  const SamplingParams& p = seq.params_;
  const int vocab = static_cast<int>(row.size());
  if (p.repetition_penalty != 1.0) {
    const float rp = static_cast<float>(p.repetition_penalty);
    auto penalize = [&](TokenId t) {
      if (t < 0 || t >= vocab) return;
      row[t] = row[t] > 0 ? row[t] / rp : row[t] * rp;
    };
    for (TokenId t : seq.prompt_tokens_) penalize(t);
    for (const auto& [t, count] : seq.output_counts_) {
      if (!seq.prompt_tokens_.contains(t)) penalize(t);
    }
  }
  if (p.frequency_penalty != 0.0 || p.presence_penalty != 0.0) {
    for (const auto& [t, count] : seq.output_counts_) {
      if (t < 0 || t >= vocab) continue;
      row[t] -= static_cast<float>(p.frequency_penalty * count + p.presence_penalty);
    }
  }
}

std::vector<double> Sampler::FilteredProbs(const SamplingParams& p, std::span<const float> row) {
  const int vocab = static_cast<int>(row.size());
  // Temperature, then softmax.
  const double inv_t = 1.0 / p.temperature;
  double mx = -std::numeric_limits<double>::infinity();
  for (float x : row) mx = std::max(mx, x * inv_t);
  std::vector<double> probs(vocab);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += probs[i] = std::exp(row[i] * inv_t - mx);
  for (double& q : probs) q /= sum;
  // min-p: relative to the most likely token (whose probability is exp(0) / sum).
  if (p.min_p > 0) {
    const double floor = p.min_p * (1.0 / sum);
    for (double& q : probs) {
      if (q < floor) q = 0;
    }
  }
  const bool top_k = p.top_k > 0 && p.top_k < vocab;
  const bool top_p = p.top_p < 1.0;
  if (!top_k && !top_p) return probs;
  // Candidates most likely first (ties by token id, so the result is deterministic).
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  auto more_likely = [&](int a, int b) {
    return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
  };
  int keep = vocab;
  if (top_k) {
    std::nth_element(order.begin(), order.begin() + p.top_k, order.end(), more_likely);
    keep = p.top_k;
  }
  std::sort(order.begin(), order.begin() + keep, more_likely);
  if (top_p) {
    double kept_mass = 0;
    for (int i = 0; i < keep; ++i) kept_mass += probs[order[i]];
    // The smallest prefix whose share of the kept mass reaches top_p (at least one token).
    double cum = 0;
    int n = 0;
    while (n < keep) {
      cum += probs[order[n++]];
      if (cum >= p.top_p * kept_mass) break;
    }
    keep = n;
  }
  std::vector<double> filtered(vocab, 0.0);
  for (int i = 0; i < keep; ++i) filtered[order[i]] = probs[order[i]];
  return filtered;
}

std::vector<SampledToken> Sampler::Sample(std::span<float> logits, int vocab_size,
                                          std::span<SequenceSampler* const> rows) {
  std::vector<SampledToken> out(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    SequenceSampler& seq = *rows[r];
    const SamplingParams& p = seq.params_;
    std::span<float> row = logits.subspan(r * vocab_size, vocab_size);
    std::vector<double> raw_logprobs;
    if (p.logprobs.has_value()) raw_logprobs = LogSoftmax(row);
    ApplyPenalties(seq, row);
    TokenId token;
    if (p.greedy()) {
      token = static_cast<TokenId>(std::max_element(row.begin(), row.end()) - row.begin());
    } else {
      const std::vector<double> probs = FilteredProbs(p, row);
      const double total = std::accumulate(probs.begin(), probs.end(), 0.0);
      const double u = std::uniform_real_distribution<double>(0.0, total)(seq.rng_);
      double cum = 0;
      token = -1;
      for (int i = 0; i < vocab_size; ++i) {
        if (probs[i] == 0) continue;
        cum += probs[i];
        token = i;  // the last possible token, should rounding leave u beyond the sum
        if (u < cum) break;
      }
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
