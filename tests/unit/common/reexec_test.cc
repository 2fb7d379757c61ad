#include "common/reexec.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace llm {
namespace {

// In the re-executed child (LLM_REEXEC_TEST_PROBE set), before gtest starts: writes the
// process's name, its first argument and the variable to stdout and exits.
const bool kIsProbe = [] {
  const char* probe = std::getenv("LLM_REEXEC_TEST_PROBE");
  if (probe == nullptr) return false;
  std::string comm;
  std::getline(std::ifstream("/proc/self/comm"), comm);
  std::ifstream cmdline("/proc/self/cmdline");
  std::string arg0, arg1;
  std::getline(cmdline, arg0, '\0');
  std::getline(cmdline, arg1, '\0');
  std::printf("comm=%s arg1=%s probe=%s", comm.c_str(), arg1.c_str(), probe);
  std::fflush(stdout);
  std::_Exit(0);
}();

TEST(ReexecSelfTest, StartsTheSameBinaryWithTheArgumentsAndEnvironmentKeepingItsName) {
  ASSERT_FALSE(kIsProbe);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    setenv("LLM_REEXEC_TEST_PROBE", "7", 1);
    char arg0[] = "reexec_test";
    char arg1[] = "second-argument";
    char* argv[] = {arg0, arg1, nullptr};
    ReexecSelf(argv);
    std::_Exit(99);  // the exec failed
  }
  close(fds[1]);
  std::string out;
  char buf[256];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, n);
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // The binary's own name: an exec of /proc/self/exe would be named "exe".
  EXPECT_EQ(out, "comm=reexec_test arg1=second-argument probe=7");
}

}  // namespace
}  // namespace llm
