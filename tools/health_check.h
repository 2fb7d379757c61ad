// A client of the standard grpc.health.v1 service: "is this server serving?".
// Thread-safe (one channel, blocking calls with a deadline).
#ifndef LLM_TOOLS_HEALTH_CHECK_H_
#define LLM_TOOLS_HEALTH_CHECK_H_

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace llm {

class HealthChecker {
 public:
  enum Answer { kServing, kNotServing, kUnknown, kUnreachable };

  explicit HealthChecker(const std::string& address);
  explicit HealthChecker(const std::shared_ptr<grpc::Channel>& channel);
  // `service` "" is the whole server. kUnreachable when the call itself fails.
  Answer Check(const std::string& service, absl::Duration timeout) const;
  static const char* Name(Answer a);

 private:
  std::unique_ptr<grpc::health::v1::Health::Stub> stub_;
};

}  // namespace llm

#endif  // LLM_TOOLS_HEALTH_CHECK_H_
