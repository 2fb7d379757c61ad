#include "tools/health_check.h"

#include <grpcpp/grpcpp.h>

#include <chrono>

namespace llm {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

HealthChecker::HealthChecker(const std::string& address)
    : stub_(grpc::health::v1::Health::NewStub(
          grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {}

HealthChecker::HealthChecker(const std::shared_ptr<grpc::Channel>& channel)
    : stub_(grpc::health::v1::Health::NewStub(channel)) {}

HealthChecker::Answer HealthChecker::Check(const std::string& service,
                                           absl::Duration timeout) const {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  HealthCheckRequest req;
  req.set_service(service);
  HealthCheckResponse resp;
  if (!stub_->Check(&ctx, req, &resp).ok()) return kUnreachable;
  switch (resp.status()) {
    case HealthCheckResponse::SERVING:
      return kServing;
    case HealthCheckResponse::NOT_SERVING:
      return kNotServing;
    default:
      return kUnknown;
  }
}

const char* HealthChecker::Name(Answer a) {
  switch (a) {
    case kServing:
      return "SERVING";
    case kNotServing:
      return "NOT_SERVING";
    case kUnknown:
      return "UNKNOWN";
    case kUnreachable:
      return "UNREACHABLE";
  }
  return "?";
}

}  // namespace llm
