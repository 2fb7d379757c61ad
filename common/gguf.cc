#include "common/gguf.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace llm {
namespace {

constexpr int kMaxArrayDepth = 8;
constexpr int kMaxDims = 4;  // GGML_MAX_DIMS

// Smallest encoded size of one value of type t (for capping counts by the bytes left).
size_t MinValueBytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kU16:
    case GgufValueType::kI16:
      return 2;
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kF32:
      return 4;
    case GgufValueType::kU64:
    case GgufValueType::kI64:
    case GgufValueType::kF64:
    case GgufValueType::kString:
      return 8;
    case GgufValueType::kArray:
      return 12;
  }
  return 0;
}

bool KnownValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kF64); }

// A bounds-checked little-endian cursor over the file image.
class Reader {
 public:
  Reader(std::span<const std::byte> bytes, const std::string& name) : b_(bytes), name_(name) {}

  size_t pos() const { return pos_; }
  size_t left() const { return b_.size() - pos_; }

  absl::Status Truncated(size_t at, size_t need, const std::string& what) const {
    return absl::DataLossError(absl::StrCat("gguf ", name_, ": truncated at byte offset ", at, ": ",
                                            what, " needs ", need, " bytes, the file has ",
                                            b_.size() - at, " left (file size ", b_.size(), ")"));
  }
  absl::Status Invalid(size_t at, const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("gguf ", name_, ": at byte offset ", at, ": ", what));
  }

  template <typename T>
  absl::Status Read(T* out, const std::string& what) {
    if (left() < sizeof(T)) return Truncated(pos_, sizeof(T), what);
    std::memcpy(out, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::Status ReadString(std::string* out, const std::string& what) {
    const size_t at = pos_;
    uint64_t len = 0;
    RETURN_IF_ERROR(Read(&len, what));
    if (len > left()) {
      return Truncated(at, len + 8, absl::StrCat(what, " (a string of ", len, " bytes)"));
    }
    out->assign(reinterpret_cast<const char*>(b_.data() + pos_), len);
    pos_ += len;
    return absl::OkStatus();
  }

  absl::Status ReadValue(GgufValueType type, GgufValue* v, int depth, const std::string& what) {
    v->type = type;
    switch (type) {
      case GgufValueType::kU8: {
        uint8_t x;
        RETURN_IF_ERROR(Read(&x, what));
        v->i = x, v->u = x;
        return absl::OkStatus();
      }
      case GgufValueType::kI8: {
        int8_t x;
        RETURN_IF_ERROR(Read(&x, what));
        v->i = x, v->u = static_cast<uint64_t>(x);
        return absl::OkStatus();
      }
      case GgufValueType::kBool: {
        const size_t at = pos_;
        uint8_t x;
        RETURN_IF_ERROR(Read(&x, what));
        if (x > 1) return Invalid(at, absl::StrCat(what, ": a bool must be 0 or 1, got ", x));
        v->i = x, v->u = x;
        return absl::OkStatus();
      }
      case GgufValueType::kU16: {
        uint16_t x;
        RETURN_IF_ERROR(Read(&x, what));
        v->i = x, v->u = x;
        return absl::OkStatus();
      }
      case GgufValueType::kI16: {
        int16_t x;
        RETURN_IF_ERROR(Read(&x, what));
        v->i = x, v->u = static_cast<uint64_t>(x);
        return absl::OkStatus();
      }
      case GgufValueType::kU32: {
        uint32_t x;
        RETURN_IF_ERROR(Read(&x, what));
        v->i = x, v->u = x;
        return absl::OkStatus();
      }
      case GgufValueType::kI32: {
        int32_t x;
        RETURN_IF_ERROR(Read(&x, what));
        v->i = x, v->u = static_cast<uint64_t>(x);
        return absl::OkStatus();
      }
      case GgufValueType::kU64: {
        uint64_t x;
        RETURN_IF_ERROR(Read(&x, what));
        v->u = x, v->i = static_cast<int64_t>(x);
        return absl::OkStatus();
      }
      case GgufValueType::kI64: {
        int64_t x;
        RETURN_IF_ERROR(Read(&x, what));
        v->i = x, v->u = static_cast<uint64_t>(x);
        return absl::OkStatus();
      }
      case GgufValueType::kF32: {
        float x;
        RETURN_IF_ERROR(Read(&x, what));
        v->f = x;
        return absl::OkStatus();
      }
      case GgufValueType::kF64: {
        double x;
        RETURN_IF_ERROR(Read(&x, what));
        v->f = x;
        return absl::OkStatus();
      }
      case GgufValueType::kString:
        return ReadString(&v->s, what);
      case GgufValueType::kArray: {
        const size_t at = pos_;
        uint32_t et = 0;
        RETURN_IF_ERROR(Read(&et, what));
        if (!KnownValueType(et)) {
          return Invalid(at, absl::StrCat(what, ": array element type ", et,
                                          " is not a GGUF value type (0..12)"));
        }
        if (depth >= kMaxArrayDepth) {
          return Invalid(at, absl::StrCat(what, ": arrays nested deeper than ", kMaxArrayDepth));
        }
        const size_t count_at = pos_;
        uint64_t count = 0;
        RETURN_IF_ERROR(Read(&count, what));
        const size_t min = MinValueBytes(static_cast<GgufValueType>(et));
        if (count > left() / min) {
          return absl::DataLossError(absl::StrCat(
              "gguf ", name_, ": truncated at byte offset ", count_at, ": ", what, ": an array of ",
              count, " elements of type ", GgufValueTypeName(static_cast<GgufValueType>(et)),
              " cannot fit in the ", left(), " bytes left (file size ", b_.size(), ")"));
        }
        v->elem_type = static_cast<GgufValueType>(et);
        v->array.resize(count);
        for (uint64_t k = 0; k < count; ++k) {
          RETURN_IF_ERROR(ReadValue(v->elem_type, &v->array[k], depth + 1, what));
        }
        return absl::OkStatus();
      }
    }
    return Invalid(pos_, "unknown value type");
  }

  void Seek(size_t p) { pos_ = p; }

 private:
  std::span<const std::byte> b_;
  const std::string& name_;
  size_t pos_ = 0;
};

}  // namespace

