// libFuzzer target for the GGUF parser and dequantizer: any byte string is either parsed or
// refused with an error; nothing crashes, reads out of bounds or allocates without bound.
// Built only with clang and -DLLM_FUZZ=ON (tests/fuzz/CMakeLists.txt):
//   cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DLLM_FUZZ=ON
//   ninja -C build-fuzz gguf_fuzz
//   build-fuzz/tests/fuzz/gguf_fuzz -max_len=65536 tests/fuzz/corpus/gguf
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/gguf.h"
#include "common/gguf_dequant.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto file = llm::GgufFile::FromBuffer(bytes, "fuzz");
  if (!file.ok()) return 0;
  const llm::GgufFile& f = **file;
  for (const auto& [key, value] : f.metadata()) {
    (void)f.Find(key);
    (void)value.AsNumber();
  }
  (void)f.GetString("general.architecture");
  (void)f.GetInt("general.alignment");
  std::vector<float> out;
  for (const llm::GgufTensorInfo& t : f.tensors()) {
    const std::span<const std::byte> b = f.Bytes(t);
    if (!llm::GgmlTypeCanDequantize(t.type) || t.numel() > (1 << 20)) continue;
    out.resize(static_cast<size_t>(t.numel()));
    (void)llm::DequantizeToF32(t.type, b, out);
  }
  return 0;
}
