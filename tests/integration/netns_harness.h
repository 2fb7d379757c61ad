// Network namespaces as "hosts" for integration tests: a hub namespace with a bridge, linked to
// the root namespace (where the test and the scheduler run) and to one namespace per host, each
// with an address of its own on a /24. Cutting a host's link (its bridge port down) is a network
// partition: packets are dropped, no connection is reset. Needs root (`ip netns add`);
// CannotUseNetns() says why not where it cannot.
//
//   root namespace: veth lv<pid>, <subnet>.1 (SchedulerAddress)
//     |
//   <tag>-hub: bridge br0, ports s (to the root) and p0, p1, ...
//     |                     |
//   <tag>-r0: eth0 .10     <tag>-r1: eth0 .11      (HostAddress(h))
#ifndef LLM_TESTS_INTEGRATION_NETNS_HARNESS_H_
#define LLM_TESTS_INTEGRATION_NETNS_HARNESS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace llm::testing {

// Runs a shell command; its exit status and output (stdout and stderr).
std::pair<int, std::string> Sh(const std::string& command);
// Sh, with a status naming the command and its output when it exits non-zero.
absl::Status Must(const std::string& command);

// Why this host cannot build namespaces, or "" when it can: creates and deletes one.
std::string CannotUseNetns();

// The namespaces and links of one test process (names unique per process: llm<pid>-*, on the
// subnet 10.<octet>.<pid % 250 + 1>.0/24, so that two tests using different octets never
// collide); the destructor deletes them (their veth pairs go with them, the root's end
// included), whatever state the test left them in. Build first deletes those of test processes
// that died without their destructor (killed by a timeout).
class NetworkGuard {
 public:
  explicit NetworkGuard(int octet = 213);
  ~NetworkGuard();
  NetworkGuard(const NetworkGuard&) = delete;
  NetworkGuard& operator=(const NetworkGuard&) = delete;

  // The hub, the root's link and `hosts` host namespaces.
  absl::Status Build(int hosts);
  // Host h's link to the hub up or down.
  absl::Status SetHostLink(int h, bool up);

  std::string Host(int h) const;  // the namespace's name, for `ip netns exec`
  std::string HostAddress(int h) const;
  std::string SchedulerAddress() const;  // the root namespace's address

 private:
  std::string Hub() const;
  std::string RootLink() const;
  std::string HubPort(int h) const;
  absl::Status AddNamespace(const std::string& ns);

  std::string tag_;
  std::string subnet_;
  std::vector<std::string> namespaces_;
};

}  // namespace llm::testing

#endif  // LLM_TESTS_INTEGRATION_NETNS_HARNESS_H_
