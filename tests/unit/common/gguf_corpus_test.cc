// Replays the GGUF fuzzer's committed corpus (tests/fuzz/corpus/gguf: the seeds of
// tools/models/make_gguf_fuzz_corpus.py and inputs libFuzzer found) through the parser and
// the dequantizer, as tests/fuzz/gguf_fuzz.cc does: every file parses or is refused with an
// error naming a byte offset, never a crash; the intact seeds parse.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "common/gguf_dequant.h"
#include "gtest/gtest.h"

namespace llm {
namespace {

TEST(GgufCorpusTest, EveryFileParsesOrIsAClearError) {
  const std::filesystem::path dir =
      std::filesystem::path(LLM_TEST_DATA_DIR) / ".." / "fuzz" / "corpus" / "gguf";
  int files = 0, parsed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    ++files;
    std::ifstream in(entry.path(), std::ios::binary);
    const std::vector<char> c((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
    const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(c.data()), c.size());
    const std::string name = entry.path().filename().string();
    auto f = GgufFile::FromBuffer(bytes, name);
    const bool intact_seed = name.starts_with("seed_") && name.find("_cut") == std::string::npos;
    if (!f.ok()) {
      EXPECT_FALSE(intact_seed) << name << ": " << f.status();
      const std::string msg(f.status().message());
      EXPECT_NE(msg.find("byte offset"), std::string::npos) << name << ": " << msg;
      continue;
    }
    ++parsed;
    std::vector<float> out;
    for (const GgufTensorInfo& t : (*f)->tensors()) {
      if (!GgmlTypeCanDequantize(t.type) || t.numel() > (1 << 20)) continue;
      out.resize(static_cast<size_t>(t.numel()));
      EXPECT_TRUE(DequantizeToF32(t.type, (*f)->Bytes(t), out).ok()) << name << " " << t.name;
    }
  }
  EXPECT_GE(files, 20);
  EXPECT_GE(parsed, 14);
}

}  // namespace
}  // namespace llm
