#include "scheduler_service/chat/jinja/python_string.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "common/utf8.h"

namespace llm::jinja {

bool IsPySpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

std::string PyStrip(const std::string& s, const std::string* chars, bool left, bool right) {
  std::vector<std::string_view> cs = SplitUtf8Chars(s);
  std::vector<std::string_view> strip_set;
  if (chars != nullptr) strip_set = SplitUtf8Chars(*chars);
  auto strippable = [&](std::string_view ch) {
    if (chars == nullptr) return IsPySpace(Utf8CharCodePoint(ch));
    return std::find(strip_set.begin(), strip_set.end(), ch) != strip_set.end();
  };
  size_t b = 0, e = cs.size();
  if (left)
    while (b < e && strippable(cs[b])) ++b;
  if (right)
    while (e > b && strippable(cs[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) out += cs[i];
  return out;
}

std::string AsciiUpper(std::string s) {
  for (char& c : s)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  return s;
}

std::string AsciiLower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::vector<std::string> PySplitlines(const std::string& s) {
  std::vector<std::string> out;
  std::string line;
  const std::vector<std::string_view> cs = SplitUtf8Chars(s);
  for (size_t i = 0; i < cs.size(); ++i) {
    const uint32_t c = Utf8CharCodePoint(cs[i]);
    const bool end = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || (c >= 0x1c && c <= 0x1e) ||
                     c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!end) {
      line += cs[i];
      continue;
    }
    if (c == '\r' && i + 1 < cs.size() && cs[i + 1] == "\n") ++i;
    out.push_back(std::move(line));
    line.clear();
  }
  if (!line.empty()) out.push_back(std::move(line));
  return out;
}

std::string PyReplace(const std::string& s, const std::string& from, const std::string& to,
                      int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    std::vector<std::string_view> cs = SplitUtf8Chars(s);
    int64_t n = 0;
    for (std::string_view c : cs) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      out += c;
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
    ++n;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

std::string PyFloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  int prec = 1;
  for (; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*e", prec - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  bool neg = s[0] == '-';
  if (neg) s = s.substr(1);
  size_t e_pos = s.find('e');
  int exp = std::atoi(s.c_str() + e_pos + 1);
  std::string digits;
  for (size_t i = 0; i < e_pos; ++i)
    if (s[i] != '.') digits.push_back(s[i]);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp >= -5 + 1 && exp < 16) {
    if (exp >= 0) {
      std::string int_part = digits.substr(0, std::min<size_t>(digits.size(), exp + 1));
      while (static_cast<int>(int_part.size()) < exp + 1) int_part.push_back('0');
      std::string frac =
          digits.size() > static_cast<size_t>(exp + 1) ? digits.substr(exp + 1) : "0";
      out = int_part + "." + frac;
    } else {
      out = "0." + std::string(-exp - 1, '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return neg ? "-" + out : out;
}

std::string PyStrRepr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c == q) {
          out.push_back('\\');
          out.push_back(static_cast<char>(c));
        } else if (c < 0x20 || c == 0x7f) {
          char b[8];
          std::snprintf(b, sizeof(b), "\\x%02x", c);
          out += b;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back(q);
  return out;
}

}  // namespace llm::jinja
