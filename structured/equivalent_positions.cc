#include "structured/equivalent_positions.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <tuple>

#include "absl/container/flat_hash_map.h"

namespace llm::structured {
namespace {

// The longest chain of calls of nullable rules within a rule (edges taken without a byte), or
// -1 when such calls can loop.
int32_t LongestNullableCallChain(const GrammarAutomaton& a) {
  const int32_t n = a.num_positions();
  std::vector<int32_t> longest(n, -2);  // -2 not visited, -3 on the stack
  bool loops = false;
  std::function<int32_t(int32_t)> visit = [&](int32_t p) -> int32_t {
    if (longest[p] == -3) {
      loops = true;
      return 0;
    }
    if (longest[p] >= 0) return longest[p];
    longest[p] = -3;
    int32_t best = 0;
    for (const auto& e : a.rule_edges(p)) {
      if (a.nullable(e.rule)) best = std::max(best, 1 + visit(e.target));
    }
    return longest[p] = best;
  };
  int32_t chain = 0;
  for (int32_t p = 0; p < n && !loops; ++p) chain = std::max(chain, visit(p));
  return loops ? -1 : chain;
}

}  // namespace

std::vector<int32_t> EquivalentPositions(const GrammarAutomaton& a, int32_t horizon) {
  const int32_t n = a.num_positions();
  std::vector<int32_t> classes(n);
  const int32_t chain = LongestNullableCallChain(a);
  if (chain < 0) {
    std::iota(classes.begin(), classes.end(), 0);
    return classes;
  }
  // A walk of `horizon` bytes and the closure after it take at most this many edges of the rule.
  const int64_t rounds = (int64_t{horizon} + 1) * (chain + 1) + 1;
  std::fill(classes.begin(), classes.end(), 0);
  int32_t num_classes = 1;
  std::vector<int32_t> next(n);
  std::vector<uint64_t> key;
  std::vector<std::tuple<int32_t, uint64_t, uint64_t, uint64_t, uint64_t>> bytes;
  std::vector<std::pair<int32_t, int32_t>> calls;
  for (int64_t round = 0; round < rounds; ++round) {
    absl::flat_hash_map<std::vector<uint64_t>, int32_t> ids;
    for (int32_t p = 0; p < n; ++p) {
      bytes.clear();
      for (const auto& e : a.byte_edges(p)) {
        bytes.emplace_back(classes[e.target], e.bytes.word(0), e.bytes.word(1), e.bytes.word(2),
                           e.bytes.word(3));
      }
      calls.clear();
      for (const auto& e : a.rule_edges(p)) calls.emplace_back(e.rule, classes[e.target]);
      std::sort(bytes.begin(), bytes.end());
      std::sort(calls.begin(), calls.end());
      key.assign({a.accepting(p) ? 1u : 0u, bytes.size()});
      for (const auto& [target, w0, w1, w2, w3] : bytes) {
        key.insert(key.end(), {static_cast<uint64_t>(target), w0, w1, w2, w3});
      }
      for (const auto& [rule, target] : calls) {
        key.push_back((static_cast<uint64_t>(rule) << 32) | static_cast<uint32_t>(target));
      }
      next[p] = ids.try_emplace(key, static_cast<int32_t>(ids.size())).first->second;
    }
    classes.swap(next);
    // Refinement only splits classes: as many classes as before is the same partition, stable.
    if (static_cast<int32_t>(ids.size()) == num_classes) break;
    num_classes = static_cast<int32_t>(ids.size());
  }
  return classes;
}

}  // namespace llm::structured
