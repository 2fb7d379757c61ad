#include "common/safetensors.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace llm {
namespace {

using json = nlohmann::json;

struct DTypeEntry {
  std::string_view name;
  StDType dtype;
  size_t size;
};

constexpr DTypeEntry kDTypes[] = {
    {"F64", StDType::kF64, 8},   {"F32", StDType::kF32, 4}, {"F16", StDType::kF16, 2},
    {"BF16", StDType::kBF16, 2}, {"I64", StDType::kI64, 8}, {"I32", StDType::kI32, 4},
    {"I16", StDType::kI16, 2},   {"I8", StDType::kI8, 1},   {"U8", StDType::kU8, 1},
    {"BOOL", StDType::kBool, 1},
};

absl::Status Invalid(absl::string_view file, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors ", file, ": ", what));
}

// Converts n elements starting at element `first` of a tensor's bytes.
void Convert(StDType dtype, const std::byte* src, int64_t first, int64_t n, float* out) {
  switch (dtype) {
    case StDType::kF32:
      std::memcpy(out, src + first * 4, n * 4);
      return;
    case StDType::kF16:
    case StDType::kBF16: {
      const std::byte* p = src + first * 2;
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, p + i * 2, 2);
        out[i] = dtype == StDType::kF16 ? HalfToFloat(v) : Bf16ToFloat(v);
      }
      return;
    }
    default:
      return;
  }
}

// Converts n elements starting at element `first` of a tensor's bytes into `out_dtype` (F32,
// F16 or BF16) at out: a copy when the dtypes match.
void ConvertTo(StDType dtype, const std::byte* src, int64_t first, int64_t n, StDType out_dtype,
               std::byte* out) {
  if (dtype == out_dtype) {
    const size_t size = StDTypeSize(dtype);
    std::memcpy(out, src + first * size, n * size);
    return;
  }
  if (out_dtype == StDType::kF32) {
    Convert(dtype, src, first, n, reinterpret_cast<float*>(out));
    return;
  }
  constexpr int64_t kChunk = 1024;
  float buf[kChunk];
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t m = std::min(kChunk, n - i);
    Convert(dtype, src, first + i, m, buf);
    for (int64_t j = 0; j < m; ++j) {
      const uint16_t bits = out_dtype == StDType::kBF16 ? FloatToBf16(buf[j]) : FloatToHalf(buf[j]);
      std::memcpy(out + (i + j) * 2, &bits, 2);
    }
  }
}

absl::Status CheckFloat(const SafetensorsFile& file, const StTensorInfo& t) {
  if (t.dtype == StDType::kF32 || t.dtype == StDType::kF16 || t.dtype == StDType::kBF16) {
    return absl::OkStatus();
  }
  return absl::UnimplementedError(absl::StrCat("safetensors ", file.path(), ": tensor ", t.name,
                                               " has dtype ", std::string(StDTypeName(t.dtype)),
                                               "; only F32, F16 and BF16 weights are supported"));
}

}  // namespace

std::string_view StDTypeName(StDType t) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.dtype == t) return e.name;
  }
  return "?";
}

size_t StDTypeSize(StDType t) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.dtype == t) return e.size;
  }
  return 0;
}

int64_t StTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  absl::StatusOr<MappedFile> mapped = MappedFile::Open(path, "safetensors");
  if (!mapped.ok()) return mapped.status();
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mapped_ = *std::move(mapped);
  file->bytes_ = file->mapped_.bytes();
  RETURN_IF_ERROR(file->Parse());
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBuffer(
    std::span<const std::byte> bytes, std::string name) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = std::move(name);
  file->bytes_ = bytes;
  RETURN_IF_ERROR(file->Parse());
  return file;
}

SafetensorsFile::~SafetensorsFile() = default;

