// Stop strings over text that arrives in pieces, independent of any tokenizer.
#include "scheduler_service/tokenizer/stop_string_matcher.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace llm {
namespace {

// Feeds `pieces` one by one; returns everything released and whether it stopped.
struct Released {
  std::string text;
  bool stopped = false;
  std::string stop_string;
};
Released Feed(StopStringMatcher& m, const std::vector<std::string>& pieces) {
  Released run;
  for (const auto& p : pieces) {
    auto r = m.Feed(p);
    run.text += r.text;
    if (r.stopped) {
      run.stopped = true;
      run.stop_string = r.stop_string;
    }
  }
  return run;
}

TEST(StopStringMatcherTest, StopSplitAcrossPiecesIsCaughtAndExcluded) {
  StopStringMatcher m({"STOP"}, false);
  const Released run = Feed(m, {"abc S", "T", "OP tail", "more"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.stop_string, "STOP");
  EXPECT_EQ(run.text, "abc ");
  EXPECT_EQ(m.Finish(), "");
}

TEST(StopStringMatcherTest, IncludeStopStringInOutput) {
  StopStringMatcher m({"STOP"}, true);
  EXPECT_EQ(Feed(m, {"abc S", "TOP tail"}).text, "abc STOP");
}

TEST(StopStringMatcherTest, PossiblePrefixIsHeldBackUntilItCannotBeAStop) {
  StopStringMatcher m({"</end>"}, false);
  EXPECT_EQ(m.Feed("value </").text, "value ");  // "</" might start "</end>"
  EXPECT_EQ(m.Feed("en").text, "");
  EXPECT_EQ(m.Feed("try>").text, "</entry>");  // it did not
  EXPECT_EQ(m.Feed("x </e").text, "x ");
  EXPECT_EQ(m.Finish(), "</e");  // the sequence ended for another reason
}

TEST(StopStringMatcherTest, EarliestOfSeveralStopStringsWins) {
  StopStringMatcher m({"world", "lo w", ""}, false);
  const Released run = Feed(m, {"hello world"});
  EXPECT_EQ(run.stop_string, "lo w");
  EXPECT_EQ(run.text, "hel");
}

TEST(StopStringMatcherTest, NothingAfterAStop) {
  StopStringMatcher m({"\n\n"}, false);
  EXPECT_EQ(Feed(m, {"line\n", "\nnext"}).text, "line");
  EXPECT_EQ(m.Feed("later").text, "");
  EXPECT_FALSE(m.Feed("later").stopped);
}

// A stop string made of the last bytes of a character must not cut the character.
TEST(StopStringMatcherTest, InvalidUtf8StopStringNeverSplitsACharacter) {
  StopStringMatcher m({"\xBD\xA0!"}, false);
  const auto r = m.Feed("ok \xE4\xBD\xA0");  // "ok 你"
  EXPECT_EQ(r.text, "ok \xE4\xBD\xA0");
  EXPECT_FALSE(r.stopped);
}

TEST(StopStringMatcherTest, NoStopStringsReleasesEverything) {
  StopStringMatcher m({}, false);
  EXPECT_EQ(m.Feed("abc").text, "abc");
  EXPECT_EQ(m.Finish(), "");
}

}  // namespace
}  // namespace llm
