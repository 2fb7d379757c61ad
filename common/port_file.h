// The servers' --port-file convention: once serving, a server writes its bound port ("PORT\n")
// to PATH.tmp and renames it to PATH, so that a reader (llm-cluster, tests) never sees part of
// it. Plain functions; thread-compatible.
#ifndef LLM_COMMON_PORT_FILE_H_
#define LLM_COMMON_PORT_FILE_H_

#include <optional>
#include <string>

#include "absl/status/status.h"

namespace llm {

// INTERNAL naming the file when it cannot be written or renamed.
absl::Status WritePortFile(const std::string& path, int port);

// The port, or nullopt while the file is missing (not written yet) or does not hold one.
std::optional<int> ReadPortFile(const std::string& path);

}  // namespace llm

#endif  // LLM_COMMON_PORT_FILE_H_
