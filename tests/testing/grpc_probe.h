// grpc.health.v1.Health/Check and the reflection's list_services from a test, over generic
// stubs: Debian's gRPC does not install those protos' generated clients, and the messages a
// test needs are one field each.
#ifndef LLM_TESTS_TESTING_GRPC_PROBE_H_
#define LLM_TESTS_TESTING_GRPC_PROBE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace llm {

// Calls unary `method` ("/package.Service/Method") with `request_bytes` as the serialized
// request over a generic stub (30 s deadline); the response's bytes go to `response_bytes`
// when it is not null.
inline grpc::Status GrpcRawUnaryCall(const std::shared_ptr<grpc::Channel>& channel,
                                     const std::string& method, const std::string& request_bytes,
                                     std::string* response_bytes = nullptr) {
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  if (status.ok() && response_bytes != nullptr) {
    std::vector<grpc::Slice> slices;
    if (!response.Dump(&slices).ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "Dump");
    response_bytes->clear();
    for (const grpc::Slice& sl : slices) {
      response_bytes->append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    }
  }
  return status;
}

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
  std::string bytes;
  if (!GrpcRawUnaryCall(channel, "/grpc.health.v1.Health/Check", request_bytes, &bytes).ok()) {
    return -1;
  }
  // HealthCheckResponse { ServingStatus status = 1; }: empty for UNKNOWN.
  if (bytes.empty()) return 0;
  if (bytes.size() == 2 && bytes[0] == 0x08) return bytes[1];
  return -1;
}

// The raw bytes of the server reflection's answer to list_services (the service names appear
// in it as strings), or "" when the call fails.
inline std::string GrpcReflectionListServices(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::CompletionQueue cq;
  auto call =
      stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag = nullptr;
  bool ok = false;
  auto next = [&](intptr_t want) {
    return cq.Next(&tag, &ok) && ok && tag == reinterpret_cast<void*>(want);
  };
  call->StartCall(reinterpret_cast<void*>(1));
  if (!next(1)) return "";
  // ServerReflectionRequest { oneof message_request { string list_services = 7; } }
  grpc::Slice slice(std::string("\x3a\x00", 2));
  grpc::ByteBuffer request(&slice, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  if (!next(2)) return "";
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(3));
  if (!next(3)) return "";
  call->WritesDone(reinterpret_cast<void*>(4));
  next(4);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return "";
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return bytes;
}

}  // namespace llm

#endif  // LLM_TESTS_TESTING_GRPC_PROBE_H_
