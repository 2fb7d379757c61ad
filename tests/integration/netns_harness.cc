#include "tests/integration/netns_harness.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace llm::testing {

std::pair<int, std::string> Sh(const std::string& command) {
  std::string output;
  FILE* f = popen((command + " 2>&1").c_str(), "r");
  if (f == nullptr) return {-1, "popen failed"};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) output.append(buf, n);
  const int status = pclose(f);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

absl::Status Must(const std::string& command) {
  auto [rc, out] = Sh(command);
  if (rc != 0) return absl::InternalError(absl::StrCat("`", command, "` failed (", rc, "): ", out));
  return absl::OkStatus();
}

std::string CannotUseNetns() {
  if (Sh("command -v ip").first != 0) return "the `ip` command is missing";
  if (Sh("command -v ss").first != 0) return "the `ss` command is missing";
  const std::string probe = absl::StrCat("llm", getpid(), "-probe");
  auto [rc, out] = Sh("ip netns add " + probe);
  if (rc != 0) return "`ip netns add` is not permitted here: " + out;
  (void)Sh("ip netns del " + probe);
  return "";
}

NetworkGuard::NetworkGuard(int octet)
    : tag_(absl::StrCat("llm", getpid())),
      subnet_(absl::StrCat("10.", octet, ".", getpid() % 250 + 1, ".")) {}

NetworkGuard::~NetworkGuard() {
  for (const std::string& ns : namespaces_) (void)Sh("ip netns del " + ns);
  (void)Sh("ip link del " + RootLink());
}

std::string NetworkGuard::Hub() const { return tag_ + "-hub"; }
std::string NetworkGuard::Host(int h) const { return absl::StrCat(tag_, "-r", h); }
std::string NetworkGuard::RootLink() const { return "lv" + std::to_string(getpid()); }
std::string NetworkGuard::SchedulerAddress() const { return subnet_ + "1"; }
std::string NetworkGuard::HostAddress(int h) const { return absl::StrCat(subnet_, 10 + h); }
std::string NetworkGuard::HubPort(int h) const { return absl::StrCat("p", h); }

absl::Status NetworkGuard::AddNamespace(const std::string& ns) {
  if (absl::Status s = Must("ip netns add " + ns); !s.ok()) return s;
  namespaces_.push_back(ns);
  return Must(absl::StrCat("ip -n ", ns, " link set lo up"));
}

namespace {

// What a test killed before its NetworkGuard's destructor left (namespaces llm<pid>-*, root
// link lv<pid>, of a pid no longer alive): deleted, so that its addresses cannot shadow these.
void RemoveStale() {
  for (absl::string_view line : absl::StrSplit(Sh("ip netns list").second, '\n')) {
    const absl::string_view name = line.substr(0, line.find(' '));
    if (!absl::StartsWith(name, "llm")) continue;
    const size_t dash = name.find('-');
    int pid = 0;
    if (dash == absl::string_view::npos || !absl::SimpleAtoi(name.substr(3, dash - 3), &pid) ||
        pid <= 0 || kill(pid, 0) == 0 || errno != ESRCH) {
      continue;
    }
    (void)Sh(absl::StrCat("ip netns del ", name));
    (void)Sh(absl::StrCat("ip link del lv", pid));
  }
}

}  // namespace

absl::Status NetworkGuard::Build(int hosts) {
  RemoveStale();
  if (absl::Status s = AddNamespace(Hub()); !s.ok()) return s;
  std::vector<std::string> commands = {
      absl::StrCat("ip -n ", Hub(), " link add br0 type bridge"),
      absl::StrCat("ip -n ", Hub(), " link set br0 up"),
      absl::StrCat("ip link add ", RootLink(), " type veth peer name s netns ", Hub()),
      absl::StrCat("ip -n ", Hub(), " link set s master br0 up"),
      absl::StrCat("ip addr add ", SchedulerAddress(), "/24 dev ", RootLink()),
      absl::StrCat("ip link set ", RootLink(), " up"),
  };
  for (int h = 0; h < hosts; ++h) {
    if (absl::Status s = AddNamespace(Host(h)); !s.ok()) return s;
    commands.push_back(absl::StrCat("ip -n ", Hub(), " link add ", HubPort(h),
                                    " type veth peer name eth0 netns ", Host(h)));
    commands.push_back(absl::StrCat("ip -n ", Hub(), " link set ", HubPort(h), " master br0 up"));
    commands.push_back(
        absl::StrCat("ip -n ", Host(h), " addr add ", HostAddress(h), "/24 dev eth0"));
    commands.push_back(absl::StrCat("ip -n ", Host(h), " link set eth0 up"));
  }
  for (const std::string& c : commands) {
    if (absl::Status s = Must(c); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status NetworkGuard::SetHostLink(int h, bool up) {
  return Must(absl::StrCat("ip -n ", Hub(), " link set ", HubPort(h), up ? " up" : " down"));
}

}  // namespace llm::testing
