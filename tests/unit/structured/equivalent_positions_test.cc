// EquivalentPositions: the copies of a bounded repetition merge past the horizon and not before,
// and compiled masks stay those of the brute force where they do (grammar_matcher_test).
#include "structured/equivalent_positions.h"

#include <set>
#include <string>

#include "gtest/gtest.h"
#include "structured/gbnf_parser.h"

namespace llm::structured {
namespace {

int32_t NumClassesWithByteEdges(const GrammarAutomaton& a, const std::vector<int32_t>& classes) {
  std::set<int32_t> distinct;
  for (int32_t p = 0; p < a.num_positions(); ++p) {
    if (a.reachable(p) && !a.byte_edges(p).empty()) distinct.insert(classes[p]);
  }
  return static_cast<int32_t>(distinct.size());
}

TEST(EquivalentPositionsTest, RepetitionCopiesMergePastTheHorizon) {
  // "x" then up to 50 letters then "y": the copy with k letters left sees k + 1 bytes ahead.
  absl::StatusOr<Grammar> g = ParseGbnf(R"(root ::= "x" [a-z]{0,50} "y")");
  ASSERT_TRUE(g.ok());
  absl::StatusOr<GrammarAutomaton> a = GrammarAutomaton::Build(*g);
  ASSERT_TRUE(a.ok());
  const int32_t all = NumClassesWithByteEdges(*a, EquivalentPositions(*a, 1000));
  EXPECT_EQ(all, 52);  // "x", 50 letter positions (the last takes only "y"), "y"
  // With a horizon of 3 bytes only "x", the last 3 letter copies and the rest tell apart.
  const int32_t merged = NumClassesWithByteEdges(*a, EquivalentPositions(*a, 3));
  EXPECT_LT(merged, 10);
  EXPECT_GE(merged, 5);
}

// A loop of calls that may match nothing has no bound on the edges a walk takes: no merging.
TEST(EquivalentPositionsTest, LoopsOfNullableCallsMergeNothing) {
  absl::StatusOr<Grammar> g =
      ParseGbnf("root ::= \"x\" (opt \"a\"?)* [a-z]{0,20} \"y\"\nopt ::= \"b\"? (root \"c\")?");
  ASSERT_TRUE(g.ok()) << g.status();
  absl::StatusOr<GrammarAutomaton> a = GrammarAutomaton::Build(*g);
  ASSERT_TRUE(a.ok()) << a.status();
  const std::vector<int32_t> classes = EquivalentPositions(*a, 2);
  for (int32_t p = 0; p < a->num_positions(); ++p) EXPECT_EQ(classes[p], p);
}

}  // namespace
}  // namespace llm::structured
