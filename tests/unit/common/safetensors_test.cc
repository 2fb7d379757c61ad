#include "common/safetensors.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace llm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

// Builds a safetensors image: tensors laid out in the order given.
class Writer {
 public:
  Writer& Add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
              const std::vector<uint8_t>& bytes) {
    header_[name] = {{"dtype", dtype},
                     {"shape", shape},
                     {"data_offsets", {data_.size(), data_.size() + bytes.size()}}};
    data_.insert(data_.end(), bytes.begin(), bytes.end());
    return *this;
  }
  Writer& AddF32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return Add(name, "F32", shape, b);
  }
  Writer& Add16(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
                const std::vector<uint16_t>& v) {
    std::vector<uint8_t> b(v.size() * 2);
    std::memcpy(b.data(), v.data(), b.size());
    return Add(name, dtype, shape, b);
  }
  nlohmann::json& header() { return header_; }
  std::vector<uint8_t>& data() { return data_; }

  std::vector<std::byte> Image() const { return ImageWithHeader(header_.dump()); }
  std::vector<std::byte> ImageWithHeader(const std::string& h) const {
    std::vector<std::byte> out(8 + h.size() + data_.size());
    uint64_t n = h.size();
    for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((n >> (8 * i)) & 0xFF);
    std::memcpy(out.data() + 8, h.data(), h.size());
    std::memcpy(out.data() + 8 + h.size(), data_.data(), data_.size());
    return out;
  }

 private:
  nlohmann::json header_ = nlohmann::json::object();
  std::vector<uint8_t> data_;
};

uint16_t Bf16(float f) { return static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16); }

absl::Status ParseStatus(const std::vector<std::byte>& image) {
  return SafetensorsFile::FromBuffer(image).status();
}

void WriteFile(const fs::path& path, const std::vector<std::byte>& image) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(image.data()), image.size());
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("llm_st_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

TEST(Safetensors, ReadsF32F16AndBf16AsF32) {
  Writer w;
  w.AddF32("a", {2, 3}, {1, 2, 3, 4, 5, -6.5f});
  // F16: 1.0, -2.0, 65504 (max), 2^-24 (smallest subnormal), -0, inf, nan
  w.Add16("h", "F16", {7}, {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8000, 0x7C00, 0x7E00});
  w.Add16("b", "BF16", {3}, {Bf16(1.5f), Bf16(-3.0f), Bf16(1e30f)});
  w.header()["__metadata__"] = {{"format", "pt"}};
  const std::vector<std::byte> image = w.Image();
  auto file = SafetensorsFile::FromBuffer(image);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  ASSERT_EQ((*file)->tensors().size(), 3u);

  std::vector<float> a(6);
  ASSERT_TRUE(ReadAsF32(**file, *(*file)->Find("a"), a).ok());
  EXPECT_THAT(a, ElementsAre(1, 2, 3, 4, 5, -6.5f));
  std::vector<float> h(7);
  ASSERT_TRUE(ReadAsF32(**file, *(*file)->Find("h"), h).ok());
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], 65504.0f);
  EXPECT_EQ(h[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(h[4], 0.0f);
  EXPECT_TRUE(std::signbit(h[4]));
  EXPECT_EQ(h[5], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(h[6]));
  std::vector<float> b(3);
  ASSERT_TRUE(ReadAsF32(**file, *(*file)->Find("b"), b).ok());
  EXPECT_EQ(b[0], 1.5f);
  EXPECT_EQ(b[1], -3.0f);
  EXPECT_NEAR(b[2], 1e30f, 1e28f);  // bf16 keeps 8 bits of mantissa
}

TEST(Safetensors, SlicesAreThePartsOfTheWholeTensor) {
  Writer w;
  std::vector<uint16_t> v(4 * 6);
  for (size_t i = 0; i < v.size(); ++i) v[i] = Bf16(static_cast<float>(i));
  w.Add16("w", "BF16", {4, 6}, v);
  const std::vector<std::byte> image = w.Image();
  auto file = SafetensorsFile::FromBuffer(image).value();
  const StTensorInfo& t = *file->Find("w");
  std::vector<float> rows(2 * 6);
  ASSERT_TRUE(ReadSliceAsF32(*file, t, 0, 1, 3, rows).ok());
  EXPECT_EQ(rows.front(), 6.0f);
  EXPECT_EQ(rows.back(), 17.0f);
  std::vector<float> cols(4 * 2);
  ASSERT_TRUE(ReadSliceAsF32(*file, t, 1, 4, 6, cols).ok());
  EXPECT_THAT(cols, ElementsAre(4, 5, 10, 11, 16, 17, 22, 23));
  EXPECT_THAT(ReadSliceAsF32(*file, t, 1, 4, 7, cols).message(), HasSubstr("slice [4, 7)"));
  EXPECT_THAT(ReadSliceAsF32(*file, t, 2, 0, 1, cols).message(),
              HasSubstr("cannot be sliced along dimension 2"));
}

TEST(Safetensors, UnsupportedDtypeForWeightsIsAClearError) {
  Writer w;
  w.Add("ids", "I64", {2}, std::vector<uint8_t>(16, 0));
  const std::vector<std::byte> image = w.Image();
  auto file = SafetensorsFile::FromBuffer(image).value();
  std::vector<float> out(2);
  const absl::Status s = ReadAsF32(*file, *file->Find("ids"), out);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("tensor ids has dtype I64"));
}

