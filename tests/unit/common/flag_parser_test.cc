// FlagParser: --name=value fills the bound variable by its type, a bool flag may stand alone,
// --help prints every flag and exits 0, and anything unknown or malformed exits 2 naming the
// flag (the contract the binaries' "bad flags exit 2" rests on).
#include "common/flag_parser.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace llm {
namespace {

struct Flags {
  int max_num_seqs = 256;
  int64_t seed = 0;
  double swap_space = 4;
  bool enable_prefix_caching = false;
  std::string model;
};

// Parses `args` (argv[0] is added) into the returned flags.
Flags ParseArgs(std::vector<std::string> args) {
  Flags f;
  FlagParser p("usage: test [--flag=value ...]");
  p.Add("max-num-seqs", &f.max_num_seqs, "sequences per step");
  p.Add("seed", &f.seed, "the seed");
  p.Add("swap-space", &f.swap_space, "GiB");
  p.Add("enable-prefix-caching", &f.enable_prefix_caching, "reuse prefixes");
  p.Add("model", &f.model, "model directory");
  args.insert(args.begin(), "test");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  p.Parse(static_cast<int>(argv.size()), argv.data());
  return f;
}

TEST(FlagParser, FillsEachFlagByItsType) {
  const Flags f = ParseArgs({"--max-num-seqs=8", "--seed=-12345678901", "--swap-space=0.5",
                             "--enable-prefix-caching=true", "--model=/m/a=b"});
  EXPECT_EQ(f.max_num_seqs, 8);
  EXPECT_EQ(f.seed, -12345678901);
  EXPECT_DOUBLE_EQ(f.swap_space, 0.5);
  EXPECT_TRUE(f.enable_prefix_caching);
  EXPECT_EQ(f.model, "/m/a=b");  // the value is everything after the first '='
}

TEST(FlagParser, KeepsDefaultsAndTakesABareBoolAsTrue) {
  const Flags f = ParseArgs({"--enable-prefix-caching"});
  EXPECT_EQ(f.max_num_seqs, 256);
  EXPECT_DOUBLE_EQ(f.swap_space, 4);
  EXPECT_TRUE(f.enable_prefix_caching);
  EXPECT_FALSE(ParseArgs({"--enable-prefix-caching=false"}).enable_prefix_caching);
}

TEST(FlagParser, TheLastOccurrenceWins) {
  EXPECT_EQ(ParseArgs({"--max-num-seqs=8", "--max-num-seqs=16"}).max_num_seqs, 16);
}

TEST(FlagParserDeathTest, HelpPrintsEveryFlagAndExitsZero) {
  EXPECT_EXIT(ParseArgs({"--help"}), ::testing::ExitedWithCode(0), "");
  FlagParser p("usage: test");
  int n = 0;
  bool b = false;
  p.Add("max-num-seqs", &n, "sequences per step (256)");
  p.Add("enable-prefix-caching", &b, "reuse prefixes (false)");
  // tests/deploy/check_manifests.py reads the flags from these "  --name" lines.
  EXPECT_EQ(p.Usage(),
            "usage: test\n"
            "  --max-num-seqs\n      sequences per step (256)\n"
            "  --enable-prefix-caching\n      reuse prefixes (false)\n");
}

TEST(FlagParserDeathTest, BadFlagsExitTwoNamingTheFlag) {
  EXPECT_EXIT(ParseArgs({"--no-such-flag=1"}), ::testing::ExitedWithCode(2),
              "unknown flag --no-such-flag");
  EXPECT_EXIT(ParseArgs({"--max-num-seqs"}), ::testing::ExitedWithCode(2),
              "--max-num-seqs needs =value");
  EXPECT_EXIT(ParseArgs({"--max-num-seqs=many"}), ::testing::ExitedWithCode(2),
              "--max-num-seqs: cannot parse \"many\"");
  EXPECT_EXIT(ParseArgs({"--enable-prefix-caching=maybe"}), ::testing::ExitedWithCode(2),
              "--enable-prefix-caching: cannot parse");
  EXPECT_EXIT(ParseArgs({"model"}), ::testing::ExitedWithCode(2), "expected --flag=value");
}

}  // namespace
}  // namespace llm
