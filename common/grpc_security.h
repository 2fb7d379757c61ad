// gRPC credentials and checks for exposing the service:
//  - TLS from PEM files for the public API's server (vLLM's --ssl-certfile / --ssl-keyfile /
//    --ssl-ca-certs) and its clients (--tls-ca, --tls-server-name);
//  - the API key a client presents as "authorization: Bearer KEY" (LLM_API_KEY in the
//    environment, as vLLM's VLLM_API_KEY);
//  - the cluster secret on the internal worker RPCs: a client interceptor that adds it to
//    every call's metadata, and the check a worker makes.
#ifndef LLM_COMMON_GRPC_SECURITY_H_
#define LLM_COMMON_GRPC_SECURITY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace llm {

inline constexpr char kApiKeyEnv[] = "LLM_API_KEY";

// The whole file; an INVALID_ARGUMENT naming `flag` and the path when it cannot be read or is
// empty.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& flag);

// Insecure when `certfile` and `keyfile` are empty; else TLS with that certificate chain and
// key, and with `ca_certs` also given, clients must present a certificate it signed.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& certfile, const std::string& keyfile, const std::string& ca_certs);

// Insecure when `tls_ca` is empty and `tls` false; else TLS trusting the roots in `tls_ca` (the
// system's when empty).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    bool tls, const std::string& tls_ca);

// `flag_value` when not empty, else $LLM_API_KEY, else "".
std::string ApiKeyFromFlagOrEnv(const std::string& flag_value);

// OK when `api_key` is empty or the call's metadata holds "authorization: Bearer <api_key>"
// (compared in constant time); else UNAUTHENTICATED "missing or invalid API key".
grpc::Status CheckApiKey(const grpc::ServerContextBase& context, const std::string& api_key);

// OK when `secret` is empty or the call presents it (kClusterSecretMetadataKey); else
// UNAUTHENTICATED naming what is missing, never the secret.
grpc::Status CheckClusterSecret(const grpc::ServerContextBase& context, const std::string& secret);

// How a client reaches the public API.
struct PublicChannelOptions {
  bool tls = false;             // TLS (implied by tls_ca)
  std::string tls_ca;           // PEM roots to trust; empty: the system's
  std::string tls_server_name;  // the name the certificate must carry; empty: the address's
  std::string api_key;          // sent as "authorization: Bearer KEY" on every call; empty: none
};

// A channel to the public API; INVALID_ARGUMENT when tls_ca cannot be read.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreatePublicChannel(
    const std::string& address, const PublicChannelOptions& options);

// A channel to an internal (worker) port that presents `secret` on every call (none when
// empty).
std::shared_ptr<grpc::Channel> CreateInternalChannel(const std::string& target,
                                                     const grpc::ChannelArguments& args,
                                                     const std::string& secret);

}  // namespace llm

#endif  // LLM_COMMON_GRPC_SECURITY_H_
