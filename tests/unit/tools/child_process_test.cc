#include "tools/child_process.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace llm {
namespace {

using ::testing::HasSubstr;

TEST(ChildProcessTest, ReportsTheExitStatus) {
  absl::StatusOr<std::unique_ptr<ChildProcess>> c =
      ChildProcess::Start({.argv = {"/bin/sh", "-c", "exit 3"}});
  ASSERT_TRUE(c.ok()) << c.status();
  std::optional<int> status = (*c)->Wait(absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(ChildProcess::DescribeStatus(*status), "exited with status 3");
  EXPECT_FALSE((*c)->running());
}

TEST(ChildProcessTest, AnUnexecutableProgramFailsToStart) {
  absl::StatusOr<std::unique_ptr<ChildProcess>> c =
      ChildProcess::Start({.argv = {"/nonexistent/llm-worker"}});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("cannot execute /nonexistent"));
}

TEST(ChildProcessTest, StopEscalatesToSigkill) {
  // The child ignores SIGTERM; Stop() must still end it.
  absl::StatusOr<std::unique_ptr<ChildProcess>> c = ChildProcess::Start(
      {.argv = {"/bin/sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done"},
       .log_prefix = "[child] "});
  ASSERT_TRUE(c.ok()) << c.status();
  absl::SleepFor(absl::Milliseconds(200));  // lets the shell install its trap (not required)
  const int status = (*c)->Stop(absl::Milliseconds(300));
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(kill((*c)->pid(), 0), -1);  // reaped: the pid is gone
}

// A terminal's Ctrl-C reaches only the parent, which decides what to stop. (The parent-death
// signal is exercised end to end in tests/integration: llm-cluster is SIGKILLed there.)
TEST(ChildProcessTest, RunsInAProcessGroupOfItsOwn) {
  absl::StatusOr<std::unique_ptr<ChildProcess>> c =
      ChildProcess::Start({.argv = {"/bin/sleep", "30"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(getpgid((*c)->pid()), (*c)->pid());
  (*c)->Stop(absl::Seconds(5));
}

}  // namespace
}  // namespace llm