TEST(Safetensors, MalformedFilesAreRejectedWithAClearError) {
  Writer w;
  w.AddF32("x", {2}, {1, 2});
  w.AddF32("y", {1}, {3});
  const std::vector<std::byte> good = w.Image();
  ASSERT_TRUE(ParseStatus(good).ok());

  // Truncated: too short for the size, and shorter than the header claims.
  EXPECT_EQ(ParseStatus({good.begin(), good.begin() + 5}).code(), absl::StatusCode::kDataLoss);
  absl::Status s = ParseStatus({good.begin(), good.begin() + 20});
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("truncated"));
  // Truncated data section: a tensor now ends out of the file.
  s = ParseStatus({good.begin(), good.end() - 2});
  EXPECT_THAT(s.message(), HasSubstr("tensor y ends at byte 12 of a 10-byte data section"));

  // A header size over the 100 MB limit.
  std::vector<std::byte> huge = good;
  huge[3] = std::byte{0x10};  // 0x10000000 + ... bytes
  EXPECT_THAT(ParseStatus(huge).message(), HasSubstr("exceeds the limit"));

  EXPECT_THAT(ParseStatus(w.ImageWithHeader("{\"x\": ")).message(), HasSubstr("not valid JSON"));
  EXPECT_THAT(ParseStatus(w.ImageWithHeader("[1, 2]")).message(), HasSubstr("not a JSON object"));

  auto with = [&](const char* name, nlohmann::json value) {
    Writer copy = w;
    copy.header()[name] = std::move(value);
    return ParseStatus(copy.Image());
  };
  using J = nlohmann::json;
  EXPECT_THAT(with("x", J{{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 8}}}).message(),
              HasSubstr("tensor x has 8 bytes but dtype F32 x shape needs 12"));
  EXPECT_THAT(with("x", J{{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {4, 12}}}).message(),
              HasSubstr("overlap"));
  EXPECT_THAT(with("x", J{{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {8, 0}}}).message(),
              HasSubstr("end before they begin"));
  EXPECT_THAT(with("x", J{{"dtype", "Q4"}, {"shape", {2}}, {"data_offsets", {0, 8}}}).message(),
              HasSubstr("unknown dtype \"Q4\""));
  EXPECT_THAT(with("x", J{{"dtype", "F32"}, {"shape", {-2}}, {"data_offsets", {0, 8}}}).message(),
              HasSubstr("not a non-negative integer"));
  EXPECT_THAT(with("x", J{{"dtype", "F32"}, {"data_offsets", {0, 8}}}).message(),
              HasSubstr("tensor x has no shape array"));
  EXPECT_THAT(with("x", J{{"dtype", "F32"}, {"shape", {2}}}).message(),
              HasSubstr("no [begin, end] data_offsets"));
  EXPECT_THAT(
      with("x",
           J{{"dtype", "F32"}, {"shape", {1u << 31, 1u << 31, 1u << 31}}, {"data_offsets", {0, 8}}})
          .message(),
      HasSubstr("impossibly large shape"));
  EXPECT_THAT(with("__metadata__", J{{"k", 1}}).message(), HasSubstr("is not a string"));
}

TEST(Safetensors, RandomlyCorruptedHeadersNeverCrashTheParser) {
  Writer w;
  w.AddF32("model.layers.0.weight", {4, 4}, std::vector<float>(16, 1.0f));
  w.Add16("model.norm.weight", "BF16", {4}, {1, 2, 3, 4});
  const std::vector<std::byte> good = w.Image();
  std::mt19937 rng(12345);
  int accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<std::byte> image = good;
    const int kind = iter % 4;
    if (kind == 0) {  // flip bytes anywhere in the size field or the header
      const size_t header_end =
          8 + (static_cast<size_t>(good[0]) | static_cast<size_t>(good[1]) << 8);
      for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) {
        image[rng() % header_end] = static_cast<std::byte>(rng());
      }
    } else if (kind == 1) {  // truncate
      image.resize(rng() % image.size());
    } else if (kind == 2) {  // a digit of some number replaced
      for (size_t i = 8; i < image.size(); ++i) {
        if (std::isdigit(static_cast<int>(image[i])) && rng() % 8 == 0) {
          image[i] = static_cast<std::byte>('0' + rng() % 10);
        }
      }
    } else {  // random header size
      const uint64_t n = rng() % (good.size() + 16);
      for (int i = 0; i < 8; ++i) image[i] = static_cast<std::byte>((n >> (8 * i)) & 0xFF);
    }
    auto file = SafetensorsFile::FromBuffer(image);
    if (!file.ok()) continue;
    ++accepted;
    for (const StTensorInfo& t : (*file)->tensors()) {  // whatever it accepts is in bounds
      ASSERT_LE(t.offset + t.nbytes, image.size()) << t.name;
      ASSERT_EQ(t.nbytes, static_cast<size_t>(t.numel()) * StDTypeSize(t.dtype)) << t.name;
    }
  }
  EXPECT_GT(accepted, 0);  // some mutations (e.g. equal digits) leave a valid file
}

