#include "common/utf8.h"

#include <algorithm>

namespace llm {
namespace {

// The length of the valid sequence at s[pos], or 0 when it is ill-formed; in that case
// *bad_len is the length of its maximal subpart (at least 1), which becomes one U+FFFD.
size_t ValidSequenceAt(std::string_view s, size_t pos, size_t* bad_len) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  *bad_len = 1;
  if (b0 < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
  } else {
    return 0;
  }
  for (size_t i = 1; i < need; ++i) {
    if (pos + i >= s.size()) return 0;
    const auto b = static_cast<unsigned char>(s[pos + i]);
    const unsigned char min = i == 1 ? lo : 0x80;
    const unsigned char max = i == 1 ? hi : 0xBF;
    if (b < min || b > max) return 0;
    *bad_len = i + 1;
  }
  return need;
}

// The code point of the `len`-byte sequence at s[pos], from those of its bytes that `s` has.
uint32_t DecodeSequence(std::string_view s, size_t pos, size_t len) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  uint32_t cp = len == 1 ? b0 : len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t i = 1; i < len && pos + i < s.size(); ++i) {
    cp = (cp << 6) | (static_cast<unsigned char>(s[pos + i]) & 0x3F);
  }
  return cp;
}

}  // namespace

size_t ValidUtf8Prefix(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    // ASCII fast path, eight bytes at a time.
    while (pos + 8 <= s.size()) {
      uint64_t word = 0;
      for (int i = 0; i < 8; ++i)
        word |= static_cast<uint64_t>(static_cast<unsigned char>(s[pos + i]));
      if (word & 0x80) break;
      pos += 8;
    }
    if (pos >= s.size()) break;
    size_t bad_len;
    const size_t len = ValidSequenceAt(s, pos, &bad_len);
    if (len == 0) return pos;
    pos += len;
  }
  return s.size();
}

std::string Utf8Lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  size_t pos = 0;
  while (pos < s.size()) {
    size_t bad_len;
    const size_t len = ValidSequenceAt(s, pos, &bad_len);
    if (len == 0) {
      out.append(kReplacementChar);
      pos += bad_len;
    } else {
      out.append(s.substr(pos, len));
      pos += len;
    }
  }
  return out;
}

uint32_t NextCodePoint(std::string_view s, size_t* pos) {
  const size_t len = Utf8CharLength(static_cast<unsigned char>(s[*pos]));
  const uint32_t cp = DecodeSequence(s, *pos, len);
  *pos += len;
  return cp;
}

int32_t DecodeUtf8(std::string_view s, size_t* pos) {
  size_t bad_len;
  const size_t len = ValidSequenceAt(s, *pos, &bad_len);
  if (len == 0) {
    ++*pos;
    return -1;
  }
  const uint32_t cp = DecodeSequence(s, *pos, len);
  *pos += len;
  return static_cast<int32_t>(cp);
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::vector<std::string_view> SplitUtf8Chars(std::string_view s) {
  std::vector<std::string_view> chars;
  for (size_t pos = 0; pos < s.size();) {
    const auto lead = static_cast<unsigned char>(s[pos]);
    const size_t len = std::min(lead >= 0xF8 ? size_t{1} : Utf8CharLength(lead), s.size() - pos);
    chars.push_back(s.substr(pos, len));
    pos += len;
  }
  return chars;
}

uint32_t Utf8CharCodePoint(std::string_view ch) { return DecodeSequence(ch, 0, ch.size()); }

bool IsUnicodeWhitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

}  // namespace llm
