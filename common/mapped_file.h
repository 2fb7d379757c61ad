// MappedFile: a whole file mapped read-only (mmap, MAP_PRIVATE), unmapped when destroyed. The
// safetensors and GGUF readers keep one for the weights they hand out as spans.
#ifndef LLM_COMMON_MAPPED_FILE_H_
#define LLM_COMMON_MAPPED_FILE_H_

#include <cstddef>
#include <span>
#include <string>

#include "absl/status/statusor.h"

namespace llm {

class MappedFile {
 public:
  // NOT_FOUND when the file cannot be opened, INTERNAL when it cannot be mapped; messages
  // start with "<what> <path>: " (what: "safetensors", "gguf").
  static absl::StatusOr<MappedFile> Open(const std::string& path, const std::string& what);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  // The file's bytes (empty for an empty file); valid while this object lives.
  std::span<const std::byte> bytes() const { return bytes_; }

 private:
  void Reset();

  void* map_ = nullptr;
  std::span<const std::byte> bytes_;
};

}  // namespace llm

#endif  // LLM_COMMON_MAPPED_FILE_H_
