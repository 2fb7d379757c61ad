#include "scheduler_service/tokenizer/byte_level.h"

#include <array>
#include <cstdint>

#include "common/utf8.h"

namespace llm {
namespace {

struct Tables {
  std::array<std::string, 256> byte_to_char;
  // Code points 0..323 cover the whole alphabet; -1 marks code points outside it.
  std::array<int16_t, 324> char_to_byte;
};

const Tables& GetTables() {
  static const Tables* tables = [] {
    auto* t = new Tables();
    t->char_to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cp = printable ? b : 256 + n++;
      AppendUtf8(cp, &t->byte_to_char[b]);
      t->char_to_byte[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return *tables;
}

}  // namespace

void AppendByteLevelChars(std::string_view text, std::string* out) {
  const Tables& t = GetTables();
  out->reserve(out->size() + text.size() * 2);
  for (const char c : text) out->append(t.byte_to_char[static_cast<unsigned char>(c)]);
}

bool AppendBytesOfByteLevelToken(std::string_view token, std::string* out) {
  const Tables& t = GetTables();
  const size_t old_size = out->size();
  size_t pos = 0;
  while (pos < token.size()) {
    const auto lead = static_cast<unsigned char>(token[pos]);
    if (lead < 0x80) {
      if (t.char_to_byte[lead] < 0) break;
      out->push_back(static_cast<char>(t.char_to_byte[lead]));
      ++pos;
      continue;
    }
    const uint32_t cp = NextCodePoint(token, &pos);
    if (cp >= t.char_to_byte.size() || t.char_to_byte[cp] < 0) {
      pos = std::string_view::npos;
      break;
    }
    out->push_back(static_cast<char>(t.char_to_byte[cp]));
  }
  if (pos != token.size()) {
    out->resize(old_size);
    return false;
  }
  return true;
}

}  // namespace llm
