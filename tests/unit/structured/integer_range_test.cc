// IntegerRange against the arithmetic: every integer in a window is admitted exactly when it is
// within the bounds, and only in JSON's spelling.
#include "structured/integer_range.h"

#include <optional>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "tests/unit/structured/test_util.h"

namespace llm::structured {
namespace {

std::shared_ptr<const CompiledGrammar> Compile(std::optional<int64_t> lo,
                                               std::optional<int64_t> hi) {
  Grammar g;
  g.set_root(g.AddRule("root", IntegerRange(lo, hi)));
  return testing::CompileForBytes(g);
}

void ExpectExactly(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  auto g = Compile(lo, hi);
  ASSERT_NE(g, nullptr);
  for (int64_t n = -1100; n <= 1100; ++n) {
    const bool in = (!lo || n >= *lo) && (!hi || n <= *hi);
    ASSERT_EQ(testing::Matches(g, std::to_string(n)), in)
        << n << " in [" << (lo ? std::to_string(*lo) : "-inf") << ", "
        << (hi ? std::to_string(*hi) : "inf") << "]";
  }
  for (const char* s : {"-0", "00", "007", "+5", "", "-", "1.0", "1e2"}) {
    EXPECT_FALSE(testing::Matches(g, s)) << s;
  }
}

TEST(IntegerRangeTest, BoundedRanges) {
  for (auto [lo, hi] : std::vector<std::pair<int64_t, int64_t>>{{0, 0},
                                                                {0, 9},
                                                                {1, 10},
                                                                {15, 93},
                                                                {100, 999},
                                                                {-5, 5},
                                                                {-93, -15},
                                                                {-1000, 1000},
                                                                {7, 7},
                                                                {-1, -1},
                                                                {99, 101},
                                                                {0, 1099},
                                                                {-1099, 0}}) {
    ExpectExactly(lo, hi);
  }
}

TEST(IntegerRangeTest, HalfBoundedRanges) {
  for (int64_t b : {0, 1, -1, 18, -18, 100, 999, -1000}) {
    ExpectExactly(b, std::nullopt);
    ExpectExactly(std::nullopt, b);
  }
  auto g = Compile(100, std::nullopt);
  EXPECT_TRUE(testing::Matches(g, "123456789012345678"));
  EXPECT_FALSE(testing::Matches(g, "-123456789012345678"));
}

TEST(IntegerRangeTest, RandomRanges) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int64_t> bound(-1050, 1050);
  for (int i = 0; i < 12; ++i) {
    int64_t a = bound(rng), b = bound(rng);
    if (a > b) std::swap(a, b);
    ExpectExactly(a, b);
  }
}

TEST(IntegerRangeTest, LargeBounds) {
  auto g = Compile(-1000000000000000000, 1000000000000000000);
  EXPECT_TRUE(testing::Matches(g, "1000000000000000000"));
  EXPECT_FALSE(testing::Matches(g, "1000000000000000001"));
  EXPECT_TRUE(testing::Matches(g, "-999999999999999999"));
}

}  // namespace
}  // namespace llm::structured
