// A little-endian GGUF image builder for the tests' crafted files: a header, keys and tensor
// infos written field by field (version 3 unless Header says otherwise), padded, then data.
//
//   GgufBuilder g;
//   g.Header(3, /*tensors=*/1, /*kvs=*/1).KeyString("general.architecture", "llama");
//   g.TensorInfo("token_embd.weight", {32, 2}, /*type=*/0, /*offset=*/0);
//   g.PadTo(32);
//   g.b.resize(g.b.size() + 256);
//   auto file = GgufFile::FromBuffer(g.b);  // g must outlive file
#ifndef LLM_TESTS_TESTING_GGUF_BUILDER_H_
#define LLM_TESTS_TESTING_GGUF_BUILDER_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "common/gguf.h"

namespace llm::testing {

struct GgufBuilder {
  std::vector<std::byte> b;

  template <typename T>
  GgufBuilder& Put(T v) {
    const size_t n = b.size();
    b.resize(n + sizeof(T));
    std::memcpy(b.data() + n, &v, sizeof(T));
    return *this;
  }
  // A GGUF string: its length (u64), then its bytes.
  GgufBuilder& Str(std::string_view s) {
    Put<uint64_t>(s.size());
    for (char c : s) b.push_back(static_cast<std::byte>(c));
    return *this;
  }
  GgufBuilder& Header(uint32_t version, uint64_t tensors, uint64_t kvs) {
    return Put<uint32_t>(GgufFile::kMagic).Put(version).Put(tensors).Put(kvs);
  }
  GgufBuilder& KeyU32(std::string_view key, uint32_t value) {
    return Str(key).Put(static_cast<uint32_t>(GgufValueType::kU32)).Put(value);
  }
  GgufBuilder& KeyString(std::string_view key, std::string_view value) {
    return Str(key).Put(static_cast<uint32_t>(GgufValueType::kString)).Str(value);
  }
  // An array of strings.
  GgufBuilder& KeyStrings(std::string_view key, std::initializer_list<std::string_view> values) {
    Str(key).Put(static_cast<uint32_t>(GgufValueType::kArray));
    Put(static_cast<uint32_t>(GgufValueType::kString)).Put<uint64_t>(values.size());
    for (std::string_view v : values) Str(v);
    return *this;
  }
  // A tensor info: name, dims in ggml order (dims[0] is the row length), ggml type, offset
  // from the start of the data section.
  GgufBuilder& TensorInfo(std::string_view name, std::initializer_list<uint64_t> dims,
                          uint32_t type, uint64_t offset) {
    Str(name).Put(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) Put(d);
    return Put(type).Put(offset);
  }
  void PadTo(size_t align) {
    while (b.size() % align != 0) b.push_back(std::byte{0});
  }
};

}  // namespace llm::testing

#endif  // LLM_TESTS_TESTING_GGUF_BUILDER_H_