const char* GgufValueTypeName(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8:
      return "u8";
    case GgufValueType::kI8:
      return "i8";
    case GgufValueType::kU16:
      return "u16";
    case GgufValueType::kI16:
      return "i16";
    case GgufValueType::kU32:
      return "u32";
    case GgufValueType::kI32:
      return "i32";
    case GgufValueType::kF32:
      return "f32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kU64:
      return "u64";
    case GgufValueType::kI64:
      return "i64";
    case GgufValueType::kF64:
      return "f64";
  }
  return "unknown";
}

std::string GgmlTypeName(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
      return "F32";
    case GgmlType::kF16:
      return "F16";
    case GgmlType::kQ4_0:
      return "Q4_0";
    case GgmlType::kQ4_1:
      return "Q4_1";
    case GgmlType::kQ5_0:
      return "Q5_0";
    case GgmlType::kQ5_1:
      return "Q5_1";
    case GgmlType::kQ8_0:
      return "Q8_0";
    case GgmlType::kQ8_1:
      return "Q8_1";
    case GgmlType::kQ2_K:
      return "Q2_K";
    case GgmlType::kQ3_K:
      return "Q3_K";
    case GgmlType::kQ4_K:
      return "Q4_K";
    case GgmlType::kQ5_K:
      return "Q5_K";
    case GgmlType::kQ6_K:
      return "Q6_K";
    case GgmlType::kQ8_K:
      return "Q8_K";
    case GgmlType::kIQ2_XXS:
      return "IQ2_XXS";
    case GgmlType::kIQ2_XS:
      return "IQ2_XS";
    case GgmlType::kIQ3_XXS:
      return "IQ3_XXS";
    case GgmlType::kIQ1_S:
      return "IQ1_S";
    case GgmlType::kIQ4_NL:
      return "IQ4_NL";
    case GgmlType::kIQ3_S:
      return "IQ3_S";
    case GgmlType::kIQ2_S:
      return "IQ2_S";
    case GgmlType::kIQ4_XS:
      return "IQ4_XS";
    case GgmlType::kI8:
      return "I8";
    case GgmlType::kI16:
      return "I16";
    case GgmlType::kI32:
      return "I32";
    case GgmlType::kI64:
      return "I64";
    case GgmlType::kF64:
      return "F64";
    case GgmlType::kIQ1_M:
      return "IQ1_M";
    case GgmlType::kBF16:
      return "BF16";
  }
  return absl::StrCat("type ", static_cast<uint32_t>(t));
}

