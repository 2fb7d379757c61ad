// ByteSet: a set of byte values (0-255) as a 256-bit mask. The edges of the grammar's automaton
// are labelled with these, so that a character class such as [a-zA-Z_] is one test, not a list.
#ifndef LLM_STRUCTURED_BYTE_SET_H_
#define LLM_STRUCTURED_BYTE_SET_H_

#include <bit>
#include <cstdint>

namespace llm::structured {

class ByteSet {
 public:
  constexpr ByteSet() = default;

  static ByteSet Of(uint8_t b) {
    ByteSet s;
    s.Add(b);
    return s;
  }
  static ByteSet Range(uint8_t lo, uint8_t hi) {
    ByteSet s;
    s.AddRange(lo, hi);
    return s;
  }
  static ByteSet All() { return Range(0, 255); }

  void Add(uint8_t b) { words_[b >> 6] |= uint64_t{1} << (b & 63); }
  void AddRange(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) Add(static_cast<uint8_t>(b));
  }
  void AddAll(const ByteSet& other) {
    for (int i = 0; i < 4; ++i) words_[i] |= other.words_[i];
  }
  void Invert() {
    for (uint64_t& w : words_) w = ~w;
  }
  bool Contains(uint8_t b) const { return (words_[b >> 6] >> (b & 63)) & 1; }
  bool Empty() const { return (words_[0] | words_[1] | words_[2] | words_[3]) == 0; }
  int Count() const {
    int n = 0;
    for (uint64_t w : words_) n += std::popcount(w);
    return n;
  }
  // The 64 bits of bytes 64 * i to 64 * i + 63 (for hashing and ordering).
  uint64_t word(int i) const { return words_[i]; }
  bool operator==(const ByteSet& other) const = default;

 private:
  uint64_t words_[4] = {0, 0, 0, 0};
};

}  // namespace llm::structured

#endif  // LLM_STRUCTURED_BYTE_SET_H_