absl::Status SafetensorsFile::Parse() {
  if (bytes_.size() < 8) {
    return absl::DataLossError(absl::StrCat("safetensors ", path_, ": ", bytes_.size(),
                                            " bytes is too short for the 8-byte header size"));
  }
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<uint8_t>(bytes_[i]);
  if (header_size > kMaxHeaderBytes) {
    return Invalid(path_, absl::StrCat("header of ", header_size, " bytes exceeds the limit of ",
                                       kMaxHeaderBytes));
  }
  if (header_size > bytes_.size() - 8) {
    return absl::DataLossError(absl::StrCat("safetensors ", path_, ": header of ", header_size,
                                            " bytes but the file has only ", bytes_.size() - 8,
                                            " after the size (truncated?)"));
  }
  const std::string_view text(reinterpret_cast<const char*>(bytes_.data() + 8), header_size);
  json header = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return Invalid(path_, "header is not valid JSON");
  if (!header.is_object()) return Invalid(path_, "header is not a JSON object");

  const size_t data_start = 8 + header_size;
  const size_t data_size = bytes_.size() - data_start;
  for (auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) return Invalid(path_, "__metadata__ is not an object");
      for (auto& [k, v] : value.items()) {
        if (!v.is_string())
          return Invalid(path_, absl::StrCat("__metadata__.", k, " is not a string"));
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = absl::StrCat("tensor ", name);
    if (!value.is_object()) return Invalid(path_, absl::StrCat(where, " is not an object"));
    const auto dtype_it = value.find("dtype");
    const auto shape_it = value.find("shape");
    const auto offsets_it = value.find("data_offsets");
    if (dtype_it == value.end() || !dtype_it->is_string()) {
      return Invalid(path_, absl::StrCat(where, " has no dtype string"));
    }
    if (shape_it == value.end() || !shape_it->is_array()) {
      return Invalid(path_, absl::StrCat(where, " has no shape array"));
    }
    if (offsets_it == value.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
      return Invalid(path_, absl::StrCat(where, " has no [begin, end] data_offsets"));
    }
    StTensorInfo t;
    t.name = name;
    const std::string dtype = dtype_it->get<std::string>();
    const auto d = std::find_if(std::begin(kDTypes), std::end(kDTypes),
                                [&](const DTypeEntry& e) { return e.name == dtype; });
    if (d == std::end(kDTypes)) {
      return Invalid(path_, absl::StrCat(where, " has unknown dtype \"", dtype, "\""));
    }
    t.dtype = d->dtype;
    // numel * size must not overflow: bound each step by the data section's size.
    uint64_t numel = 1;
    for (const json& dim : *shape_it) {
      if (!dim.is_number_unsigned()) {
        return Invalid(path_, absl::StrCat(where,
                                           " has a shape entry that is not a "
                                           "non-negative integer: ",
                                           dim.dump()));
      }
      const uint64_t n = dim.get<uint64_t>();
      t.shape.push_back(static_cast<int64_t>(n));
      if (n != 0 && numel > (std::numeric_limits<uint64_t>::max() / 16) / n) {
        return Invalid(path_, absl::StrCat(where, " has an impossibly large shape"));
      }
      numel *= n;
    }
    const json& b = (*offsets_it)[0];
    const json& e = (*offsets_it)[1];
    if (!b.is_number_unsigned() || !e.is_number_unsigned()) {
      return Invalid(path_, absl::StrCat(where,
                                         " has data_offsets that are not non-negative "
                                         "integers"));
    }
    const uint64_t begin = b.get<uint64_t>(), end = e.get<uint64_t>();
    if (end < begin) {
      return Invalid(path_, absl::StrCat(where, " has data_offsets [", begin, ", ", end,
                                         "] that end before they begin"));
    }
    if (end - begin != numel * d->size) {
      return Invalid(path_, absl::StrCat(where, " has ", end - begin, " bytes but dtype ", dtype,
                                         " x shape needs ", numel * d->size));
    }
    if (end > data_size) {
      return Invalid(path_, absl::StrCat(where, " ends at byte ", end, " of a ", data_size,
                                         "-byte data section (out of the file)"));
    }
    t.offset = data_start + begin;
    t.nbytes = end - begin;
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const StTensorInfo& a, const StTensorInfo& b) { return a.offset < b.offset; });
  for (size_t i = 1; i < tensors_.size(); ++i) {
    const StTensorInfo& prev = tensors_[i - 1];
    if (tensors_[i].offset < prev.offset + prev.nbytes) {
      return Invalid(path_,
                     absl::StrCat("tensors ", prev.name, " and ", tensors_[i].name, " overlap"));
    }
  }
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
  return absl::OkStatus();
}

const StTensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::Status ReadAsF32(const SafetensorsFile& file, const StTensorInfo& t, std::span<float> out) {
  RETURN_IF_ERROR(CheckFloat(file, t));
  if (static_cast<int64_t>(out.size()) != t.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, " has ", t.numel(),
                                                   " elements; the buffer holds ", out.size()));
  }
  Convert(t.dtype, file.Bytes(t).data(), 0, t.numel(), out.data());
  return absl::OkStatus();
}

absl::Status ReadSliceAsF32(const SafetensorsFile& file, const StTensorInfo& t, int dim,
                            int64_t begin, int64_t end, std::span<float> out) {
  return ReadSlice(file, t, dim, begin, end, StDType::kF32,
                   std::as_writable_bytes(std::span<float>(out)));
}

