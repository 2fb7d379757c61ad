// GgufFile (header, metadata, tensor infos, bounds checks) and the dequantizer against
// gguf-py's own dequantization (fixtures by tools/models/make_gguf_fixtures.py).
#include "common/gguf.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/gguf_dequant.h"
#include "tests/testing/gguf_builder.h"

namespace llm {
namespace {

using ::testing::HasSubstr;

const std::string kData = LLM_TEST_DATA_DIR;
const std::string kF16Model = kData + "/models/fortune-llama-f16.gguf";

std::vector<std::byte> ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  return b;
}

using Builder = ::llm::testing::GgufBuilder;

TEST(GgufFileTest, ReadsTheTinyModel) {
  auto f = GgufFile::Open(kF16Model);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ((*f)->alignment(), 32u);
  EXPECT_EQ((*f)->data_offset() % 32, 0u);
  EXPECT_EQ(*(*f)->GetString("general.architecture"), "llama");
  EXPECT_EQ(*(*f)->GetInt("llama.embedding_length"), 256);
  EXPECT_EQ(*(*f)->GetInt("llama.block_count"), 4);
  EXPECT_NEAR(*(*f)->GetNumber("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-12);
  const GgufValue* tokens = (*f)->Find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->type, GgufValueType::kArray);
  EXPECT_EQ(tokens->elem_type, GgufValueType::kString);
  ASSERT_EQ(tokens->array.size(), 2048u);
  EXPECT_EQ(tokens->array[0].s, "<|begin_of_text|>");
  // 4 layers x 9 tensors + embedding + final norm (tied: no output.weight).
  EXPECT_EQ((*f)->tensors().size(), 38u);
  const GgufTensorInfo* e = (*f)->FindTensor("token_embd.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->type, GgmlType::kF16);
  EXPECT_EQ(e->dims, (std::vector<int64_t>{256, 2048}));
  EXPECT_EQ(e->shape(), (std::vector<int64_t>{2048, 256}));
  EXPECT_EQ(e->nbytes, 2048u * 256 * 2);
  EXPECT_EQ((*f)->FindTensor("output.weight"), nullptr);
  EXPECT_EQ((*f)->GetString("llama.block_count").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*f)->GetInt("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(GgufFileTest, EveryTruncationIsAnErrorNamingAnOffset) {
  const std::vector<std::byte> image = ReadAll(kF16Model);
  ASSERT_GT(image.size(), 100000u);
  std::vector<size_t> cuts;
  for (size_t n = 0; n < 64; ++n) cuts.push_back(n);
  for (size_t n = 64; n < image.size(); n += 4099) cuts.push_back(n);
  cuts.push_back(image.size() - 1);
  for (size_t n : cuts) {
    auto f = GgufFile::FromBuffer(std::span<const std::byte>(image.data(), n), "cut");
    ASSERT_FALSE(f.ok()) << "cut at " << n;
    EXPECT_THAT(std::string(f.status().message()), HasSubstr("offset")) << f.status();
  }
}

TEST(GgufFileTest, BadMagicAndVersion) {
  Builder b;
  b.Put<uint32_t>(0x12345678).Put<uint32_t>(3).Put<uint64_t>(0).Put<uint64_t>(0);
  auto f = GgufFile::FromBuffer(b.b, "m");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("byte offset 0: bad magic"));
  Builder v;
  v.Header(1, 0, 0);
  f = GgufFile::FromBuffer(v.b, "v");
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("byte offset 4: version 1"));
  Builder ok;
  ok.Header(2, 0, 0);
  EXPECT_TRUE(GgufFile::FromBuffer(ok.b, "v2").ok());
}

TEST(GgufFileTest, HugeCountsAreRefusedWithoutAllocating) {
  Builder b;
  b.Header(3, 0, 1).Str("k").Put<uint32_t>(9).Put<uint32_t>(0).Put<uint64_t>(1ull << 60);
  auto f = GgufFile::FromBuffer(b.b, "h");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss);
  // 24 (header) + 9 (key) + 4 (type) + 4 (element type): the count.
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("byte offset 41"));
  Builder s;
  s.Header(3, 0, 1).Put<uint64_t>(~0ull).Put<uint64_t>(0);
  f = GgufFile::FromBuffer(s.b, "s");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("byte offset 24"));
  Builder n;
  n.Header(3, 1ull << 40, 0);
  f = GgufFile::FromBuffer(n.b, "n");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss);
}

TEST(GgufFileTest, AllValueTypesAndNestedArrays) {
  Builder b;
  b.Header(3, 0, 5);
  b.Str("a.u8").Put<uint32_t>(0).Put<uint8_t>(200);
  b.Str("a.i16").Put<uint32_t>(3).Put<int16_t>(-300);
  b.Str("a.f64").Put<uint32_t>(12).Put<double>(2.5);
  b.Str("a.bool").Put<uint32_t>(7).Put<uint8_t>(1);
  // [[1, 2], [3]] as arrays of i32.
  b.Str("a.nested").Put<uint32_t>(9).Put<uint32_t>(9).Put<uint64_t>(2);
  b.Put<uint32_t>(5).Put<uint64_t>(2).Put<int32_t>(1).Put<int32_t>(2);
  b.Put<uint32_t>(5).Put<uint64_t>(1).Put<int32_t>(3);
  auto f = GgufFile::FromBuffer(b.b, "t");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*(*f)->GetInt("a.u8"), 200);
  EXPECT_EQ(*(*f)->GetInt("a.i16"), -300);
  EXPECT_EQ(*(*f)->GetNumber("a.f64"), 2.5);
  EXPECT_EQ(*(*f)->GetInt("a.bool"), 1);
  const GgufValue* n = (*f)->Find("a.nested");
  ASSERT_NE(n, nullptr);
  ASSERT_EQ(n->array.size(), 2u);
  EXPECT_EQ(n->array[0].array[1].i, 2);
  EXPECT_EQ(n->array[1].array[0].i, 3);
  // An unknown value type names its offset.
  Builder u;
  u.Header(3, 0, 1).Str("x").Put<uint32_t>(13).Put<uint32_t>(0);
  f = GgufFile::FromBuffer(u.b, "u");
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("byte offset 33"));
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("value type 13"));
}