std::pair<int64_t, int64_t> GgmlBlockLayout(GgmlType t) {
  // ggml's type_traits (ggml.c) / gguf-py's GGML_QUANT_SIZES, by type number.
  static constexpr std::pair<int64_t, int64_t> kLayouts[] = {
      {1, 4},      // 0 F32
      {1, 2},      // 1 F16
      {32, 18},    // 2 Q4_0
      {32, 20},    // 3 Q4_1
      {0, 0},      // 4 (removed Q4_2)
      {0, 0},      // 5 (removed Q4_3)
      {32, 22},    // 6 Q5_0
      {32, 24},    // 7 Q5_1
      {32, 34},    // 8 Q8_0
      {32, 40},    // 9 Q8_1
      {256, 84},   // 10 Q2_K
      {256, 110},  // 11 Q3_K
      {256, 144},  // 12 Q4_K
      {256, 176},  // 13 Q5_K
      {256, 210},  // 14 Q6_K
      {256, 292},  // 15 Q8_K
      {256, 66},   // 16 IQ2_XXS
      {256, 74},   // 17 IQ2_XS
      {256, 98},   // 18 IQ3_XXS
      {256, 50},   // 19 IQ1_S
      {32, 18},    // 20 IQ4_NL
      {256, 110},  // 21 IQ3_S
      {256, 82},   // 22 IQ2_S
      {256, 136},  // 23 IQ4_XS
      {1, 1},      // 24 I8
      {1, 2},      // 25 I16
      {1, 4},      // 26 I32
      {1, 8},      // 27 I64
      {1, 8},      // 28 F64
      {256, 56},   // 29 IQ1_M
      {1, 2},      // 30 BF16
  };
  const auto i = static_cast<uint32_t>(t);
  if (i >= std::size(kLayouts)) return {0, 0};
  return kLayouts[i];
}

bool GgufValue::is_int() const {
  switch (type) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kU16:
    case GgufValueType::kI16:
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kU64:
    case GgufValueType::kI64:
    case GgufValueType::kBool:
      return true;
    default:
      return false;
  }
}

std::optional<double> GgufValue::AsNumber() const {
  if (is_float()) return f;
  if (type == GgufValueType::kU64) return static_cast<double>(u);
  if (is_int()) return static_cast<double>(i);
  return std::nullopt;
}

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  absl::StatusOr<MappedFile> mapped = MappedFile::Open(path, "gguf");
  if (!mapped.ok()) return mapped.status();
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->mapped_ = *std::move(mapped);
  f->bytes_ = f->mapped_.bytes();
  RETURN_IF_ERROR(f->Parse());
  return f;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBuffer(std::span<const std::byte> bytes,
                                                               std::string name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = std::move(name);
  f->bytes_ = bytes;
  RETURN_IF_ERROR(f->Parse());
  return f;
}

GgufFile::~GgufFile() = default;

