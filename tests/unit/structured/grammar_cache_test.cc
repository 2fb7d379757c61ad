// GrammarCache: one compilation per distinct spec, errors not cached, eviction, and concurrent
// callers getting one grammar.
#include "structured/grammar_cache.h"

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/structured/test_util.h"

namespace llm::structured {
namespace {

TEST(GrammarCacheTest, CompilesEachSpecOnce) {
  GrammarCache cache(testing::ByteVocab());
  const GrammarSpec a{GrammarKind::kRegex, "[0-9]+"};
  const GrammarSpec b{GrammarKind::kGrammar, "root ::= [0-9]+"};
  auto a1 = cache.Get(a);
  auto a2 = cache.Get(a);
  auto b1 = cache.Get(b);
  ASSERT_TRUE(a1.ok() && a2.ok() && b1.ok());
  EXPECT_EQ(a1->get(), a2->get());
  EXPECT_NE(a1->get(), b1->get());  // same language, another kind: another entry
  EXPECT_EQ(cache.num_compiled(), 2);
  // Choices differ by their split, not only their concatenation.
  auto c1 = cache.Get({GrammarKind::kChoice, "", {"ab", "c"}});
  auto c2 = cache.Get({GrammarKind::kChoice, "", {"a", "bc"}});
  ASSERT_TRUE(c1.ok() && c2.ok());
  EXPECT_NE(c1->get(), c2->get());
  EXPECT_TRUE(testing::Matches(*c1, "ab"));
  EXPECT_FALSE(testing::Matches(*c2, "ab"));
  // The whitespace option is part of the key.
  GrammarSpec compact{GrammarKind::kJsonObject};
  compact.json_options.whitespace = JsonGrammarOptions::Whitespace::kCompact;
  auto j1 = cache.Get({GrammarKind::kJsonObject});
  auto j2 = cache.Get(compact);
  ASSERT_TRUE(j1.ok() && j2.ok());
  EXPECT_TRUE(testing::Matches(*j1, "{ }"));
  EXPECT_FALSE(testing::Matches(*j2, "{ }"));
}

TEST(GrammarCacheTest, ErrorsAreReturnedAndNotCached) {
  GrammarCache cache(testing::ByteVocab());
  for (int i = 0; i < 2; ++i) {
    auto g = cache.Get({GrammarKind::kJsonSchema, R"({"type": "number", "maximum": 3})"});
    ASSERT_FALSE(g.ok());
    EXPECT_THAT(std::string(g.status().message()), ::testing::HasSubstr("maximum"));
  }
  EXPECT_FALSE(cache.Get({GrammarKind::kChoice}).ok());
  EXPECT_EQ(cache.size(), 0u);
}

TEST(GrammarCacheTest, EvictsLeastRecentlyUsed) {
  GrammarCache cache(testing::ByteVocab(), /*capacity=*/2);
  auto a = *cache.Get({GrammarKind::kRegex, "a"});
  auto b = *cache.Get({GrammarKind::kRegex, "b"});
  EXPECT_EQ(cache.Get({GrammarKind::kRegex, "a"})->get(), a.get());  // a is now the newest
  auto c = *cache.Get({GrammarKind::kRegex, "c"});                   // evicts b
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.Get({GrammarKind::kRegex, "a"})->get(), a.get());
  EXPECT_NE(cache.Get({GrammarKind::kRegex, "b"})->get(), b.get());
  EXPECT_TRUE(testing::Matches(b, "b"));  // an evicted grammar lives on with its users
}

TEST(GrammarCacheTest, ConcurrentCallersShareOneGrammar) {
  GrammarCache cache(testing::ByteVocab());
  std::vector<const CompiledGrammar*> got(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto g = cache.Get({GrammarKind::kJsonObject});
      got[t] = g.ok() ? g->get() : nullptr;
      if (g.ok()) {
        GrammarMatcher m(*g);
        std::vector<uint32_t> mask(m.grammar().tokenizer().bitmask_words());
        m.FillNextTokenBitmask(mask.data());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const CompiledGrammar* g : got) EXPECT_EQ(g, got[0]);
  EXPECT_NE(got[0], nullptr);
}

}  // namespace
}  // namespace llm::structured
