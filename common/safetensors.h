// Reading model weights in the safetensors format, as Hugging Face model directories ship
// them: one model.safetensors, or shards listed by model.safetensors.index.json.
//
// File layout:  [u64 little-endian N][N bytes of JSON header][data]
//   header: {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [..],
//            "data_offsets": [begin, end]}, ...}   offsets are relative to the data section.
//
// Files are mapped read-only (mmap), so a tensor costs nothing until read, and a
// tensor-parallel rank that reads only its slice touches only those pages. Open() checks the
// whole header: size (at most 100 MB), JSON, dtypes, shapes, and that every tensor's
// offsets match dtype x shape, lie inside the file and overlap no other tensor; each failure
// is INVALID_ARGUMENT (DATA_LOSS for a truncated file) naming the file and the tensor.
//
// Thread-safety: immutable after Open; reads from several threads are safe.
#ifndef LLM_COMMON_SAFETENSORS_H_
#define LLM_COMMON_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mapped_file.h"

namespace llm {

enum class StDType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

std::string_view StDTypeName(StDType t);
size_t StDTypeSize(StDType t);

struct StTensorInfo {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<int64_t> shape;
  size_t offset = 0;  // from the start of the file
  size_t nbytes = 0;
  int64_t numel() const;
};

// One mapped safetensors file.
class SafetensorsFile {
 public:
  static constexpr size_t kMaxHeaderBytes = 100u << 20;

  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Parses a file image already in memory (the caller keeps it alive); for tests and fuzzing.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBuffer(
      std::span<const std::byte> bytes, std::string name = "<buffer>");
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Tensors in file order.
  const std::vector<StTensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const StTensorInfo* Find(std::string_view name) const;
  std::span<const std::byte> Bytes(const StTensorInfo& t) const {
    return bytes_.subspan(t.offset, t.nbytes);
  }

 private:
  SafetensorsFile() = default;
  absl::Status Parse();

  std::string path_;
  MappedFile mapped_;  // when opened from a file
  std::span<const std::byte> bytes_;
  std::map<std::string, std::string> metadata_;
  std::vector<StTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
};

// Converts one tensor (F32, F16 or BF16) to fp32. `out` must hold numel() floats.
absl::Status ReadAsF32(const SafetensorsFile& file, const StTensorInfo& t, std::span<float> out);

// Converts rows [begin, end) along dimension `dim` (0 or 1 of a 1-D or 2-D tensor) to fp32:
// a tensor-parallel rank's shard of a column- (dim 0) or row-parallel (dim 1) weight.
// `out` must hold (end - begin) * (the other dimension) floats.
absl::Status ReadSliceAsF32(const SafetensorsFile& file, const StTensorInfo& t, int dim,
                            int64_t begin, int64_t end, std::span<float> out);

// The same slice in `out_dtype` (F32, F16 or BF16): a byte copy when it is the tensor's dtype
// (a BF16 checkpoint goes to a BF16 device without a trip through fp32), else converted
// (narrowing rounds to nearest even). `out` holds exactly the slice's bytes in out_dtype.
// A whole 1-D or 2-D tensor is the slice [0, shape[0]) of dimension 0.
absl::Status ReadSlice(const SafetensorsFile& file, const StTensorInfo& t, int dim, int64_t begin,
                       int64_t end, StDType out_dtype, std::span<std::byte> out);

// A model's weights by their Hugging Face names and row-major layout, as the model loader
// reads them: SafetensorsModel (a model directory) and GgufWeights (common/gguf_model.h).
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The row-major shape of tensor `name`; NOT_FOUND naming it when absent.
  virtual absl::StatusOr<std::vector<int64_t>> Shape(std::string_view name) const = 0;
  // As llm::ReadSlice below: rows [begin, end) of dimension `dim` in `out_dtype`.
  virtual absl::Status ReadSlice(std::string_view name, int dim, int64_t begin, int64_t end,
                                 StDType out_dtype, std::span<std::byte> out) const = 0;
};

// All weights of a Hugging Face model directory: model.safetensors, or the shards named by
// model.safetensors.index.json ("weight_map": {tensor: file}).
class SafetensorsModel : public WeightSource {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsModel>> Open(const std::string& dir);

  struct Entry {
    const SafetensorsFile* file;
    const StTensorInfo* info;
  };
  // NOT_FOUND naming the tensor and the directory when absent.
  absl::StatusOr<Entry> Find(std::string_view name) const;
  bool Contains(std::string_view name) const;
  std::vector<std::string> TensorNames() const;
  int num_files() const { return static_cast<int>(files_.size()); }

  absl::Status ReadAsF32(std::string_view name, std::span<float> out) const;
  absl::Status ReadSliceAsF32(std::string_view name, int dim, int64_t begin, int64_t end,
                              std::span<float> out) const;
  absl::Status ReadSlice(std::string_view name, int dim, int64_t begin, int64_t end,
                         StDType out_dtype, std::span<std::byte> out) const override;
  absl::StatusOr<std::vector<int64_t>> Shape(std::string_view name) const override;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry, std::less<>> entries_;
};

}  // namespace llm

#endif  // LLM_COMMON_SAFETENSORS_H_
