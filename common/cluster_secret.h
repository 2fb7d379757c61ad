// The secret a cluster's processes share so that their internal ports (the workers' gRPC
// service, the rendezvous store) refuse strangers, and the comparison that checks it (and the
// public API's key) without leaking its length-prefix through timing.
//
// Where it comes from, first found wins: a file (--cluster-secret-file, e.g. a Kubernetes
// Secret mounted as a file; surrounding whitespace trimmed), else the environment variable
// LLM_CLUSTER_SECRET (llm-cluster sets it for its children: argv would show in ps). None
// configured: the empty string, and the internal ports accept anyone (as before secrets).
#ifndef LLM_COMMON_CLUSTER_SECRET_H_
#define LLM_COMMON_CLUSTER_SECRET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace llm {

inline constexpr char kClusterSecretEnv[] = "LLM_CLUSTER_SECRET";
// The gRPC metadata key a process presents the secret in on every worker RPC.
inline constexpr char kClusterSecretMetadataKey[] = "x-llm-cluster-secret";

// The secret from `file` when not empty (an error naming the file when it cannot be read or
// is empty), else from the environment, else "".
absl::StatusOr<std::string> LoadClusterSecret(const std::string& file);

// 32 random bytes from the system's CSPRNG, hex-encoded (64 characters).
absl::StatusOr<std::string> GenerateClusterSecret();

// Equal contents, in time that depends on the lengths only (not on where they differ).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace llm

#endif  // LLM_COMMON_CLUSTER_SECRET_H_
