// Reading GGUF files (llama.cpp's single-file model format), versions 2 and 3.
//
// File layout (all little-endian):
//   u32 magic "GGUF", u32 version, u64 tensor_count, u64 kv_count,
//   kv_count x { string key, u32 value_type, value },
//   tensor_count x { string name, u32 n_dims, u64 dims[n_dims], u32 ggml_type, u64 offset },
//   padding to `general.alignment` (default 32), then the data section; each tensor's
//   offset is relative to the data section and a multiple of the alignment.
//   string = u64 length + bytes; array = u32 element type + u64 count + elements.
//
// Open() maps the file read-only and checks everything it reads: each count and length is
// capped by the bytes left in the file (so a corrupt count cannot cause a huge allocation),
// every tensor's type, dims and bytes lie inside the data section. Failures are
// INVALID_ARGUMENT (DATA_LOSS when the file ends early) naming the file, the byte offset and
// what was expected and found.
//
// Dims are kept in ggml order (dims[0] is the fastest-varying, the row length); shape()
// gives the row-major order that safetensors and PyTorch use (reversed).
//
// Thread-safety: immutable after Open; reads from several threads are safe.
#ifndef LLM_COMMON_GGUF_H_
#define LLM_COMMON_GGUF_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mapped_file.h"

namespace llm {

enum class GgufValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
const char* GgufValueTypeName(GgufValueType t);

// ggml tensor types (ggml.h's enum ggml_type numbering).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
};
// "Q4_K", or "type N" for a number without a name here.
std::string GgmlTypeName(GgmlType t);
// Elements per block and bytes per block; {0, 0} for a type this reader does not know.
std::pair<int64_t, int64_t> GgmlBlockLayout(GgmlType t);

// One metadata value. Integers are kept as int64 (u64 values above INT64_MAX as uint64
// in `u`), floats as double, arrays as their elements (of one type, possibly arrays).
struct GgufValue {
  GgufValueType type = GgufValueType::kU8;
  int64_t i = 0;                                 // integer and bool types
  uint64_t u = 0;                                // the same, unsigned (u64)
  double f = 0;                                  // f32, f64
  std::string s;                                 // string
  GgufValueType elem_type = GgufValueType::kU8;  // array
  std::vector<GgufValue> array;

  bool is_int() const;
  bool is_float() const { return type == GgufValueType::kF32 || type == GgufValueType::kF64; }
  // Integers and floats as a number; nullopt for strings and arrays.
  std::optional<double> AsNumber() const;
};

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the row length
  size_t offset = 0;          // from the start of the file
  size_t nbytes = 0;
  int64_t numel() const;
  // Row-major shape (dims reversed), as in safetensors.
  std::vector<int64_t> shape() const { return {dims.rbegin(), dims.rend()}; }
};

class GgufFile {
 public:
  static constexpr uint32_t kMagic = 0x46554747;  // "GGUF"
  static constexpr uint32_t kDefaultAlignment = 32;

  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses a file image already in memory (the caller keeps it alive); for tests and fuzzing.
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBuffer(std::span<const std::byte> bytes,
                                                              std::string name = "<buffer>");
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  size_t data_offset() const { return data_offset_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  // nullptr when absent.
  const GgufValue* Find(std::string_view key) const;
  // NOT_FOUND naming the key when absent; INVALID_ARGUMENT naming the key and the type found
  // when it is not a string / an integer / a number.
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetNumber(std::string_view key) const;

  // Tensors in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(std::string_view name) const;
  std::span<const std::byte> Bytes(const GgufTensorInfo& t) const {
    return bytes_.subspan(t.offset, t.nbytes);
  }

 private:
  GgufFile() = default;
  absl::Status Parse();

  std::string path_;
  MappedFile mapped_;  // when opened from a file
  std::span<const std::byte> bytes_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kDefaultAlignment;
  size_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::map<std::string, size_t, std::less<>> meta_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace llm

#endif  // LLM_COMMON_GGUF_H_