absl::Status ReadSlice(const SafetensorsFile& file, const StTensorInfo& t, int dim, int64_t begin,
                       int64_t end, StDType out_dtype, std::span<std::byte> out) {
  RETURN_IF_ERROR(CheckFloat(file, t));
  if (out_dtype != StDType::kF32 && out_dtype != StDType::kF16 && out_dtype != StDType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": cannot be read as ",
                                                   std::string(StDTypeName(out_dtype))));
  }
  const int rank = static_cast<int>(t.shape.size());
  if (rank < 1 || rank > 2 || dim < 0 || dim >= rank) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, " of rank ", rank,
                                                   " cannot be sliced along dimension ", dim));
  }
  const int64_t rows = t.shape[0];
  const int64_t cols = rank == 2 ? t.shape[1] : 1;
  const int64_t extent = dim == 0 ? rows : cols;
  if (begin < 0 || end > extent || begin > end) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": slice [", begin, ", ", end,
                                                   ") of dimension ", dim, " (size ", extent, ")"));
  }
  const int64_t other = dim == 0 ? cols : rows;
  const size_t out_size = StDTypeSize(out_dtype);
  if (out.size() != static_cast<size_t>((end - begin) * other) * out_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", t.name, ": slice has ", (end - begin) * other,
                     " elements; the buffer holds ", out.size() / out_size));
  }
  const std::byte* src = file.Bytes(t).data();
  if (dim == 0) {
    ConvertTo(t.dtype, src, begin * cols, (end - begin) * cols, out_dtype, out.data());
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      ConvertTo(t.dtype, src, r * cols + begin, end - begin, out_dtype,
                out.data() + r * (end - begin) * out_size);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SafetensorsModel>> SafetensorsModel::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  auto model = std::make_unique<SafetensorsModel>();
  model->dir_ = dir;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";
  std::vector<std::string> shard_names;
  std::map<std::string, std::string> weight_map;
  std::error_code ec;  // the non-throwing overloads: an unreadable directory is a status
  if (fs::exists(index_path, ec)) {
    std::ifstream in(index_path);
    std::stringstream ss;
    ss << in.rdbuf();
    json index = json::parse(ss.str(), nullptr, false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path.string(), ": not a JSON object with a \"weight_map\" object"));
    }
    for (auto& [tensor, file] : index["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": weight_map[\"",
                                                       tensor, "\"] is not a file name in ", dir));
      }
      weight_map[tensor] = file.get<std::string>();
      if (std::find(shard_names.begin(), shard_names.end(), file.get<std::string>()) ==
          shard_names.end()) {
        shard_names.push_back(file.get<std::string>());
      }
    }
  } else if (fs::exists(single_path, ec)) {
    shard_names.push_back("model.safetensors");
  } else {
    return absl::NotFoundError(
        absl::StrCat("no model.safetensors or "
                     "model.safetensors.index.json in ",
                     dir));
  }
  std::map<std::string, const SafetensorsFile*> by_name;
  for (const std::string& shard : shard_names) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                     SafetensorsFile::Open((fs::path(dir) / shard).string()));
    by_name[shard] = file.get();
    model->files_.push_back(std::move(file));
  }
  for (const auto& file : model->files_) {
    for (const StTensorInfo& t : file->tensors()) {
      const auto listed = weight_map.find(t.name);
      if (!weight_map.empty() &&
          (listed == weight_map.end() || by_name[listed->second] != file.get())) {
        continue;  // the index names another shard for it (or none): not ours to serve
      }
      if (!model->entries_.emplace(t.name, Entry{file.get(), &t}).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", t.name, " appears in more than one shard of ", dir));
      }
    }
  }
  for (const auto& [tensor, shard] : weight_map) {
    if (!model->entries_.contains(tensor)) {
      return absl::InvalidArgumentError(absl::StrCat("the index of ", dir, " lists ", tensor,
                                                     " in ", shard, ", which does not hold it"));
    }
  }
  return model;
}

absl::StatusOr<SafetensorsModel::Entry> SafetensorsModel::Find(std::string_view name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return absl::NotFoundError(
        absl::StrCat("tensor ", std::string(name), " is not in the model at ", dir_));
  }
  return it->second;
}

absl::StatusOr<std::vector<int64_t>> SafetensorsModel::Shape(std::string_view name) const {
  ASSIGN_OR_RETURN(Entry e, Find(name));
  return e.info->shape;
}

bool SafetensorsModel::Contains(std::string_view name) const { return entries_.contains(name); }

std::vector<std::string> SafetensorsModel::TensorNames() const {
  std::vector<std::string> names;
  for (const auto& [name, e] : entries_) names.push_back(name);
  return names;
}

absl::Status SafetensorsModel::ReadAsF32(std::string_view name, std::span<float> out) const {
  ASSIGN_OR_RETURN(Entry e, Find(name));
  return llm::ReadAsF32(*e.file, *e.info, out);
}

absl::Status SafetensorsModel::ReadSlice(std::string_view name, int dim, int64_t begin, int64_t end,
                                         StDType out_dtype, std::span<std::byte> out) const {
  ASSIGN_OR_RETURN(Entry e, Find(name));
  return llm::ReadSlice(*e.file, *e.info, dim, begin, end, out_dtype, out);
}

absl::Status SafetensorsModel::ReadSliceAsF32(std::string_view name, int dim, int64_t begin,
                                              int64_t end, std::span<float> out) const {
  ASSIGN_OR_RETURN(Entry e, Find(name));
  return llm::ReadSliceAsF32(*e.file, *e.info, dim, begin, end, out);
}

}  // namespace llm
