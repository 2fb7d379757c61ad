#include "common/grpc_security.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/cluster_secret.h"
#include "grpcpp/support/client_interceptor.h"

namespace llm {
namespace {

absl::string_view ToView(const grpc::string_ref& s) {
  return absl::string_view(s.data(), s.size());
}

// Adds one metadata entry to every call's initial metadata.
class HeaderInterceptor final : public grpc::experimental::Interceptor {
 public:
  HeaderInterceptor(const std::string* key, const std::string* value) : key_(key), value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({*key_, *value_});
    }
    methods->Proceed();
  }

 private:
  const std::string* const key_;
  const std::string* const value_;
};

class HeaderInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  HeaderInterceptorFactory(std::string key, std::string value)
      : key_(std::move(key)), value_(std::move(value)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new HeaderInterceptor(&key_, &value_);
  }

 private:
  // Outlive the channel's interceptors: the channel owns this factory.
  const std::string key_;
  const std::string value_;
};

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " is not a PEM file (no -----BEGIN line)"));
  }
  return ss.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& certfile, const std::string& keyfile, const std::string& ca_certs) {
  if (certfile.empty() != keyfile.empty()) {
    return absl::InvalidArgumentError(
        "--ssl-certfile and --ssl-keyfile go together: give both or neither");
  }
  if (certfile.empty()) {
    if (!ca_certs.empty()) {
      return absl::InvalidArgumentError("--ssl-ca-certs needs --ssl-certfile and --ssl-keyfile");
    }
    return grpc::InsecureServerCredentials();
  }
  absl::StatusOr<std::string> cert = ReadPemFile(certfile, "--ssl-certfile");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPemFile(keyfile, "--ssl-keyfile");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!ca_certs.empty()) {
    absl::StatusOr<std::string> ca = ReadPemFile(ca_certs, "--ssl-ca-certs");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    bool tls, const std::string& tls_ca) {
  if (!tls && tls_ca.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  if (!tls_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPemFile(tls_ca, "--tls-ca");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
  }
  return grpc::SslCredentials(options);
}

std::string ApiKeyFromFlagOrEnv(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  const char* env = std::getenv(kApiKeyEnv);
  return env == nullptr ? std::string() : std::string(env);
}

grpc::Status CheckApiKey(const grpc::ServerContextBase& context, const std::string& api_key) {
  if (api_key.empty()) return grpc::Status::OK;
  const auto& md = context.client_metadata();
  bool ok = false;
  for (auto [it, end] = md.equal_range("authorization"); it != end; ++it) {
    absl::string_view v = ToView(it->second);
    constexpr absl::string_view kBearer = "Bearer ";
    if (v.size() >= kBearer.size() &&
        absl::EqualsIgnoreCase(v.substr(0, kBearer.size()), kBearer) &&
        ConstantTimeEquals(v.substr(kBearer.size()), api_key)) {
      ok = true;
    }
  }
  if (ok) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or invalid API key");
}

grpc::Status CheckClusterSecret(const grpc::ServerContextBase& context, const std::string& secret) {
  if (secret.empty()) return grpc::Status::OK;
  const auto& md = context.client_metadata();
  auto it = md.find(kClusterSecretMetadataKey);
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        absl::StrCat("this worker requires the cluster secret (metadata ",
                                     kClusterSecretMetadataKey, "); none was presented"));
  }
  if (!ConstantTimeEquals(ToView(it->second), secret)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the cluster secret presented is not this worker's");
  }
  return grpc::Status::OK;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreatePublicChannel(
    const std::string& address, const PublicChannelOptions& options) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      MakeChannelCredentials(options.tls, options.tls_ca);
  if (!creds.ok()) return creds.status();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  if (options.api_key.empty()) return grpc::CreateCustomChannel(address, *creds, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(
      std::make_unique<HeaderInterceptorFactory>("authorization", "Bearer " + options.api_key));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, *creds, args,
                                                                 std::move(factories));
}

std::shared_ptr<grpc::Channel> CreateInternalChannel(const std::string& target,
                                                     const grpc::ChannelArguments& args,
                                                     const std::string& secret) {
  if (secret.empty()) {
    return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(
      std::make_unique<HeaderInterceptorFactory>(kClusterSecretMetadataKey, secret));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      target, grpc::InsecureChannelCredentials(), args, std::move(factories));
}

}  // namespace llm