TEST(GgufFileTest, TensorInfosAreChecked) {
  // One Q8_0 tensor of 64 x 2 (4 blocks of 34 bytes) at data offset 0, alignment 64.
  auto make = [](uint64_t dim0, uint32_t type, uint64_t offset, size_t data_bytes) {
    Builder b;
    b.Header(3, 1, 1).Str("general.alignment").Put<uint32_t>(4).Put<uint32_t>(64);
    b.Str("w").Put<uint32_t>(2).Put<uint64_t>(dim0).Put<uint64_t>(2).Put<uint32_t>(type);
    b.Put<uint64_t>(offset);
    b.PadTo(64);
    b.b.resize(b.b.size() + data_bytes);
    return b.b;
  };
  auto image = make(64, 8, 0, 136);
  auto f = GgufFile::FromBuffer(image, "ok");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->alignment(), 64u);
  const GgufTensorInfo& t = (*f)->tensors()[0];
  EXPECT_EQ(t.nbytes, 136u);
  EXPECT_EQ(t.offset, (*f)->data_offset());
  EXPECT_EQ(t.offset % 64, 0u);

  image = make(64, 8, 0, 135);
  f = GgufFile::FromBuffer(image, "short");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("run past the end"));
  image = make(48, 8, 0, 136);
  f = GgufFile::FromBuffer(image, "row");
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("not a multiple of Q8_0's block"));
  image = make(64, 77, 0, 136);
  f = GgufFile::FromBuffer(image, "type");
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("unknown ggml type 77"));
  image = make(64, 8, 32, 200);
  f = GgufFile::FromBuffer(image, "align");
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("not a multiple of the alignment"));
  image = make(1ull << 62, 8, 0, 136);
  f = GgufFile::FromBuffer(image, "dim");
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("does not fit a file"));
}

class DequantTest : public ::testing::TestWithParam<std::pair<const char*, GgmlType>> {};

// Bit-for-bit equal to gguf.quants.dequantize (0 ulp).
TEST_P(DequantTest, EqualsGgufPy) {
  const auto [name, type] = GetParam();
  const std::vector<std::byte> raw = ReadAll(kData + "/gguf/dequant_" + name + ".bin");
  const std::vector<std::byte> want_bytes = ReadAll(kData + "/gguf/dequant_" + name + ".f32");
  ASSERT_FALSE(raw.empty());
  ASSERT_EQ(want_bytes.size() % 4, 0u);
  std::vector<float> want(want_bytes.size() / 4), got(want.size());
  std::memcpy(want.data(), want_bytes.data(), want_bytes.size());
  ASSERT_TRUE(DequantizeToF32(type, raw, got).ok());
  int mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    if (a != b && ++mismatches <= 5) {
      ADD_FAILURE() << name << " element " << i << ": got " << got[i] << ", gguf-py " << want[i];
    }
  }
  EXPECT_EQ(mismatches, 0);
  // A wrong size names both.
  got.resize(got.size() - 1);
  const absl::Status s = DequantizeToF32(type, raw, got);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(
    Types, DequantTest,
    ::testing::Values(std::pair{"F16", GgmlType::kF16}, std::pair{"BF16", GgmlType::kBF16},
                      std::pair{"Q8_0", GgmlType::kQ8_0}, std::pair{"Q4_0", GgmlType::kQ4_0},
                      std::pair{"Q4_1", GgmlType::kQ4_1}, std::pair{"Q4_K", GgmlType::kQ4_K},
                      std::pair{"Q5_K", GgmlType::kQ5_K}, std::pair{"Q6_K", GgmlType::kQ6_K},
                      std::pair{"Q5_0", GgmlType::kQ5_0}, std::pair{"Q5_1", GgmlType::kQ5_1},
                      std::pair{"Q2_K", GgmlType::kQ2_K}, std::pair{"Q3_K", GgmlType::kQ3_K},
                      std::pair{"IQ4_NL", GgmlType::kIQ4_NL},
                      std::pair{"IQ4_XS", GgmlType::kIQ4_XS}),
    [](const auto& info) { return std::string(info.param.first); });

TEST(DequantTest, UnsupportedTypeIsNamed) {
  std::vector<std::byte> raw(66);
  std::vector<float> out(256);
  const absl::Status s = DequantizeToF32(GgmlType::kIQ2_XXS, raw, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("IQ2_XXS"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("Q5_0"));  // among the supported ones
  EXPECT_FALSE(GgmlTypeCanDequantize(GgmlType::kQ8_1));
  EXPECT_FALSE(GgmlTypeCanDequantize(static_cast<GgmlType>(77)));
}

}  // namespace
}  // namespace llm
