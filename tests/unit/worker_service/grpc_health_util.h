// grpc.health.v1.Health/Check from a test, over a generic stub: Debian's gRPC does not install
// the health proto's generated client, and the two messages are one field each.
#ifndef LLM_TESTS_UNIT_WORKER_SERVICE_GRPC_HEALTH_UTIL_H_
#define LLM_TESTS_UNIT_WORKER_SERVICE_GRPC_HEALTH_UTIL_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace llm {

// The serving status of `service` ("" is the whole server): 1 SERVING, 2 NOT_SERVING, 0
// UNKNOWN; -1 when the call fails.
inline int GrpcHealthCheck(const std::shared_ptr<grpc::Channel>& channel,
                           const std::string& service) {
  // HealthCheckRequest { string service = 1; }
  std::string request_bytes;
  if (!service.empty()) {
    request_bytes.push_back(0x0a);
    request_bytes.push_back(static_cast<char>(service.size()));  // < 128 bytes
    request_bytes += service;
  }
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse { ServingStatus status = 1; }: empty for UNKNOWN.
  if (bytes.empty()) return 0;
  if (bytes.size() == 2 && bytes[0] == 0x08) return bytes[1];
  return -1;
}

}  // namespace llm

#endif  // LLM_TESTS_UNIT_WORKER_SERVICE_GRPC_HEALTH_UTIL_H_
