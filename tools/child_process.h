// A program started as a child process that cannot outlive the process that started it.
//
// The child gets PR_SET_PDEATHSIG = SIGTERM (so it is told to stop even when the parent is
// SIGKILLed), default signal dispositions and an empty signal mask, and optionally a process
// group of its own (a terminal's Ctrl-C then reaches only the parent, which decides). Its
// stdout and stderr are either inherited or forwarded line by line to the parent's stderr with
// a prefix ("[worker 1] ...") by a thread this object owns.
//
// PDEATHSIG fires when the *thread* that forked exits: start children from a thread that lives
// as long as they should (the main thread). Not thread-safe: one owner calls every method.
// The destructor stops a child still running (SIGTERM, then SIGKILL) and reaps it.
#ifndef LLM_TOOLS_CHILD_PROCESS_H_
#define LLM_TOOLS_CHILD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace llm {

struct ChildSpec {
  std::vector<std::string> argv;  // argv[0] is the program's path
  std::string log_prefix;         // empty: inherit stdout/stderr; else forward with the prefix
  bool new_process_group = true;
};

class ChildProcess {
 public:
  // Fails when the program cannot be executed (the exec error is reported back).
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const ChildSpec& spec);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  bool running() const { return !wait_status_.has_value(); }
  // The waitpid status once the child has exited and been reaped.
  std::optional<int> wait_status() const { return wait_status_; }

  // Reaps the child if it has exited; returns its wait status then. Never blocks.
  std::optional<int> Poll();
  // Sends `signal` if the child is still running.
  void Signal(int signal);
  // SIGTERM, waits up to `grace`, then SIGKILL; reaps. Returns the wait status.
  int Stop(absl::Duration grace);
  // Waits up to `timeout` for the child to exit on its own.
  std::optional<int> Wait(absl::Duration timeout);

  // "exited with status 1", "killed by signal 9 (Killed)".
  static std::string DescribeStatus(int wait_status);

 private:
  explicit ChildProcess(pid_t pid);

  pid_t pid_;
  std::optional<int> wait_status_;
  std::thread log_thread_;
};

}  // namespace llm

#endif  // LLM_TOOLS_CHILD_PROCESS_H_