absl::Status GgufFile::Parse() {
  Reader r(bytes_, path_);
  uint32_t magic = 0;
  RETURN_IF_ERROR(r.Read(&magic, "the magic"));
  if (magic != kMagic) {
    return r.Invalid(0, absl::StrCat("bad magic: expected \"GGUF\" (0x46554747), got 0x",
                                     absl::Hex(magic, absl::kZeroPad8)));
  }
  RETURN_IF_ERROR(r.Read(&version_, "the version"));
  if (version_ != 2 && version_ != 3) {
    return r.Invalid(4, absl::StrCat("version ", version_, " is not supported (expected 2 or 3)"));
  }
  uint64_t n_tensors = 0, n_kv = 0;
  RETURN_IF_ERROR(r.Read(&n_tensors, "the tensor count"));
  RETURN_IF_ERROR(r.Read(&n_kv, "the metadata count"));
  // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes, a tensor info at
  // least 8 + 4 + 4 + 8.
  if (n_kv > r.left() / 13) {
    return absl::DataLossError(absl::StrCat("gguf ", path_, ": truncated at byte offset 16: ", n_kv,
                                            " metadata entries cannot fit in the ", r.left(),
                                            " bytes left (file size ", bytes_.size(), ")"));
  }
  if (n_tensors > r.left() / 24) {
    return absl::DataLossError(absl::StrCat("gguf ", path_, ": truncated at byte offset 8: ",
                                            n_tensors, " tensor infos cannot fit in the ", r.left(),
                                            " bytes left (file size ", bytes_.size(), ")"));
  }
  metadata_.reserve(n_kv);
  size_t alignment_at = 0;
  for (uint64_t k = 0; k < n_kv; ++k) {
    const size_t at = r.pos();
    std::string key;
    RETURN_IF_ERROR(r.ReadString(&key, absl::StrCat("metadata key #", k)));
    const size_t type_at = r.pos();
    uint32_t type = 0;
    RETURN_IF_ERROR(r.Read(&type, absl::StrCat("the type of metadata \"", key, "\"")));
    if (!KnownValueType(type)) {
      return r.Invalid(type_at, absl::StrCat("metadata \"", key, "\": value type ", type,
                                             " is not a GGUF value type (0..12)"));
    }
    if (key == "general.alignment") alignment_at = type_at;
    GgufValue v;
    RETURN_IF_ERROR(r.ReadValue(static_cast<GgufValueType>(type), &v, 0,
                                absl::StrCat("metadata \"", key, "\"")));
    if (meta_index_.count(key) != 0) {
      return r.Invalid(at, absl::StrCat("duplicate metadata key \"", key, "\""));
    }
    meta_index_.emplace(key, metadata_.size());
    metadata_.emplace_back(std::move(key), std::move(v));
  }
  if (const GgufValue* a = Find("general.alignment"); a != nullptr) {
    if (a->type != GgufValueType::kU32 || a->u == 0 || (a->u & (a->u - 1)) != 0) {
      return r.Invalid(alignment_at,
                       absl::StrCat("general.alignment must be a u32 power of two, got ",
                                    GgufValueTypeName(a->type), " ",
                                    a->is_int() ? absl::StrCat(a->i) : std::string()));
    }
    alignment_ = static_cast<uint32_t>(a->u);
  }

  struct Raw {
    size_t at;
    uint64_t offset;
  };
  std::vector<Raw> raw;
  tensors_.reserve(n_tensors);
  raw.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    const size_t at = r.pos();
    GgufTensorInfo t;
    RETURN_IF_ERROR(r.ReadString(&t.name, absl::StrCat("the name of tensor #", k)));
    const std::string what = absl::StrCat("tensor \"", t.name, "\"");
    const size_t ndims_at = r.pos();
    uint32_t n_dims = 0;
    RETURN_IF_ERROR(r.Read(&n_dims, what + " dims count"));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return r.Invalid(
          ndims_at, absl::StrCat(what, ": expected 1 to ", kMaxDims, " dimensions, got ", n_dims));
    }
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const size_t dim_at = r.pos();
      uint64_t dim = 0;
      RETURN_IF_ERROR(r.Read(&dim, what + " dims"));
      // The element count is bounded by 8 x the file size (no type takes under a bit).
      if (dim == 0 || dim > bytes_.size() * 8 ||
          static_cast<uint64_t>(numel) > (bytes_.size() * 8) / dim) {
        return r.Invalid(dim_at,
                         absl::StrCat(what, ": dimension ", d, " is ", dim,
                                      ", which does not fit a file of ", bytes_.size(), " bytes"));
      }
      numel *= static_cast<int64_t>(dim);
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    const size_t type_at = r.pos();
    uint32_t type = 0;
    RETURN_IF_ERROR(r.Read(&type, what + " type"));
    t.type = static_cast<GgmlType>(type);
    const auto [block, block_bytes] = GgmlBlockLayout(t.type);
    if (block == 0) {
      return r.Invalid(type_at, absl::StrCat(what, ": unknown ggml type ", type));
    }
    if (t.dims[0] % block != 0) {
      return r.Invalid(type_at,
                       absl::StrCat(what, ": row length ", t.dims[0], " is not a multiple of ",
                                    GgmlTypeName(t.type), "'s block of ", block));
    }
    t.nbytes = static_cast<size_t>(numel / block * block_bytes);
    uint64_t offset = 0;
    RETURN_IF_ERROR(r.Read(&offset, what + " offset"));
    if (offset % alignment_ != 0) {
      return r.Invalid(r.pos() - 8,
                       absl::StrCat(what, ": data offset ", offset,
                                    " is not a multiple of the alignment ", alignment_));
    }
    if (tensor_index_.count(t.name) != 0) {
      return r.Invalid(at, absl::StrCat("duplicate tensor name \"", t.name, "\""));
    }
    tensor_index_.emplace(t.name, tensors_.size());
    raw.push_back({r.pos() - 8, offset});
    tensors_.push_back(std::move(t));
  }
  data_offset_ = (r.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (!tensors_.empty() && data_offset_ > bytes_.size()) {
    return r.Truncated(r.pos(), data_offset_ - r.pos(), "the padding before the tensor data");
  }
  const size_t data_size = bytes_.size() - std::min(data_offset_, bytes_.size());
  for (size_t k = 0; k < tensors_.size(); ++k) {
    GgufTensorInfo& t = tensors_[k];
    if (raw[k].offset > data_size || t.nbytes > data_size - raw[k].offset) {
      return absl::DataLossError(
          absl::StrCat("gguf ", path_, ": tensor \"", t.name, "\" (info at byte offset ", raw[k].at,
                       "): its ", t.nbytes, " bytes at data offset ", raw[k].offset,
                       " (file offset ", data_offset_ + raw[k].offset,
                       ") run past the end of the file (size ", bytes_.size(), ")"));
    }
    t.offset = data_offset_ + static_cast<size_t>(raw[k].offset);
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = meta_index_.find(key);
  return it == meta_index_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr)
    return absl::NotFoundError(absl::StrCat("gguf ", path_, ": no ", std::string(key)));
  if (v->type != GgufValueType::kString) {
    return absl::InvalidArgumentError(absl::StrCat("gguf ", path_, ": ", std::string(key),
                                                   ": expected a string, got ",
                                                   GgufValueTypeName(v->type)));
  }
  return v->s;
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr)
    return absl::NotFoundError(absl::StrCat("gguf ", path_, ": no ", std::string(key)));
  if (!v->is_int() || (v->type == GgufValueType::kU64 && v->i < 0)) {
    return absl::InvalidArgumentError(absl::StrCat("gguf ", path_, ": ", std::string(key),
                                                   ": expected an integer, got ",
                                                   GgufValueTypeName(v->type)));
  }
  return v->i;
}

absl::StatusOr<double> GgufFile::GetNumber(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr)
    return absl::NotFoundError(absl::StrCat("gguf ", path_, ": no ", std::string(key)));
  std::optional<double> x = v->AsNumber();
  if (!x.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("gguf ", path_, ": ", std::string(key),
                                                   ": expected a number, got ",
                                                   GgufValueTypeName(v->type)));
  }
  return *x;
}

}  // namespace llm