TEST(SafetensorsModel, OpensASingleFileAndShardsFromAnIndex) {
  TempDir single;
  Writer w;
  w.AddF32("a", {2}, {1, 2}).AddF32("b", {1}, {3});
  WriteFile(single.path() / "model.safetensors", w.Image());
  auto m = SafetensorsModel::Open(single.path().string());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->num_files(), 1);
  EXPECT_THAT((*m)->TensorNames(), ElementsAre("a", "b"));

  TempDir sharded;
  Writer w1, w2;
  w1.AddF32("a", {2}, {1, 2});
  w2.AddF32("b", {1}, {3});
  WriteFile(sharded.path() / "model-00001-of-00002.safetensors", w1.Image());
  WriteFile(sharded.path() / "model-00002-of-00002.safetensors", w2.Image());
  std::ofstream(sharded.path() / "model.safetensors.index.json")
      << R"({"metadata": {"total_size": 12}, "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors"}})";
  m = SafetensorsModel::Open(sharded.path().string());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->num_files(), 2);
  std::vector<float> b(1);
  ASSERT_TRUE((*m)->ReadAsF32("b", b).ok());
  EXPECT_EQ(b[0], 3.0f);
  EXPECT_THAT((*m)->ReadAsF32("c", b).message(), HasSubstr("tensor c is not in the model"));
}

TEST(SafetensorsModel, BadDirectoriesAndIndexesAreClearErrors) {
  TempDir empty;
  EXPECT_EQ(SafetensorsModel::Open(empty.path().string()).status().code(),
            absl::StatusCode::kNotFound);
  TempDir dir;
  Writer w;
  w.AddF32("a", {2}, {1, 2});
  WriteFile(dir.path() / "one.safetensors", w.Image());
  std::ofstream(dir.path() / "model.safetensors.index.json")
      << R"({"weight_map": {"a": "one.safetensors", "z": "one.safetensors"}})";
  EXPECT_THAT(SafetensorsModel::Open(dir.path().string()).status().message(),
              HasSubstr("lists z in one.safetensors, which does not hold it"));
  std::ofstream(dir.path() / "model.safetensors.index.json") << R"({"weight_map": 3})";
  EXPECT_THAT(SafetensorsModel::Open(dir.path().string()).status().message(),
              HasSubstr("weight_map"));
}

// Every weight of our models (tools/models) read by this reader sums to what torch read from
// the same files.
TEST(SafetensorsModel, ReadsWhatTorchWrote) {
  // tiny-llama: BF16 in 4 shards; tiny-qwen2: F32; the demo model (models/): F16.
  for (const std::string dir : {std::string(LLM_TEST_DATA_DIR) + "/models/tiny-llama",
                                std::string(LLM_TEST_DATA_DIR) + "/models/tiny-qwen2",
                                std::string(LLM_TEST_DATA_DIR) + "/../../models/fortune-llama"}) {
    SCOPED_TRACE(dir);
    std::ifstream in(dir + "/weights_checksum.json");
    ASSERT_TRUE(in.good());
    const nlohmann::json expected = nlohmann::json::parse(in);
    auto model = SafetensorsModel::Open(dir);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ((*model)->TensorNames().size(), expected.size());
    for (const auto& [tensor, want] : expected.items()) {
      auto entry = (*model)->Find(tensor);
      ASSERT_TRUE(entry.ok()) << entry.status();
      EXPECT_EQ(entry->info->shape, want["shape"].get<std::vector<int64_t>>()) << tensor;
      const std::string dtype = want["dtype"];
      const std::string want_dtype = dtype == "bfloat16"  ? "BF16"
                                     : dtype == "float16" ? "F16"
                                                          : "F32";
      EXPECT_EQ(StDTypeName(entry->info->dtype), want_dtype) << tensor;
      std::vector<float> v(entry->info->numel());
      ASSERT_TRUE((*model)->ReadAsF32(tensor, v).ok());
      double sum = 0, abs_sum = 0;
      for (float x : v) {
        sum += x;
        abs_sum += std::fabs(x);
      }
      const double tol = 1e-9 * want["abs_sum"].get<double>();
      EXPECT_NEAR(sum, want["sum"].get<double>(), tol) << tensor;
      EXPECT_NEAR(abs_sum, want["abs_sum"].get<double>(), tol) << tensor;
    }
  }
}

}  // namespace
}  // namespace llm
