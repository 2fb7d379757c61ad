#include "common/cluster_secret.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace llm {

absl::StatusOr<std::string> LoadClusterSecret(const std::string& file) {
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      return absl::InvalidArgumentError(absl::StrCat("--cluster-secret-file: cannot read ", file));
    }
    std::stringstream ss;
    ss << in.rdbuf();
    std::string secret(absl::StripAsciiWhitespace(ss.str()));
    if (secret.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cluster-secret-file: ", file, " is empty; expected the secret"));
    }
    return secret;
  }
  const char* env = std::getenv(kClusterSecretEnv);
  return env == nullptr ? std::string() : std::string(absl::StripAsciiWhitespace(env));
}

absl::StatusOr<std::string> GenerateClusterSecret() {
  FILE* f = std::fopen("/dev/urandom", "rb");
  if (f == nullptr) return absl::InternalError("cannot open /dev/urandom");
  unsigned char bytes[32];
  const size_t n = std::fread(bytes, 1, sizeof(bytes), f);
  std::fclose(f);
  if (n != sizeof(bytes)) return absl::InternalError("short read from /dev/urandom");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Every byte of the longer is looked at; the lengths are not secret.
  const size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    const unsigned char y = i < b.size() ? b[i] : 0;
    diff = diff | (x ^ y);
  }
  return diff == 0;
}

}  // namespace llm
