#include "scheduler_service/chat/jinja/unicode_case.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/utf8.h"
#include "scheduler_service/chat/jinja/python_string.h"

namespace llm::jinja {
namespace {

bool In(uint32_t c, uint32_t lo, uint32_t hi) { return c >= lo && c <= hi; }

// The simple (one code point) uppercase of c; c itself when it has none.
uint32_t Upper(uint32_t c) {
  if (In(c, 'a', 'z')) return c - 32;
  if (c < 0x80) return c;
  if (c == 0xb5) return 0x39c;
  if (In(c, 0xe0, 0xfe) && c != 0xf7) return c - 32;
  if (c == 0xff) return 0x178;
  if (In(c, 0x100, 0x17f)) {
    if (c == 0x131) return 'I';
    if (c == 0x17f) return 'S';
    if (c == 0x138 || c == 0x149) return c;
    // In these two runs the capital is the odd code point; elsewhere the even one.
    if (In(c, 0x139, 0x148) || In(c, 0x179, 0x17e)) return c % 2 == 0 ? c - 1 : c;
    return c % 2 == 1 ? c - 1 : c;
  }
  if (c == 0x1a1 || c == 0x1b0) return c - 1;  // Vietnamese ơ, ư
  if (In(c, 0x3b1, 0x3c9)) return c == 0x3c2 ? 0x3a3 : c - 32;
  if (c == 0x3ac) return 0x386;
  if (In(c, 0x3ad, 0x3af)) return c - 37;
  if (c == 0x3cc) return 0x38c;
  if (In(c, 0x3cd, 0x3ce)) return c - 63;
  if (In(c, 0x430, 0x44f)) return c - 32;
  if (In(c, 0x450, 0x45f)) return c - 80;
  if (In(c, 0x460, 0x481) || In(c, 0x48a, 0x4bf) || In(c, 0x4d0, 0x52f))
    return c % 2 == 1 ? c - 1 : c;
  if (In(c, 0x4c1, 0x4ce)) return c % 2 == 0 ? c - 1 : c;
  if (c == 0x4cf) return 0x4c0;
  if (In(c, 0x561, 0x586)) return c - 48;
  if (In(c, 0x1e00, 0x1e95) || In(c, 0x1ea0, 0x1eff)) return c % 2 == 1 ? c - 1 : c;
  if (In(c, 0xff41, 0xff5a)) return c - 32;
  return c;
}

// The simple lowercase of c; c itself when it has none.
uint32_t Lower(uint32_t c) {
  if (In(c, 'A', 'Z')) return c + 32;
  if (c < 0x80) return c;
  if (In(c, 0xc0, 0xde) && c != 0xd7) return c + 32;
  if (c == 0x178) return 0xff;
  if (In(c, 0x100, 0x17f)) {
    if (c == 0x130 || c == 0x131 || c == 0x138 || c == 0x149 || c == 0x17f) return c;
    if (In(c, 0x139, 0x148) || In(c, 0x179, 0x17e)) return c % 2 == 1 ? c + 1 : c;
    return c % 2 == 0 ? c + 1 : c;
  }
  if (c == 0x1a0 || c == 0x1af) return c + 1;
  if (In(c, 0x391, 0x3a9) && c != 0x3a2) return c + 32;
  if (c == 0x386) return 0x3ac;
  if (In(c, 0x388, 0x38a)) return c + 37;
  if (c == 0x38c) return 0x3cc;
  if (In(c, 0x38e, 0x38f)) return c + 63;
  if (In(c, 0x410, 0x42f)) return c + 32;
  if (In(c, 0x400, 0x40f)) return c + 80;
  if (In(c, 0x460, 0x481) || In(c, 0x48a, 0x4bf) || In(c, 0x4d0, 0x52f))
    return c % 2 == 0 ? c + 1 : c;
  if (In(c, 0x4c1, 0x4ce)) return c % 2 == 1 ? c + 1 : c;
  if (c == 0x4c0) return 0x4cf;
  if (In(c, 0x531, 0x556)) return c + 48;
  if (c == 0x1e9e) return 0xdf;
  if (In(c, 0x1e00, 0x1e95) || In(c, 0x1ea0, 0x1eff)) return c % 2 == 0 ? c + 1 : c;
  if (In(c, 0xff21, 0xff3a)) return c + 32;
  return c;
}

bool IsUpperCp(uint32_t c) { return Lower(c) != c || c == 0x130; }
bool IsLowerCp(uint32_t c) {
  return Upper(c) != c || c == 0xdf || c == 0x138 || c == 0x149 || c == 0x3c2;
}
bool IsCased(uint32_t c) { return IsUpperCp(c) || IsLowerCp(c); }

// Python's full mappings where they differ from the simple ones.
void AppendUpper(uint32_t c, std::string* out) {
  if (c == 0xdf) {
    *out += "SS";
  } else if (c == 0x149) {
    *out += "\u02bcN";
  } else {
    AppendUtf8(Upper(c), out);
  }
}

void AppendTitle(uint32_t c, std::string* out) {
  if (c == 0xdf) {
    *out += "Ss";
  } else {
    AppendUpper(c, out);
  }
}

// `final_sigma`: a capital sigma that ends a word (a cased letter before it, none after)
// lowers to the final form, as Python's str.lower does.
void AppendLower(uint32_t c, bool final_sigma, std::string* out) {
  if (c == 0x130) {
    *out += "i\u0307";
  } else if (c == 0x3a3 && final_sigma) {
    AppendUtf8(0x3c2, out);
  } else {
    AppendUtf8(Lower(c), out);
  }
}

std::vector<uint32_t> CodePoints(const std::string& s) {
  std::vector<uint32_t> out;
  for (std::string_view ch : SplitUtf8Chars(s)) out.push_back(Utf8CharCodePoint(ch));
  return out;
}

bool FinalSigma(const std::vector<uint32_t>& cps, size_t i) {
  if (cps[i] != 0x3a3) return false;
  return i > 0 && IsCased(cps[i - 1]) && (i + 1 >= cps.size() || !IsCased(cps[i + 1]));
}

}  // namespace

std::string PyUpper(const std::string& s) {
  std::string out;
  for (uint32_t c : CodePoints(s)) AppendUpper(c, &out);
  return out;
}

std::string PyLower(const std::string& s) {
  const std::vector<uint32_t> cps = CodePoints(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) AppendLower(cps[i], FinalSigma(cps, i), &out);
  return out;
}

std::string PyTitle(const std::string& s) {
  const std::vector<uint32_t> cps = CodePoints(s);
  std::string out;
  bool previous_cased = false;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (previous_cased) {
      AppendLower(cps[i], FinalSigma(cps, i), &out);
    } else {
      AppendTitle(cps[i], &out);
    }
    previous_cased = IsCased(cps[i]);
  }
  return out;
}

