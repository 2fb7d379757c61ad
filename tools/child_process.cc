#include "tools/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace llm {
namespace {

// Writes all of `s` to stderr in one write where possible, so lines of different children do
// not interleave mid-line.
void WriteAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// Reads `fd` until EOF and writes each line to stderr with `prefix`.
void ForwardLines(int fd, std::string prefix) {
  std::string pending;
  char buf[4096];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      WriteAll(STDERR_FILENO, prefix + pending.substr(start, nl - start + 1));
    }
    pending.erase(0, start);
  }
  if (!pending.empty()) WriteAll(STDERR_FILENO, prefix + pending + "\n");
  close(fd);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(const ChildSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("no program to start");
  // Everything the child needs is prepared before fork: only async-signal-safe calls follow.
  std::vector<char*> argv;
  for (const std::string& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  int log_pipe[2] = {-1, -1};
  if (!spec.log_prefix.empty() && pipe2(log_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  // The child writes errno here when exec fails; CLOEXEC closes it on success.
  int exec_pipe[2] = {-1, -1};
  auto fail = [&](const char* what) {
    const int err = errno;
    for (int fd : {log_pipe[0], log_pipe[1], exec_pipe[0], exec_pipe[1]}) {
      if (fd >= 0) close(fd);
    }
    return absl::InternalError(absl::StrCat(what, ": ", std::strerror(err)));
  };
  if (pipe2(exec_pipe, O_CLOEXEC) != 0) return fail("pipe");
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return fail("fork");
  if (pid == 0) {
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) _exit(127);
    if (spec.new_process_group) setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD, SIGQUIT}) signal(sig, SIG_DFL);
    if (log_pipe[1] >= 0) {
      dup2(log_pipe[1], STDOUT_FILENO);
      dup2(log_pipe[1], STDERR_FILENO);
    }
    execv(argv[0], argv.data());
    const int err = errno;
    (void)!write(exec_pipe[1], &err, sizeof(err));
    _exit(127);
  }
  close(exec_pipe[1]);
  if (log_pipe[1] >= 0) close(log_pipe[1]);
  int err = 0;
  ssize_t n;
  do {
    n = read(exec_pipe[0], &err, sizeof(err));
  } while (n < 0 && errno == EINTR);
  close(exec_pipe[0]);
  auto child = std::unique_ptr<ChildProcess>(new ChildProcess(pid));
  if (!spec.log_prefix.empty()) {
    child->log_thread_ = std::thread(ForwardLines, log_pipe[0], spec.log_prefix);
  }
  if (n == sizeof(err)) {
    child->Wait(absl::Seconds(5));
    return absl::FailedPreconditionError(
        absl::StrCat("cannot execute ", spec.argv[0], ": ", std::strerror(err)));
  }
  return child;
}

ChildProcess::ChildProcess(pid_t pid) : pid_(pid) {}

ChildProcess::~ChildProcess() {
  if (running()) Stop(absl::Seconds(5));
  if (log_thread_.joinable()) log_thread_.join();
}

std::optional<int> ChildProcess::Poll() {
  if (wait_status_.has_value()) return wait_status_;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_ || (r < 0 && errno == ECHILD)) wait_status_ = r == pid_ ? status : 0;
  return wait_status_;
}

void ChildProcess::Signal(int signal) {
  if (!Poll().has_value()) kill(pid_, signal);
}

std::optional<int> ChildProcess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!Poll().has_value()) {
    if (absl::Now() >= deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return wait_status_;
}

int ChildProcess::Stop(absl::Duration grace) {
  Signal(SIGTERM);
  if (!Wait(grace).has_value()) {
    Signal(SIGKILL);
    Wait(absl::InfiniteDuration());
  }
  return *wait_status_;
}

std::string ChildProcess::DescribeStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exited with status ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    return absl::StrCat("killed by signal ", sig, " (", strsignal(sig), ")");
  }
  return absl::StrCat("ended with wait status ", wait_status);
}

}  // namespace llm