std::string PyCapitalize(const std::string& s) {
  const std::vector<uint32_t> cps = CodePoints(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (i == 0) {
      AppendTitle(cps[i], &out);
    } else {
      AppendLower(cps[i], FinalSigma(cps, i), &out);
    }
  }
  return out;
}

std::string PySwapcase(const std::string& s) {
  const std::vector<uint32_t> cps = CodePoints(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (IsUpperCp(cps[i])) {
      AppendLower(cps[i], FinalSigma(cps, i), &out);
    } else if (IsLowerCp(cps[i])) {
      AppendUpper(cps[i], &out);
    } else {
      AppendUtf8(cps[i], &out);
    }
  }
  return out;
}

bool PyIsUpper(const std::string& s) {
  bool cased = false;
  for (uint32_t c : CodePoints(s)) {
    if (IsLowerCp(c)) return false;
    cased |= IsUpperCp(c);
  }
  return cased;
}

bool PyIsLower(const std::string& s) {
  bool cased = false;
  for (uint32_t c : CodePoints(s)) {
    if (IsUpperCp(c)) return false;
    cased |= IsLowerCp(c);
  }
  return cased;
}

std::string JinjaTitle(const std::string& s) {
  std::string out;
  std::string word;
  auto flush = [&] {
    if (word.empty()) return;
    const std::vector<std::string_view> cs = SplitUtf8Chars(word);
    out += PyUpper(std::string(cs[0]));
    out += PyLower(word.substr(cs[0].size()));
    word.clear();
  };
  for (std::string_view ch : SplitUtf8Chars(s)) {
    const uint32_t c = Utf8CharCodePoint(ch);
    const bool sep = IsPySpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      flush();
      out += ch;
    } else {
      word += ch;
    }
  }
  flush();
  return out;
}

}  // namespace llm::jinja
