#include "scheduler_service/chat/jinja.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

// Errors inside the interpreter travel as C++ exceptions of the types below, thrown and
// caught only in this file: Template::Parse and Template::Render turn them into
// absl::Status, so nothing escapes the library.

namespace llm::jinja {
namespace {

struct JinjaError {
  int line;
  int col;
  std::string message;
  bool resource = false;  // ResourceExhausted (runaway template) rather than InvalidArgument
};

[[noreturn]] void Fail(int line, int col, std::string message) {
  throw JinjaError{line, col, std::move(message)};
}

// ---------------------------------------------------------------------------------------------
// UTF-8 and Python string helpers.

std::vector<std::string> Utf8Chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    len = std::min(len, s.size() - i);
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

uint32_t DecodeChar(const std::string& ch) {
  unsigned char c = ch[0];
  if (c < 0x80 || ch.size() == 1) return c;
  uint32_t cp = ch.size() == 2 ? (c & 0x1f) : ch.size() == 3 ? (c & 0x0f) : (c & 0x07);
  for (size_t i = 1; i < ch.size(); ++i)
    cp = (cp << 6) | (static_cast<unsigned char>(ch[i]) & 0x3f);
  return cp;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

// Python's str.isspace() for one code point.
bool IsPySpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

// Python's str.strip / lstrip / rstrip; `chars` null: whitespace.
std::string PyStrip(const std::string& s, const std::string* chars, bool left, bool right) {
  std::vector<std::string> cs = Utf8Chars(s);
  std::vector<std::string> strip_set;
  if (chars != nullptr) strip_set = Utf8Chars(*chars);
  auto strippable = [&](const std::string& ch) {
    if (chars == nullptr) return IsPySpace(DecodeChar(ch));
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

// Python's str.title() (ASCII letters): a letter after a non-letter is upper-cased, the
// others lower-cased.
std::string PyTitle(const std::string& s) {
  std::string out = s;
  bool prev_alpha = false;
  for (char& c : out) {
    if (IsAlpha(c)) {
      c = prev_alpha ? AsciiLower(std::string(1, c))[0] : AsciiUpper(std::string(1, c))[0];
      prev_alpha = true;
    } else {
      prev_alpha = (static_cast<unsigned char>(c) >= 0x80) && prev_alpha;
    }
  }
  return out;
}

// jinja2's `title` filter: words begin after runs of [-\s({\[<].
std::string JinjaTitle(const std::string& s) {
  std::string out;
  bool at_start = true;
  for (char c : s) {
    bool sep = c == '-' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
               c == '\v' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      out.push_back(c);
      at_start = true;
    } else if (at_start) {
      out += AsciiUpper(std::string(1, c));
      at_start = false;
    } else {
      out += AsciiLower(std::string(1, c));
    }
  }
  return out;
}

std::string PyCapitalize(const std::string& s) {
  if (s.empty()) return s;
  return AsciiUpper(s.substr(0, 1)) + AsciiLower(s.substr(1));
}

std::string PyReplace(const std::string& s, const std::string& from, const std::string& to,
                      int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    std::vector<std::string> cs = Utf8Chars(s);
    int64_t n = 0;
    for (const std::string& c : cs) {
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

// Python's repr(float).
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

void JsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof(b), "\\u%04x", c);
          *out += b;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

void ToJsonImpl(const Value& v, int indent, bool sort_keys, int level, std::string* out) {
  auto newline = [&](int lvl) {
    out->push_back('\n');
    out->append(static_cast<size_t>(indent) * lvl, ' ');
  };
  if (v.is_none()) {
    *out += "null";
  } else if (v.is_bool()) {
    *out += v.as_bool() ? "true" : "false";
  } else if (v.is_int()) {
    *out += std::to_string(v.as_int());
  } else if (v.is_float()) {
    double d = v.as_float();
    *out += std::isnan(d)   ? "NaN"
            : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                            : PyFloatRepr(d);
  } else if (v.is_string()) {
    JsonString(v.as_string(), out);
  } else if (v.is_list()) {
    const ValueList& list = v.list();
    if (list.empty()) {
      *out += "[]";
      return;
    }
    out->push_back('[');
    for (size_t i = 0; i < list.size(); ++i) {
      if (i > 0) *out += indent >= 0 ? "," : ", ";
      if (indent >= 0) newline(level + 1);
      ToJsonImpl(list[i], indent, sort_keys, level + 1, out);
    }
    if (indent >= 0) newline(level);
    out->push_back(']');
  } else if (v.is_dict()) {
    std::vector<const std::pair<std::string, Value>*> items;
    for (const auto& kv : v.dict().items) items.push_back(&kv);
    if (items.empty()) {
      *out += "{}";
      return;
    }
    if (sort_keys)
      std::sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
    out->push_back('{');
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) *out += indent >= 0 ? "," : ", ";
      if (indent >= 0) newline(level + 1);
      JsonString(items[i]->first, out);
      *out += ": ";
      ToJsonImpl(items[i]->second, indent, sort_keys, level + 1, out);
    }
    if (indent >= 0) newline(level);
    out->push_back('}');
  } else if (v.is_undefined()) {
    throw CallError{"Object of type Undefined is not JSON serializable"};
  } else {
    throw CallError{"Object of type function is not JSON serializable"};
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Value.

const Value* ValueDict::Find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void ValueDict::Set(std::string key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

Value Value::MakeCallable(std::string name, Function fn) {
  return Value(std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)}));
}

Value Value::FromJson(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return MakeNone();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(static_cast<int64_t>(json.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Value(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList list;
      for (const auto& item : json) list.push_back(FromJson(item));
      return Value(std::move(list));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict dict;
      for (const auto& [k, v] : json.items()) dict.items.emplace_back(k, FromJson(v));
      return Value(std::move(dict));
    }
    default:
      return MakeNone();
  }
}

bool Value::Truthy() const {
  if (is_undefined() || is_none()) return false;
  if (is_bool()) return as_bool();
  if (is_int()) return as_int() != 0;
  if (is_float()) return as_float() != 0;
  if (is_string()) return !as_string().empty();
  if (is_list()) return !list().empty();
  if (is_dict()) return !dict().items.empty();
  return true;
}

std::string Value::Str() const {
  if (is_undefined()) return "";
  if (is_string()) return as_string();
  return Repr();
}

std::string Value::Repr() const {
  if (is_undefined()) return "";
  if (is_none()) return "None";
  if (is_bool()) return as_bool() ? "True" : "False";
  if (is_int()) return std::to_string(as_int());
  if (is_float()) return PyFloatRepr(as_float());
  if (is_string()) return PyStrRepr(as_string());
  if (is_list()) {
    std::string out = "[";
    bool first = true;
    for (const Value& v : list()) {
      if (!first) out += ", ";
      first = false;
      out += v.Repr();
    }
    return out + "]";
  }
  if (is_dict()) {
    if (dict().is_namespace) return "<Namespace>";
    std::string out = "{";
    bool first = true;
    for (const auto& [k, v] : dict().items) {
      if (!first) out += ", ";
      first = false;
      out += PyStrRepr(k) + ": " + v.Repr();
    }
    return out + "}";
  }
  return "<function " + callable().name + ">";
}

std::string Value::TypeName() const {
  if (is_undefined()) return "Undefined";
  if (is_none()) return "NoneType";
  if (is_bool()) return "bool";
  if (is_int()) return "int";
  if (is_float()) return "float";
  if (is_string()) return "str";
  if (is_list()) return "list";
  if (is_dict()) return dict().is_namespace ? "Namespace" : "dict";
  return "function";
}

std::string ToJson(const Value& value, int indent, bool sort_keys) {
  std::string out;
  ToJsonImpl(value, indent, sort_keys, 0, &out);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Lexer.

namespace {

enum class Tok {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok kind;
  std::string text;  // text, name, string value or operator
  int64_t ival = 0;
  double fval = 0;
  int line = 1;
  int col = 1;
};

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src.size(); ++i)
      if (src[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> Run() {
    size_t pos = 0;
    bool strip_next_ws = false;  // after "-}}" / "-%}" / "-#}"
    bool trim_next_nl = false;   // trim_blocks after "%}" / "#}"
    bool line_starting = true;
    while (pos <= src_.size()) {
      size_t start = FindTagStart(pos);
      std::string text(src_.substr(pos, (start == std::string::npos ? src_.size() : start) - pos));
      if (trim_next_nl) {
        if (text.rfind("\r\n", 0) == 0) {
          text.erase(0, 2);
        } else if (!text.empty() && text[0] == '\n') {
          text.erase(0, 1);
        }
      }
      if (strip_next_ws) text = PyStrip(text, nullptr, true, false);
      if (start == std::string::npos) {
        Emit(Tok::kText, text, pos);
        break;
      }
      char kind = src_[start + 1];
      size_t after = start + 2;
      char marker = after < src_.size() ? src_[after] : '\0';
      if (marker == '-') {
        text = PyStrip(text, nullptr, false, true);
        ++after;
      } else if (marker == '+') {
        ++after;
      } else if (kind != '{') {
        // lstrip_blocks: spaces and tabs between the line's start and a block or comment tag.
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (l_pos > 0 || line_starting) {
          bool all_ws = l_pos < text.size();
          for (size_t i = l_pos; i < text.size(); ++i)
            if (text[i] != ' ' && text[i] != '\t' && text[i] != '\r' && text[i] != '\f' &&
                text[i] != '\v')
              all_ws = false;
          if (all_ws) text.erase(l_pos);
        }
      }
      if (marker == '+' && kind == '{') Fail(LineOf(start), ColOf(start), "unexpected '+'");
      Emit(Tok::kText, text, pos);
      strip_next_ws = false;
      trim_next_nl = false;
      if (kind == '#') {
        size_t end = src_.find("#}", after);
        if (end == std::string::npos) Fail(LineOf(start), ColOf(start), "unclosed comment");
        char before = end > after ? src_[end - 1] : '\0';
        strip_next_ws = before == '-';
        trim_next_nl = before != '+' && before != '-';
        pos = end + 2;
        line_starting = trim_next_nl ? NextIsNewline(pos) : false;
        continue;
      }
      if (kind == '%' && IsRawTag(after)) {
        pos = LexRaw(start, after, &strip_next_ws, &trim_next_nl);
        line_starting = trim_next_nl && NextIsNewline(pos);
        continue;
      }
      Emit(kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, "", start);
      pos = LexTag(kind, after, &strip_next_ws, &trim_next_nl);
      line_starting = trim_next_nl && NextIsNewline(pos);
    }
    Token eof{Tok::kEof, "", 0, 0, LineOf(src_.size()), ColOf(src_.size())};
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

  int LineOf(size_t pos) const {
    return static_cast<int>(std::upper_bound(line_starts_.begin(), line_starts_.end(), pos) -
                            line_starts_.begin());
  }
  int ColOf(size_t pos) const { return static_cast<int>(pos - line_starts_[LineOf(pos) - 1]) + 1; }

 private:
  bool NextIsNewline(size_t pos) const {
    return pos < src_.size() && (src_[pos] == '\n' || src_.substr(pos, 2) == "\r\n");
  }

  size_t FindTagStart(size_t pos) const {
    while (true) {
      size_t p = src_.find('{', pos);
      if (p == std::string::npos || p + 1 >= src_.size()) return std::string::npos;
      char c = src_[p + 1];
      if (c == '{' || c == '%' || c == '#') return p;
      pos = p + 1;
    }
  }

  void Emit(Tok kind, std::string text, size_t pos) {
    if (kind == Tok::kText && text.empty()) return;
    Token t;
    t.kind = kind;
    t.text = std::move(text);
    t.line = LineOf(pos);
    t.col = ColOf(pos);
    tokens_.push_back(std::move(t));
  }

  static bool IsNameStart(char c) { return IsAlpha(c) || c == '_'; }
  static bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }

  bool IsRawTag(size_t p) const {
    while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    return p + 3 >= src_.size() || !IsNameChar(src_[p + 3]);
  }

  // {% raw %}...{% endraw %}: the body as text.
  size_t LexRaw(size_t start, size_t after, bool* strip_next_ws, bool* trim_next_nl) {
    size_t close = src_.find("%}", after);
    if (close == std::string::npos) Fail(LineOf(start), ColOf(start), "unclosed raw tag");
    bool strip_body = src_[close - 1] == '-';
    size_t body = close + 2;
    size_t p = body;
    while (true) {
      size_t tag = src_.find("{%", p);
      if (tag == std::string::npos) Fail(LineOf(start), ColOf(start), "missing endraw");
      size_t q = tag + 2;
      bool strip_before = q < src_.size() && src_[q] == '-';
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ++q;
      while (q < src_.size() && std::isspace(static_cast<unsigned char>(src_[q]))) ++q;
      if (src_.compare(q, 6, "endraw") == 0) {
        std::string text(src_.substr(body, tag - body));
        if (strip_body)
          text = PyStrip(text, nullptr, true, false);
        else if (text.rfind("\n", 0) == 0)
          text.erase(0, 1);
        if (strip_before) text = PyStrip(text, nullptr, false, true);
        Emit(Tok::kText, text, body);
        size_t end = src_.find("%}", q);
        if (end == std::string::npos) Fail(LineOf(tag), ColOf(tag), "unclosed endraw tag");
        *strip_next_ws = src_[end - 1] == '-';
        *trim_next_nl = src_[end - 1] != '+' && src_[end - 1] != '-';
        return end + 2;
      }
      p = tag + 2;
    }
  }

  size_t LexTag(char kind, size_t p, bool* strip_next_ws, bool* trim_next_nl) {
    const char* close = kind == '{' ? "}}" : "%}";
    int depth = 0;
    while (true) {
      while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
      if (p >= src_.size())
        Fail(LineOf(p), ColOf(p), std::string("unclosed tag: expected '") + close + "'");
      if (depth == 0) {
        if ((src_[p] == '-' || src_[p] == '+') && src_.compare(p + 1, 2, close) == 0) {
          if (src_[p] == '+' && kind == '{') Fail(LineOf(p), ColOf(p), "unexpected '+'");
          Emit(kind == '{' ? Tok::kVarEnd : Tok::kBlockEnd, "", p);
          *strip_next_ws = src_[p] == '-';
          *trim_next_nl = false;
          return p + 3;
        }
        if (src_.compare(p, 2, close) == 0) {
          Emit(kind == '{' ? Tok::kVarEnd : Tok::kBlockEnd, "", p);
          *trim_next_nl = kind == '%';
          return p + 2;
        }
      }
      char c = src_[p];
      Token t;
      t.line = LineOf(p);
      t.col = ColOf(p);
      if (IsNameStart(c)) {
        size_t b = p;
        while (p < src_.size() && IsNameChar(src_[p])) ++p;
        t.kind = Tok::kName;
        t.text = std::string(src_.substr(b, p - b));
      } else if (c >= '0' && c <= '9') {
        size_t b = p;
        while (p < src_.size() &&
               (std::isdigit(static_cast<unsigned char>(src_[p])) || src_[p] == '_'))
          ++p;
        bool is_float = false;
        if (p + 1 < src_.size() && src_[p] == '.' &&
            std::isdigit(static_cast<unsigned char>(src_[p + 1]))) {
          is_float = true;
          ++p;
          while (p < src_.size() &&
                 (std::isdigit(static_cast<unsigned char>(src_[p])) || src_[p] == '_'))
            ++p;
        }
        if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
          size_t q = p + 1;
          if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
          if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
            is_float = true;
            p = q;
            while (p < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p]))) ++p;
          }
        }
        std::string num;
        for (size_t i = b; i < p; ++i)
          if (src_[i] != '_') num.push_back(src_[i]);
        if (is_float) {
          t.kind = Tok::kFloat;
          t.fval = std::strtod(num.c_str(), nullptr);
        } else {
          t.kind = Tok::kInt;
          errno = 0;
          t.ival = std::strtoll(num.c_str(), nullptr, 10);
          if (errno == ERANGE) Fail(t.line, t.col, "integer literal out of range: " + num);
        }
      } else if (c == '\'' || c == '"') {
        t.kind = Tok::kString;
        p = LexString(p, &t.text);
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                     "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                     "]",  "{",  "}",  ",",  ".",  ":",  "|"};
        const char* op = nullptr;
        for (const char* o : kOps) {
          if (src_.compare(p, std::strlen(o), o) == 0) {
            op = o;
            break;
          }
        }
        if (op == nullptr) Fail(t.line, t.col, std::string("unexpected character '") + c + "'");
        t.kind = Tok::kOp;
        t.text = op;
        p += t.text.size();
        if (t.text == "(" || t.text == "[" || t.text == "{") ++depth;
        if ((t.text == ")" || t.text == "]" || t.text == "}") && depth > 0) --depth;
      }
      tokens_.push_back(std::move(t));
    }
  }

  size_t LexString(size_t p, std::string* out) {
    char q = src_[p];
    size_t start = p++;
    while (true) {
      if (p >= src_.size()) Fail(LineOf(start), ColOf(start), "unterminated string literal");
      char c = src_[p];
      if (c == q) return p + 1;
      if (c != '\\') {
        out->push_back(c);
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) Fail(LineOf(start), ColOf(start), "unterminated string literal");
      char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n':
          out->push_back('\n');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'v':
          out->push_back('\v');
          break;
        case 'a':
          out->push_back('\a');
          break;
        case '0':
          out->push_back('\0');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '\'':
          out->push_back('\'');
          break;
        case '"':
          out->push_back('"');
          break;
        case '\n':
          break;
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (p + n > src_.size())
            Fail(LineOf(start), ColOf(start), "truncated \\" + std::string(1, e) + " escape");
          std::string hex(src_.substr(p, n));
          char* endp = nullptr;
          uint32_t cp = static_cast<uint32_t>(std::strtoul(hex.c_str(), &endp, 16));
          if (endp != hex.c_str() + n)
            Fail(LineOf(start), ColOf(start), "bad \\" + std::string(1, e) + " escape");
          AppendUtf8(cp, out);
          p += n;
          break;
        }
        default:
          out->push_back('\\');
          out->push_back(e);
      }
    }
  }

  std::string_view src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

// ---------------------------------------------------------------------------------------------
// AST and evaluation.

struct Ctx;

struct Node {
  int line = 0;
  int col = 0;
  virtual ~Node() = default;
  [[noreturn]] void Error(std::string message) const { Fail(line, col, std::move(message)); }
};

struct Expr : Node {
  virtual Value Eval(Ctx& ctx) const = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Stmt : Node {
  virtual void Exec(Ctx& ctx) const = 0;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class Flow { kNormal, kBreak, kContinue };

struct Ctx {
  std::vector<absl::flat_hash_map<std::string, Value>> frames;
  const ValueDict* context = nullptr;
  std::string* out = nullptr;
  Limits limits;
  int64_t iterations = 0;
  int depth = 0;
  Flow flow = Flow::kNormal;

  Value Lookup(const std::string& name) const;
  void Set(const std::string& name, Value v) { frames.back()[name] = std::move(v); }
  void Write(const Node& at, std::string_view s) {
    if (static_cast<int64_t>(out->size() + s.size()) > limits.max_output_bytes) {
      throw JinjaError{
          at.line, at.col,
          absl::StrCat("the template's output exceeds ", limits.max_output_bytes, " bytes"), true};
    }
    out->append(s);
  }
  void CountIteration(const Node& at) {
    if (++iterations > limits.max_loop_iterations) {
      throw JinjaError{at.line, at.col,
                       absl::StrCat("the template ran more than ", limits.max_loop_iterations,
                                    " loop iterations"),
                       true};
    }
  }
};

Value Global(const std::string& name);

Value Ctx::Lookup(const std::string& name) const {
  for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
    auto hit = it->find(name);
    if (hit != it->end()) return hit->second;
  }
  if (const Value* v = context->Find(name)) return *v;
  Value g = Global(name);
  if (!g.is_undefined()) return g;
  return Value::MakeUndefined("'" + name + "' is undefined");
}

void ExecBody(const Body& body, Ctx& ctx) {
  for (const StmtPtr& s : body) {
    s->Exec(ctx);
    if (ctx.flow != Flow::kNormal) return;
  }
}

// Arguments by position or name, as a Python function with parameters `names` takes them.
class ArgReader {
 public:
  ArgReader(CallArgs& args, std::string fn) : args_(args), fn_(std::move(fn)) {}
  // The argument at `index` or named `name`; `fallback` when absent.
  Value Get(size_t index, const std::string& name, Value fallback = Value()) {
    for (auto& [k, v] : args_.keyword)
      if (k == name) return v;
    if (index < args_.positional.size()) return args_.positional[index];
    return fallback;
  }
  Value Required(size_t index, const std::string& name) {
    Value v = Get(index, name);
    if (v.is_undefined() && index >= args_.positional.size())
      throw CallError{fn_ + "() missing required argument '" + name + "'"};
    return v;
  }
  std::string String(size_t index, const std::string& name) {
    Value v = Required(index, name);
    if (!v.is_string())
      throw CallError{fn_ + "(): argument '" + name + "' must be a string, got " + v.TypeName()};
    return v.as_string();
  }
  void MaxPositional(size_t n) {
    if (args_.positional.size() > n)
      throw CallError{absl::StrCat(fn_, "() takes at most ", n, " positional arguments (",
                                   args_.positional.size(), " given)")};
  }

 private:
  CallArgs& args_;
  std::string fn_;
};

[[noreturn]] void UndefinedError(const Value& v) { throw CallError{v.undefined_name()}; }

std::vector<Value> Iterate(const Value& v) {
  if (v.is_undefined()) return {};
  if (v.is_list()) return v.list();
  if (v.is_dict()) {
    std::vector<Value> keys;
    for (const auto& kv : v.dict().items) keys.emplace_back(kv.first);
    return keys;
  }
  if (v.is_string()) {
    std::vector<Value> chars;
    for (std::string& c : Utf8Chars(v.as_string())) chars.emplace_back(std::move(c));
    return chars;
  }
  throw CallError{"'" + v.TypeName() + "' object is not iterable"};
}

bool Equal(const Value& a, const Value& b) {
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
    auto num = [](const Value& v) {
      return v.is_bool() ? (v.as_bool() ? 1.0 : 0.0) : v.as_number();
    };
    if (a.is_int() && b.is_int()) return a.as_int() == b.as_int();
    return num(a) == num(b);
  }
  if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
  if (a.is_none() && b.is_none()) return true;
  if (a.is_undefined() && b.is_undefined()) return true;
  if (a.is_list() && b.is_list()) {
    const ValueList &x = a.list(), &y = b.list();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!Equal(x[i], y[i])) return false;
    return true;
  }
  if (a.is_dict() && b.is_dict()) {
    if (a.dict().items.size() != b.dict().items.size()) return false;
    for (const auto& [k, v] : a.dict().items) {
      const Value* o = b.dict().Find(k);
      if (o == nullptr || !Equal(v, *o)) return false;
    }
    return true;
  }
  return false;
}

// -1, 0, 1; CallError when Python would raise TypeError.
int Compare(const Value& a, const Value& b, const char* op) {
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
    if (a.is_int() && b.is_int()) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
    auto num = [](const Value& v) {
      return v.is_bool() ? (v.as_bool() ? 1.0 : 0.0) : v.as_number();
    };
    double x = num(a), y = num(b);
    return x < y ? -1 : x > y;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0;
  }
  if (a.is_list() && b.is_list()) {
    const ValueList &x = a.list(), &y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equal(x[i], y[i])) continue;
      return Compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size();
  }
  throw CallError{std::string("'") + op + "' not supported between instances of '" + a.TypeName() +
                  "' and '" + b.TypeName() + "'"};
}

bool Contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string())
      throw CallError{"'in <string>' requires string as left operand, not " + item.TypeName()};
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const Value& v : container.list())
      if (Equal(v, item)) return true;
    return false;
  }
  if (container.is_dict()) return item.is_string() && container.dict().Find(item.as_string());
  if (container.is_undefined()) return false;
  throw CallError{"argument of type '" + container.TypeName() + "' is not iterable"};
}

int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t PyMod(int64_t a, int64_t b) {
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

Value Arith(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) UndefinedError(a);
  if (b.is_undefined()) UndefinedError(b);
  auto type_error = [&]() -> CallError {
    return CallError{"unsupported operand type(s) for " + op + ": '" + a.TypeName() + "' and '" +
                     b.TypeName() + "'"};
  };
  auto numeric = [](const Value& v) { return v.is_number() || v.is_bool(); };
  auto as_int = [](const Value& v) { return v.is_bool() ? int64_t{v.as_bool()} : v.as_int(); };
  auto as_num = [](const Value& v) {
    return v.is_bool() ? (v.as_bool() ? 1.0 : 0.0) : v.as_number();
  };
  if (op == "+") {
    if (a.is_string() && b.is_string()) return a.as_string() + b.as_string();
    if (a.is_list() && b.is_list()) {
      ValueList out = a.list();
      out.insert(out.end(), b.list().begin(), b.list().end());
      return out;
    }
    if (a.is_string() || b.is_string()) {
      if (a.is_string())
        throw CallError{"can only concatenate str (not \"" + b.TypeName() + "\") to str"};
      throw type_error();
    }
  }
  if (op == "*") {
    const Value* seq = a.is_string() || a.is_list()   ? &a
                       : b.is_string() || b.is_list() ? &b
                                                      : nullptr;
    const Value* n = seq == &a ? &b : &a;
    if (seq != nullptr && (n->is_int() || n->is_bool())) {
      int64_t times = std::max<int64_t>(0, as_int(*n));
      const int64_t unit = std::max<int64_t>(
          1, static_cast<int64_t>(seq->is_string() ? seq->as_string().size() : seq->list().size()));
      if (times > (int64_t{1} << 26) / unit) throw CallError{"repetition too large"};
      if (seq->is_string()) {
        std::string out;
        for (int64_t i = 0; i < times; ++i) out += seq->as_string();
        return out;
      }
      ValueList out;
      for (int64_t i = 0; i < times; ++i)
        out.insert(out.end(), seq->list().begin(), seq->list().end());
      return out;
    }
  }
  if (!numeric(a) || !numeric(b)) throw type_error();
  bool ints = !a.is_float() && !b.is_float();
  if (op == "/") {
    if (as_num(b) == 0) throw CallError{"division by zero"};
    return as_num(a) / as_num(b);
  }
  if (ints) {
    int64_t x = as_int(a), y = as_int(b);
    // Python's integers do not overflow; these are 64-bit, and say so rather than wrap.
    const CallError overflow{"integer overflow in '" + op + "' (integers are 64-bit here)"};
    int64_t r = 0;
    if (op == "+") {
      if (__builtin_add_overflow(x, y, &r)) throw overflow;
      return r;
    }
    if (op == "-") {
      if (__builtin_sub_overflow(x, y, &r)) throw overflow;
      return r;
    }
    if (op == "*") {
      if (__builtin_mul_overflow(x, y, &r)) throw overflow;
      return r;
    }
    if (op == "//" || op == "%") {
      if (y == 0) throw CallError{"integer division or modulo by zero"};
      if (x == std::numeric_limits<int64_t>::min() && y == -1) throw overflow;
      return op == "//" ? FloorDiv(x, y) : PyMod(x, y);
    }
    if (op == "**") {
      if (y < 0) return std::pow(static_cast<double>(x), static_cast<double>(y));
      if (x == 0) return int64_t{y == 0 ? 1 : 0};
      if (x == 1) return int64_t{1};
      if (x == -1) return int64_t{y % 2 == 0 ? 1 : -1};
      r = 1;  // |x| >= 2: overflows within 64 factors
      for (int64_t i = 0; i < y; ++i) {
        if (__builtin_mul_overflow(r, x, &r)) throw overflow;
      }
      return r;
    }
  }
  double x = as_num(a), y = as_num(b);
  if (op == "+") return x + y;
  if (op == "-") return x - y;
  if (op == "*") return x * y;
  if (op == "//" || op == "%") {
    if (y == 0) throw CallError{"float division or modulo by zero"};
    double q = std::floor(x / y);
    return op == "//" ? q : x - q * y;
  }
  if (op == "**") return std::pow(x, y);
  throw type_error();
}

// Python slicing over `n` items: the indices taken.
std::vector<int64_t> SliceIndices(int64_t n, const Value& start, const Value& stop,
                                  const Value& step) {
  auto opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int()) throw CallError{std::string("slice ") + what + " must be an integer or none"};
    return v.as_int();
  };
  int64_t st = opt(step, "step").value_or(1);
  if (st == 0) throw CallError{"slice step cannot be zero"};
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) x += n;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  int64_t b = clamp(opt(start, "start"), st > 0 ? 0 : n - 1);
  int64_t e = clamp(opt(stop, "stop"), st > 0 ? n : -1);
  std::vector<int64_t> out;
  for (int64_t i = b; st > 0 ? i < e : i > e;) {
    out.push_back(i);
    if (__builtin_add_overflow(i, st, &i)) break;
  }
  return out;
}

// ---- expressions ----

struct Literal : Expr {
  Value value;
  Value Eval(Ctx&) const override { return value; }
};

struct Name : Expr {
  std::string name;
  Value Eval(Ctx& ctx) const override { return ctx.Lookup(name); }
};

struct ListExpr : Expr {
  std::vector<ExprPtr> items;
  Value Eval(Ctx& ctx) const override {
    ValueList out;
    for (const ExprPtr& e : items) out.push_back(e->Eval(ctx));
    return out;
  }
};

struct DictExpr : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
  Value Eval(Ctx& ctx) const override {
    ValueDict out;
    for (const auto& [k, v] : items) {
      Value key = k->Eval(ctx);
      if (!key.is_string()) k->Error("dict keys must be strings, got " + key.TypeName());
      out.Set(key.as_string(), v->Eval(ctx));
    }
    return out;
  }
};

Value CallMethod(const Value& obj, const std::string& name, CallArgs& args, bool* found);

Value GetAttrValue(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) UndefinedError(obj);
  if (obj.is_dict()) {
    static const char* kMethods[] = {"items", "keys", "values", "get"};
    if (!obj.dict().is_namespace)
      for (const char* m : kMethods)
        if (name == m)
          return Value::MakeCallable(name, [obj, name](CallArgs& args) {
            bool found = false;
            return CallMethod(obj, name, args, &found);
          });
    if (const Value* v = obj.dict().Find(name)) return *v;
    return Value::MakeUndefined("'" + obj.TypeName() + " object' has no attribute '" + name + "'");
  }
  if (obj.is_string() || obj.is_list()) {
    return Value::MakeCallable(name, [obj, name](CallArgs& args) {
      bool found = false;
      Value v = CallMethod(obj, name, args, &found);
      if (!found)
        throw CallError{"'" + obj.TypeName() + "' object has no attribute '" + name + "'"};
      return v;
    });
  }
  return Value::MakeUndefined("'" + obj.TypeName() + " object' has no attribute '" + name + "'");
}

Value GetItemValue(const Value& obj, const Value& key) {
  if (obj.is_undefined()) UndefinedError(obj);
  if (obj.is_dict()) {
    if (key.is_string()) {
      if (const Value* v = obj.dict().Find(key.as_string())) return *v;
      return Value::MakeUndefined("'dict object' has no attribute '" + key.as_string() + "'");
    }
    return Value::MakeUndefined("'dict object' has no attribute " + key.Repr());
  }
  if (obj.is_list() || obj.is_string()) {
    if (!key.is_int()) {
      if (key.is_string()) return GetAttrValue(obj, key.as_string());
      throw CallError{obj.TypeName() + " indices must be integers, not " + key.TypeName()};
    }
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.list().size());
      int64_t i = key.as_int() < 0 ? key.as_int() + n : key.as_int();
      if (i < 0 || i >= n)
        return Value::MakeUndefined(absl::StrCat("'list object' has no element ", key.as_int()));
      return obj.list()[i];
    }
    std::vector<std::string> cs = Utf8Chars(obj.as_string());
    int64_t n = static_cast<int64_t>(cs.size());
    int64_t i = key.as_int() < 0 ? key.as_int() + n : key.as_int();
    if (i < 0 || i >= n)
      return Value::MakeUndefined(absl::StrCat("'str object' has no element ", key.as_int()));
    return cs[i];
  }
  return Value::MakeUndefined("'" + obj.TypeName() + " object' has no element " + key.Repr());
}

struct GetAttr : Expr {
  ExprPtr obj;
  std::string name;
  Value Eval(Ctx& ctx) const override {
    Value o = obj->Eval(ctx);
    try {
      return GetAttrValue(o, name);
    } catch (CallError& e) {
      Error(e.message);
    }
  }
};

struct GetItem : Expr {
  ExprPtr obj;
  ExprPtr index;
  Value Eval(Ctx& ctx) const override {
    Value o = obj->Eval(ctx);
    Value k = index->Eval(ctx);
    try {
      return GetItemValue(o, k);
    } catch (CallError& e) {
      Error(e.message);
    }
  }
};

struct SliceExpr : Expr {
  ExprPtr obj, start, stop, step;
  Value Eval(Ctx& ctx) const override {
    Value o = obj->Eval(ctx);
    Value a = start ? start->Eval(ctx) : Value();
    Value b = stop ? stop->Eval(ctx) : Value();
    Value c = step ? step->Eval(ctx) : Value();
    try {
      if (o.is_undefined()) UndefinedError(o);
      if (o.is_list()) {
        ValueList out;
        for (int64_t i : SliceIndices(static_cast<int64_t>(o.list().size()), a, b, c))
          out.push_back(o.list()[i]);
        return out;
      }
      if (o.is_string()) {
        std::vector<std::string> cs = Utf8Chars(o.as_string());
        std::string out;
        for (int64_t i : SliceIndices(static_cast<int64_t>(cs.size()), a, b, c)) out += cs[i];
        return out;
      }
      throw CallError{"'" + o.TypeName() + "' object is not subscriptable"};
    } catch (CallError& e) {
      Error(e.message);
    }
  }
};

struct Arg {
  std::string name;  // empty: positional
  ExprPtr value;
};

CallArgs EvalArgs(const std::vector<Arg>& args, Ctx& ctx) {
  CallArgs out;
  for (const Arg& a : args) {
    if (a.name.empty()) {
      out.positional.push_back(a.value->Eval(ctx));
    } else {
      out.keyword.emplace_back(a.name, a.value->Eval(ctx));
    }
  }
  return out;
}

struct Call : Expr {
  ExprPtr callee;
  std::vector<Arg> args;
  Value Eval(Ctx& ctx) const override {
    Value fn;
    CallArgs call_args;
    try {
      if (auto* attr = dynamic_cast<const GetAttr*>(callee.get())) {
        Value obj = attr->obj->Eval(ctx);
        if (obj.is_undefined()) UndefinedError(obj);
        if (obj.is_string() || obj.is_list() || (obj.is_dict() && !obj.dict().is_namespace)) {
          call_args = EvalArgs(args, ctx);
          bool found = false;
          Value v = CallMethod(obj, attr->name, call_args, &found);
          if (found) return v;
          if (!obj.is_dict() || obj.dict().Find(attr->name) == nullptr)
            throw CallError{"'" + obj.TypeName() + "' object has no attribute '" + attr->name +
                            "'"};
        }
        fn = GetAttrValue(obj, attr->name);
      } else {
        fn = callee->Eval(ctx);
      }
      if (fn.is_undefined()) UndefinedError(fn);
      if (!fn.is_callable()) throw CallError{"'" + fn.TypeName() + "' object is not callable"};
      call_args = EvalArgs(args, ctx);
      return fn.callable().fn(call_args);
    } catch (CallError& e) {
      Error(e.message);
    }
  }
};

Value ApplyFilter(const std::string& name, const Value& input, CallArgs& args, Ctx& ctx);
bool ApplyTest(const std::string& name, const Value& input, CallArgs& args, Ctx& ctx);

struct FilterExpr : Expr {
  ExprPtr input;
  std::string name;
  std::vector<Arg> args;
  Value Eval(Ctx& ctx) const override {
    Value in = input->Eval(ctx);
    CallArgs a = EvalArgs(args, ctx);
    try {
      return ApplyFilter(name, in, a, ctx);
    } catch (CallError& e) {
      Error(e.message);
    }
  }
};

struct TestExpr : Expr {
  ExprPtr input;
  std::string name;
  std::vector<Arg> args;
  bool negated = false;
  Value Eval(Ctx& ctx) const override {
    Value in = input->Eval(ctx);
    CallArgs a = EvalArgs(args, ctx);
    try {
      return ApplyTest(name, in, a, ctx) != negated;
    } catch (CallError& e) {
      Error(e.message);
    }
  }
};

struct Unary : Expr {
  std::string op;
  ExprPtr operand;
  Value Eval(Ctx& ctx) const override {
    Value v = operand->Eval(ctx);
    if (op == "not") return !v.Truthy();
    if (v.is_undefined()) Error(v.undefined_name());
    if (v.is_int()) {
      if (op == "-" && v.as_int() == std::numeric_limits<int64_t>::min())
        Error("integer overflow in unary '-' (integers are 64-bit here)");
      return op == "-" ? -v.as_int() : v.as_int();
    }
    if (v.is_float()) return op == "-" ? -v.as_float() : v.as_float();
    if (v.is_bool()) return int64_t{op == "-" ? -int64_t{v.as_bool()} : int64_t{v.as_bool()}};
    Error("bad operand type for unary " + op + ": '" + v.TypeName() + "'");
  }
};

struct Binary : Expr {
  std::string op;
  ExprPtr left, right;
  Value Eval(Ctx& ctx) const override {
    if (op == "and") {
      Value l = left->Eval(ctx);
      return l.Truthy() ? right->Eval(ctx) : l;
    }
    if (op == "or") {
      Value l = left->Eval(ctx);
      return l.Truthy() ? l : right->Eval(ctx);
    }
    Value l = left->Eval(ctx);
    Value r = right->Eval(ctx);
    Value v;
    try {
      v = op == "~" ? Value(l.Str() + r.Str()) : Arith(op, l, r);
    } catch (CallError& e) {
      Error(e.message);
    }
    // Doubling a string or list in a loop must not exhaust memory before the output limit.
    const int64_t size = v.is_string() ? static_cast<int64_t>(v.as_string().size())
                         : v.is_list() ? static_cast<int64_t>(v.list().size())
                                       : 0;
    if (size > ctx.limits.max_output_bytes) {
      throw JinjaError{line, col,
                       absl::StrCat("a value of the template exceeds ", ctx.limits.max_output_bytes,
                                    " bytes or items"),
                       true};
    }
    return v;
  }
};

struct CompareExpr : Expr {
  ExprPtr first;
  std::vector<std::pair<std::string, ExprPtr>> rest;
  Value Eval(Ctx& ctx) const override {
    Value l = first->Eval(ctx);
    for (const auto& [op, e] : rest) {
      Value r = e->Eval(ctx);
      bool ok;
      try {
        if (op == "==")
          ok = Equal(l, r);
        else if (op == "!=")
          ok = !Equal(l, r);
        else if (op == "in")
          ok = Contains(r, l);
        else if (op == "notin")
          ok = !Contains(r, l);
        else {
          int c = Compare(l, r, op.c_str());
          ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
        }
      } catch (CallError& err) {
        Error(err.message);
      }
      if (!ok) return false;
      l = std::move(r);
    }
    return true;
  }
};

struct CondExpr : Expr {
  ExprPtr cond, then, otherwise;
  Value Eval(Ctx& ctx) const override {
    if (cond->Eval(ctx).Truthy()) return then->Eval(ctx);
    if (otherwise) return otherwise->Eval(ctx);
    return Value::MakeUndefined(
        "the inline if expression evaluated to false and no else was given");
  }
};

// ---- statements ----

struct Output : Stmt {
  std::string text;
  void Exec(Ctx& ctx) const override { ctx.Write(*this, text); }
};

struct Print : Stmt {
  ExprPtr expr;
  void Exec(Ctx& ctx) const override { ctx.Write(*this, expr->Eval(ctx).Str()); }
};

struct If : Stmt {
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body otherwise;
  void Exec(Ctx& ctx) const override {
    for (const auto& [cond, body] : branches) {
      if (cond->Eval(ctx).Truthy()) {
        ExecBody(body, ctx);
        return;
      }
    }
    ExecBody(otherwise, ctx);
  }
};

void Assign(const Node& at, Ctx& ctx, const std::vector<std::string>& targets, const Value& v) {
  if (targets.size() == 1) {
    ctx.Set(targets[0], v);
    return;
  }
  std::vector<Value> items;
  try {
    items = Iterate(v);
  } catch (CallError& e) {
    at.Error("cannot unpack: " + e.message);
  }
  if (items.size() != targets.size())
    at.Error(
        absl::StrCat("cannot unpack ", items.size(), " values into ", targets.size(), " names"));
  for (size_t i = 0; i < targets.size(); ++i) ctx.Set(targets[i], items[i]);
}

struct For : Stmt {
  std::vector<std::string> targets;
  ExprPtr iter;
  ExprPtr filter;
  Body body;
  Body otherwise;
  void Exec(Ctx& ctx) const override {
    Value seq = iter->Eval(ctx);
    std::vector<Value> items;
    try {
      items = Iterate(seq);
    } catch (CallError& e) {
      iter->Error(e.message);
    }
    ctx.frames.emplace_back();
    if (filter) {
      std::vector<Value> kept;
      for (Value& item : items) {
        ctx.CountIteration(*this);
        Assign(*this, ctx, targets, item);
        if (filter->Eval(ctx).Truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      ctx.CountIteration(*this);
      ctx.frames.back().clear();  // as jinja2: what the body sets lasts one iteration
      ValueDict loop;
      loop.Set("index", i + 1);
      loop.Set("index0", i);
      loop.Set("revindex", n - i);
      loop.Set("revindex0", n - i - 1);
      loop.Set("first", i == 0);
      loop.Set("last", i == n - 1);
      loop.Set("length", n);
      loop.Set("depth", 1);
      loop.Set("depth0", 0);
      loop.Set("previtem",
               i > 0 ? items[i - 1] : Value::MakeUndefined("there is no previous item"));
      loop.Set("nextitem",
               i + 1 < n ? items[i + 1] : Value::MakeUndefined("there is no next item"));
      loop.Set("cycle", Value::MakeCallable("cycle", [i](CallArgs& args) -> Value {
                 if (args.positional.empty()) throw CallError{"no items for cycling given"};
                 return args.positional[i % args.positional.size()];
               }));
      ctx.Set("loop", Value(std::move(loop)));
      Assign(*this, ctx, targets, items[i]);
      ExecBody(body, ctx);
      if (ctx.flow == Flow::kBreak) {
        ctx.flow = Flow::kNormal;
        break;
      }
      ctx.flow = Flow::kNormal;
    }
    ctx.frames.pop_back();
    if (n == 0) ExecBody(otherwise, ctx);
  }
};

struct LoopControl : Stmt {
  Flow flow;
  void Exec(Ctx& ctx) const override { ctx.flow = flow; }
};

struct Set : Stmt {
  std::vector<std::string> targets;
  std::string attr;  // set targets[0].attr = ...
  ExprPtr value;
  Body body;  // block set
  void Exec(Ctx& ctx) const override {
    Value v;
    if (value) {
      v = value->Eval(ctx);
    } else {
      std::string captured;
      std::string* saved = ctx.out;
      ctx.out = &captured;
      ExecBody(body, ctx);
      ctx.out = saved;
      v = captured;
    }
    if (!attr.empty()) {
      Value ns = ctx.Lookup(targets[0]);
      if (!ns.is_dict() || !ns.dict().is_namespace)
        Error("cannot assign attribute on non-namespace object '" + targets[0] + "'");
      ns.dict().Set(attr, std::move(v));
      return;
    }
    Assign(*this, ctx, targets, v);
  }
};

struct Macro : Stmt {
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default may be null
  Body body;
  void Exec(Ctx& ctx) const override {
    Ctx* c = &ctx;
    const Macro* self = this;
    ctx.Set(name, Value::MakeCallable(
                      name, [c, self](CallArgs& args) -> Value { return self->Invoke(*c, args); }));
  }
  Value Invoke(Ctx& ctx, CallArgs& args) const {
    if (ctx.depth >= ctx.limits.max_call_depth) {
      throw JinjaError{line, col,
                       absl::StrCat("macro calls nested deeper than ", ctx.limits.max_call_depth),
                       true};
    }
    if (args.positional.size() > params.size())
      throw CallError{
          absl::StrCat("macro '", name, "' takes not more than ", params.size(), " argument(s)")};
    absl::flat_hash_map<std::string, Value> frame;
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& [pname, dflt] = params[i];
      Value v = Value::MakeUndefined("'" + pname + "' is undefined");
      bool given = false;
      if (i < args.positional.size()) {
        v = args.positional[i];
        given = true;
      }
      for (auto& [k, kv] : args.keyword) {
        if (k == pname) {
          v = kv;
          given = true;
        }
      }
      if (!given && dflt) v = dflt->Eval(ctx);
      frame[pname] = std::move(v);
    }
    for (auto& [k, kv] : args.keyword) {
      bool known = false;
      for (const auto& p : params) known |= p.first == k;
      if (!known) throw CallError{"macro '" + name + "' takes no keyword argument '" + k + "'"};
    }
    std::vector<absl::flat_hash_map<std::string, Value>> saved_frames;
    saved_frames.swap(ctx.frames);
    ctx.frames.push_back(saved_frames.front());
    ctx.frames.push_back(std::move(frame));
    std::string captured;
    std::string* saved_out = ctx.out;
    ctx.out = &captured;
    ++ctx.depth;
    struct Restore {
      Ctx& ctx;
      std::vector<absl::flat_hash_map<std::string, Value>>& frames;
      std::string* out;
      ~Restore() {
        frames.front() = std::move(ctx.frames.front());
        ctx.frames.swap(frames);
        ctx.out = out;
        --ctx.depth;
        ctx.flow = Flow::kNormal;
      }
    } restore{ctx, saved_frames, saved_out};
    ExecBody(body, ctx);
    return captured;
  }
};

struct Block : Stmt {  // {% generation %}: its body
  Body body;
  void Exec(Ctx& ctx) const override { ExecBody(body, ctx); }
};

// ---------------------------------------------------------------------------------------------
// Parser.

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  // Nesting (of blocks, parentheses, unary operators) deeper than this is a syntax error, not a
  // stack overflow.
  static constexpr int kMaxDepth = 200;
  struct DepthGuard {
    explicit DepthGuard(Parser* p) : parser(p) {
      if (++parser->depth_ > kMaxDepth) {
        Fail(parser->Peek().line, parser->Peek().col,
             absl::StrCat("the template nests deeper than ", kMaxDepth, " levels"));
      }
    }
    ~DepthGuard() { --parser->depth_; }
    Parser* parser;
  };

  Body ParseTemplate() {
    std::string end;
    Body body = ParseUntil({}, &end);
    return body;
  }

 private:
  const Token& Peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& Next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).kind == Tok::kOp && Peek(ahead).text == op;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).kind == Tok::kName && Peek(ahead).text == name;
  }
  static std::string Describe(const Token& t) {
    switch (t.kind) {
      case Tok::kEof:
        return "end of template";
      case Tok::kText:
        return "text";
      case Tok::kVarBegin:
        return "'{{'";
      case Tok::kVarEnd:
        return "'}}'";
      case Tok::kBlockBegin:
        return "'{%'";
      case Tok::kBlockEnd:
        return "'%}'";
      case Tok::kString:
        return "string " + PyStrRepr(t.text);
      case Tok::kInt:
        return "integer " + std::to_string(t.ival);
      case Tok::kFloat:
        return "float";
      default:
        return "'" + t.text + "'";
    }
  }
  [[noreturn]] void Unexpected(const std::string& expected) const {
    Fail(Peek().line, Peek().col, "expected " + expected + ", got " + Describe(Peek()));
  }
  void ExpectOp(const char* op) {
    if (!IsOp(op)) Unexpected(std::string("'") + op + "'");
    Next();
  }
  void Expect(Tok kind, const char* what) {
    if (Peek().kind != kind) Unexpected(what);
    Next();
  }
  std::string ExpectName() {
    if (Peek().kind != Tok::kName) Unexpected("a name");
    return Next().text;
  }
  template <typename T>
  std::unique_ptr<T> Make(const Token& at) {
    auto n = std::make_unique<T>();
    n->line = at.line;
    n->col = at.col;
    return n;
  }

  Body ParseUntil(const std::vector<std::string>& ends, std::string* end) {
    DepthGuard guard(this);
    Body body;
    while (true) {
      const Token& t = Peek();
      if (t.kind == Tok::kEof) {
        if (!ends.empty()) {
          std::string closing = ends[0];
          for (const std::string& e : ends)
            if (e.rfind("end", 0) == 0) closing = e;
          Fail(t.line, t.col, "unexpected end of template: expected '{% " + closing + " %}'");
        }
        return body;
      }
      if (t.kind == Tok::kText) {
        auto o = Make<Output>(t);
        o->text = t.text;
        Next();
        body.push_back(std::move(o));
      } else if (t.kind == Tok::kVarBegin) {
        auto p = Make<Print>(t);
        Next();
        p->expr = ParseTuple();
        Expect(Tok::kVarEnd, "'}}'");
        body.push_back(std::move(p));
      } else if (t.kind == Tok::kBlockBegin) {
        Next();
        const Token& name = Peek();
        if (name.kind != Tok::kName) Unexpected("a statement name");
        if (std::find(ends.begin(), ends.end(), name.text) != ends.end()) {
          *end = name.text;
          Next();
          return body;
        }
        body.push_back(ParseStatement());
      } else {
        Unexpected("text, '{{' or '{%'");
      }
    }
  }

  StmtPtr ParseStatement() {
    const Token& kw = Next();
    const std::string k = kw.text;
    if (k == "for") {
      auto f = Make<For>(kw);
      f->targets = ParseTargets();
      if (!IsName("in")) Unexpected("'in'");
      Next();
      f->iter = ParseTuple(/*with_cond=*/false);
      if (IsName("if")) {
        Next();
        f->filter = ParseExpression();
      }
      if (IsName("recursive")) Fail(Peek().line, Peek().col, "recursive loops are not supported");
      Expect(Tok::kBlockEnd, "'%}'");
      std::string end;
      f->body = ParseUntil({"endfor", "else"}, &end);
      Expect(Tok::kBlockEnd, "'%}'");
      if (end == "else") {
        f->otherwise = ParseUntil({"endfor"}, &end);
        Expect(Tok::kBlockEnd, "'%}'");
      }
      return f;
    }
    if (k == "if") {
      auto s = Make<If>(kw);
      ExprPtr cond = ParseTuple();
      Expect(Tok::kBlockEnd, "'%}'");
      while (true) {
        std::string end;
        Body body = ParseUntil({"elif", "else", "endif"}, &end);
        s->branches.emplace_back(std::move(cond), std::move(body));
        if (end == "elif") {
          cond = ParseTuple();
          Expect(Tok::kBlockEnd, "'%}'");
          continue;
        }
        Expect(Tok::kBlockEnd, "'%}'");
        if (end == "else") {
          s->otherwise = ParseUntil({"endif"}, &end);
          Expect(Tok::kBlockEnd, "'%}'");
        }
        return s;
      }
    }
    if (k == "set") {
      auto s = Make<Set>(kw);
      s->targets.push_back(ExpectName());
      if (IsOp(".")) {
        Next();
        s->attr = ExpectName();
      } else {
        while (IsOp(",")) {
          Next();
          s->targets.push_back(ExpectName());
        }
      }
      if (IsOp("=")) {
        Next();
        s->value = ParseTuple();
        Expect(Tok::kBlockEnd, "'%}'");
        return s;
      }
      if (s->targets.size() != 1 || !s->attr.empty()) Unexpected("'='");
      Expect(Tok::kBlockEnd, "'%}'");
      std::string end;
      s->body = ParseUntil({"endset"}, &end);
      Expect(Tok::kBlockEnd, "'%}'");
      return s;
    }
    if (k == "macro") {
      auto m = Make<Macro>(kw);
      m->name = ExpectName();
      ExpectOp("(");
      while (!IsOp(")")) {
        std::string p = ExpectName();
        ExprPtr dflt;
        if (IsOp("=")) {
          Next();
          dflt = ParseExpression();
        }
        m->params.emplace_back(p, std::move(dflt));
        if (!IsOp(")")) ExpectOp(",");
      }
      Next();
      Expect(Tok::kBlockEnd, "'%}'");
      std::string end;
      m->body = ParseUntil({"endmacro"}, &end);
      if (Peek().kind == Tok::kName) Next();  // {% endmacro name %}
      Expect(Tok::kBlockEnd, "'%}'");
      return m;
    }
    if (k == "break" || k == "continue") {
      auto s = Make<LoopControl>(kw);
      s->flow = k == "break" ? Flow::kBreak : Flow::kContinue;
      Expect(Tok::kBlockEnd, "'%}'");
      return s;
    }
    if (k == "generation") {
      auto b = Make<Block>(kw);
      Expect(Tok::kBlockEnd, "'%}'");
      std::string end;
      b->body = ParseUntil({"endgeneration"}, &end);
      Expect(Tok::kBlockEnd, "'%}'");
      return b;
    }
    Fail(kw.line, kw.col, "unknown or unexpected tag '" + k + "'");
  }

  std::vector<std::string> ParseTargets() {
    std::vector<std::string> out;
    bool paren = IsOp("(");
    if (paren) Next();
    out.push_back(ExpectName());
    while (IsOp(",")) {
      Next();
      out.push_back(ExpectName());
    }
    if (paren) ExpectOp(")");
    return out;
  }

  // An expression, or a tuple of them ("a, b") as a list.
  ExprPtr ParseTuple(bool with_cond = true) {
    const Token& at = Peek();
    ExprPtr e = with_cond ? ParseExpression() : ParseOr();
    if (!IsOp(",")) return e;
    auto list = Make<ListExpr>(at);
    list->items.push_back(std::move(e));
    while (IsOp(",")) {
      Next();
      if (Peek().kind == Tok::kBlockEnd || Peek().kind == Tok::kVarEnd) break;
      list->items.push_back(with_cond ? ParseExpression() : ParseOr());
    }
    return list;
  }

  ExprPtr ParseExpression() {
    DepthGuard guard(this);
    const Token& at = Peek();
    ExprPtr e = ParseOr();
    if (!IsName("if")) return e;
    Next();
    auto c = Make<CondExpr>(at);
    c->then = std::move(e);
    c->cond = ParseOr();
    if (IsName("else")) {
      Next();
      c->otherwise = ParseExpression();
    }
    return c;
  }

  ExprPtr MakeBinary(const Token& at, std::string op, ExprPtr l, ExprPtr r) {
    auto b = Make<Binary>(at);
    b->op = std::move(op);
    b->left = std::move(l);
    b->right = std::move(r);
    return b;
  }

  ExprPtr ParseOr() {
    ExprPtr e = ParseAnd();
    while (IsName("or")) {
      const Token& at = Next();
      e = MakeBinary(at, "or", std::move(e), ParseAnd());
    }
    return e;
  }
  ExprPtr ParseAnd() {
    ExprPtr e = ParseNot();
    while (IsName("and")) {
      const Token& at = Next();
      e = MakeBinary(at, "and", std::move(e), ParseNot());
    }
    return e;
  }
  ExprPtr ParseNot() {
    DepthGuard guard(this);
    if (IsName("not")) {
      auto u = Make<Unary>(Next());
      u->op = "not";
      u->operand = ParseNot();
      return u;
    }
    return ParseCompare();
  }
  ExprPtr ParseCompare() {
    const Token& at = Peek();
    ExprPtr e = ParseMath1();
    std::unique_ptr<CompareExpr> c;
    while (true) {
      std::string op;
      if (Peek().kind == Tok::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" ||
           Peek().text == "<=" || Peek().text == ">" || Peek().text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "notin";
      } else {
        break;
      }
      if (!c) {
        c = Make<CompareExpr>(at);
        c->first = std::move(e);
      }
      c->rest.emplace_back(op, ParseMath1());
    }
    if (c) return c;
    return e;
  }
  ExprPtr ParseMath1() {
    ExprPtr e = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const Token& at = Next();
      e = MakeBinary(at, at.text, std::move(e), ParseConcat());
    }
    return e;
  }
  ExprPtr ParseConcat() {
    ExprPtr e = ParseMath2();
    while (IsOp("~")) {
      const Token& at = Next();
      e = MakeBinary(at, "~", std::move(e), ParseMath2());
    }
    return e;
  }
  ExprPtr ParseMath2() {
    ExprPtr e = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& at = Next();
      e = MakeBinary(at, at.text, std::move(e), ParsePow());
    }
    return e;
  }
  ExprPtr ParsePow() {
    ExprPtr e = ParseUnary(true);
    while (IsOp("**")) {
      const Token& at = Next();
      e = MakeBinary(at, "**", std::move(e), ParseUnary(true));
    }
    return e;
  }
  ExprPtr ParseUnary(bool with_filter) {
    DepthGuard guard(this);
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      auto u = Make<Unary>(Peek());
      u->op = Next().text;
      u->operand = ParseUnary(false);
      e = std::move(u);
    } else {
      e = ParsePrimary();
    }
    e = ParsePostfix(std::move(e));
    if (with_filter) e = ParseFilterExpr(std::move(e));
    return e;
  }

  ExprPtr ParsePrimary() {
    const Token& t = Peek();
    if (t.kind == Tok::kName) {
      Next();
      auto lit = Make<Literal>(t);
      if (t.text == "true" || t.text == "True") {
        lit->value = true;
      } else if (t.text == "false" || t.text == "False") {
        lit->value = false;
      } else if (t.text == "none" || t.text == "None") {
        lit->value = Value::MakeNone();
      } else {
        auto n = Make<Name>(t);
        n->name = t.text;
        return n;
      }
      return lit;
    }
    if (t.kind == Tok::kString) {
      auto lit = Make<Literal>(t);
      std::string s;
      while (Peek().kind == Tok::kString) s += Next().text;
      lit->value = s;
      return lit;
    }
    if (t.kind == Tok::kInt || t.kind == Tok::kFloat) {
      Next();
      auto lit = Make<Literal>(t);
      lit->value = t.kind == Tok::kInt ? Value(t.ival) : Value(t.fval);
      return lit;
    }
    if (IsOp("(")) {
      Next();
      if (IsOp(")")) {
        Next();
        return Make<ListExpr>(t);
      }
      ExprPtr e = ParseExpression();
      if (IsOp(",")) {
        auto list = Make<ListExpr>(t);
        list->items.push_back(std::move(e));
        while (IsOp(",")) {
          Next();
          if (IsOp(")")) break;
          list->items.push_back(ParseExpression());
        }
        e = std::move(list);
      }
      ExpectOp(")");
      return e;
    }
    if (IsOp("[")) {
      Next();
      auto list = Make<ListExpr>(t);
      while (!IsOp("]")) {
        list->items.push_back(ParseExpression());
        if (!IsOp("]")) ExpectOp(",");
      }
      Next();
      return list;
    }
    if (IsOp("{")) {
      Next();
      auto dict = Make<DictExpr>(t);
      while (!IsOp("}")) {
        ExprPtr k = ParseExpression();
        ExpectOp(":");
        ExprPtr v = ParseExpression();
        dict->items.emplace_back(std::move(k), std::move(v));
        if (!IsOp("}")) ExpectOp(",");
      }
      Next();
      return dict;
    }
    Unexpected("an expression");
  }

  std::vector<Arg> ParseArgs() {  // after '('
    std::vector<Arg> args;
    while (!IsOp(")")) {
      Arg a;
      if (Peek().kind == Tok::kName && IsOp("=", 1)) {
        a.name = Next().text;
        Next();
      }
      a.value = ParseExpression();
      args.push_back(std::move(a));
      if (!IsOp(")")) ExpectOp(",");
    }
    Next();
    return args;
  }

  ExprPtr ParsePostfix(ExprPtr e) {
    while (true) {
      const Token& at = Peek();
      if (IsOp(".")) {
        Next();
        auto g = Make<GetAttr>(at);
        g->obj = std::move(e);
        if (Peek().kind == Tok::kInt) {
          auto item = Make<GetItem>(at);
          item->obj = std::move(g->obj);
          auto lit = Make<Literal>(Peek());
          lit->value = Next().ival;
          item->index = std::move(lit);
          e = std::move(item);
          continue;
        }
        g->name = ExpectName();
        e = std::move(g);
      } else if (IsOp("[")) {
        Next();
        ExprPtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!IsOp(":") && !IsOp("]")) parts[k] = ParseExpression();
          if (k < 2 && IsOp(":")) {
            Next();
            slice = true;
          } else {
            break;
          }
        }
        ExpectOp("]");
        if (slice) {
          auto s = Make<SliceExpr>(at);
          s->obj = std::move(e);
          s->start = std::move(parts[0]);
          s->stop = std::move(parts[1]);
          s->step = std::move(parts[2]);
          e = std::move(s);
        } else {
          if (!parts[0]) Fail(at.line, at.col, "expected a subscript");
          auto g = Make<GetItem>(at);
          g->obj = std::move(e);
          g->index = std::move(parts[0]);
          e = std::move(g);
        }
      } else if (IsOp("(")) {
        Next();
        auto c = Make<Call>(at);
        c->line = e->line;  // errors point at the callee's name
        c->col = e->col;
        c->callee = std::move(e);
        c->args = ParseArgs();
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr ParseFilterExpr(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        const Token& at = Next();
        auto f = Make<FilterExpr>(at);
        f->input = std::move(e);
        f->name = ExpectName();
        while (IsOp(".")) {
          Next();
          f->name += "." + ExpectName();
        }
        if (IsOp("(")) {
          Next();
          f->args = ParseArgs();
        }
        e = std::move(f);
      } else if (IsName("is")) {
        const Token& at = Next();
        auto t = Make<TestExpr>(at);
        t->input = std::move(e);
        if (IsName("not")) {
          Next();
          t->negated = true;
        }
        t->name = ExpectName();
        if (IsOp("(")) {
          Next();
          t->args = ParseArgs();
        } else {
          const Token& p = Peek();
          bool arg_start =
              p.kind == Tok::kString || p.kind == Tok::kInt || p.kind == Tok::kFloat || IsOp("[") ||
              IsOp("{") ||
              (p.kind == Tok::kName && p.text != "else" && p.text != "or" && p.text != "and" &&
               p.text != "if" && p.text != "in" && p.text != "not" && p.text != "is");
          if (arg_start) {
            Arg a;
            a.value = ParsePostfix(ParsePrimary());
            t->args.push_back(std::move(a));
          }
        }
        e = std::move(t);
      } else if (IsOp("(")) {
        // A call on a filtered value, e.g. (x|attr)(...): rare; as jinja2 does.
        const Token& at = Next();
        auto c = Make<Call>(at);
        c->callee = std::move(e);
        c->args = ParseArgs();
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Filters, tests, methods and globals.

int64_t Length(const Value& v) {
  if (v.is_undefined()) return 0;
  if (v.is_string()) return static_cast<int64_t>(Utf8Chars(v.as_string()).size());
  if (v.is_list()) return static_cast<int64_t>(v.list().size());
  if (v.is_dict()) return static_cast<int64_t>(v.dict().items.size());
  throw CallError{"object of type '" + v.TypeName() + "' has no len()"};
}

// jinja2's attribute lookup for filters: "a.b" walks dicts; integers index lists.
Value AttrPath(const Value& v, const std::string& path) {
  Value cur = v;
  size_t pos = 0;
  while (true) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    if (cur.is_undefined()) return cur;
    cur = numeric && cur.is_list()
              ? GetItemValue(cur, Value(static_cast<int64_t>(std::stoll(part))))
              : GetItemValue(cur, Value(part));
    if (dot == std::string::npos) return cur;
    pos = dot + 1;
  }
}

Value ApplyFilter(const std::string& name, const Value& in, CallArgs& args, Ctx& ctx) {
  ArgReader r(args, name);
  if (name == "trim") {
    Value chars = r.Get(0, "chars");
    std::string c = chars.is_string() ? chars.as_string() : "";
    return PyStrip(in.Str(), chars.is_string() ? &c : nullptr, true, true);
  }
  if (name == "length" || name == "count") return Length(in);
  if (name == "tojson") {
    Value indent = r.Get(0, "indent");
    int ind = -1;
    if (indent.is_int()) ind = static_cast<int>(std::clamp<int64_t>(indent.as_int(), 0, 64));
    return ToJson(in, ind, r.Get(3, "sort_keys").Truthy());
  }
  if (name == "upper") return AsciiUpper(in.Str());
  if (name == "lower") return AsciiLower(in.Str());
  if (name == "title") return JinjaTitle(in.Str());
  if (name == "capitalize") return PyCapitalize(in.Str());
  if (name == "string") return in.Str();
  if (name == "safe" || name == "e" || name == "escape" || name == "forceescape") {
    if (name == "safe") return in;
    std::string out;
    for (char c : in.Str()) {
      switch (c) {
        case '&':
          out += "&amp;";
          break;
        case '<':
          out += "&lt;";
          break;
        case '>':
          out += "&gt;";
          break;
        case '"':
          out += "&#34;";
          break;
        case '\'':
          out += "&#39;";
          break;
        default:
          out.push_back(c);
      }
    }
    return out;
  }
  if (name == "default" || name == "d") {
    Value dflt = r.Get(0, "default_value", Value(""));
    bool boolean = r.Get(1, "boolean").Truthy();
    if (in.is_undefined() || (boolean && !in.Truthy())) return dflt;
    return in;
  }
  if (name == "first" || name == "last") {
    std::vector<Value> items = Iterate(in);
    if (items.empty()) return Value::MakeUndefined("No " + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    std::string sep = r.Get(0, "d", Value("")).Str();
    Value attr = r.Get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& v : Iterate(in)) {
      if (!first) out += sep;
      first = false;
      out += attr.is_string() ? AttrPath(v, attr.as_string()).Str() : v.Str();
    }
    return out;
  }
  if (name == "replace") {
    std::string s = in.Str();
    std::string from = r.Required(0, "old").Str();
    std::string to = r.Required(1, "new").Str();
    Value count = r.Get(2, "count");
    return PyReplace(s, from, to, count.is_int() ? count.as_int() : -1);
  }
  if (name == "list") return ValueList(Iterate(in));
  if (name == "items") {
    if (in.is_undefined()) return ValueList();
    if (!in.is_dict()) throw CallError{"items filter expects a dict, got " + in.TypeName()};
    ValueList out;
    for (const auto& [k, v] : in.dict().items) out.push_back(ValueList{Value(k), v});
    return out;
  }
  if (name == "int") {
    Value dflt = r.Get(0, "default", Value(int64_t{0}));
    if (in.is_int()) return in;
    if (in.is_bool()) return int64_t{in.as_bool()};
    // Out of int64's range (or not finite) takes the default, as jinja2's int does on errors.
    auto to_int = [&dflt](double d) -> Value {
      if (!(d > -9.2e18 && d < 9.2e18)) return dflt;
      return static_cast<int64_t>(d);
    };
    if (in.is_float()) return to_int(in.as_float());
    if (in.is_string()) {
      std::string s = PyStrip(in.as_string(), nullptr, true, true);
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && *end == '\0' && errno == 0) return static_cast<int64_t>(v);
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && *end == '\0') return to_int(d);
    }
    return dflt;
  }
  if (name == "float") {
    if (in.is_number()) return in.as_number();
    if (in.is_string()) {
      char* end = nullptr;
      double d = std::strtod(in.as_string().c_str(), &end);
      if (!in.as_string().empty() && *end == '\0') return d;
    }
    return r.Get(0, "default", Value(0.0));
  }
  if (name == "abs") {
    if (in.is_int()) {
      if (in.as_int() == std::numeric_limits<int64_t>::min())
        throw CallError{"integer overflow in abs (integers are 64-bit here)"};
      return in.as_int() < 0 ? -in.as_int() : in.as_int();
    }
    if (in.is_float()) return std::fabs(in.as_float());
    throw CallError{"bad operand type for abs(): '" + in.TypeName() + "'"};
  }
  if (name == "reverse") {
    if (in.is_string()) {
      std::vector<std::string> cs = Utf8Chars(in.as_string());
      std::string out;
      for (auto it = cs.rbegin(); it != cs.rend(); ++it) out += *it;
      return out;
    }
    std::vector<Value> items = Iterate(in);
    std::reverse(items.begin(), items.end());
    return ValueList(std::move(items));
  }
  if (name == "unique") {
    ValueList out;
    for (const Value& v : Iterate(in)) {
      bool seen = false;
      for (const Value& o : out) seen |= Equal(o, v);
      if (!seen) out.push_back(v);
    }
    return out;
  }
  if (name == "indent") {
    int64_t width = r.Get(0, "width", Value(int64_t{4})).is_int()
                        ? r.Get(0, "width", Value(int64_t{4})).as_int()
                        : 4;
    bool first = r.Get(1, "first").Truthy();
    bool blank = r.Get(2, "blank").Truthy();
    std::string pad(static_cast<size_t>(std::clamp<int64_t>(width, 0, 256)), ' ');
    std::string s = in.Str();
    std::string out;
    size_t pos = 0;
    bool line0 = true;
    while (pos <= s.size()) {
      size_t nl = s.find('\n', pos);
      std::string line = s.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      if ((!line0 || first) && (blank || !line.empty())) out += pad;
      out += line;
      if (nl == std::string::npos) break;
      out += "\n";
      pos = nl + 1;
      line0 = false;
    }
    return out;
  }
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    bool by_attr = name == "selectattr" || name == "rejectattr";
    bool keep_if = name == "selectattr" || name == "select";
    size_t k = 0;
    std::string attr;
    if (by_attr) {
      if (args.positional.empty()) throw CallError{name + "() missing the attribute name"};
      attr = args.positional[0].Str();
      k = 1;
    }
    std::string test;
    CallArgs test_args;
    if (k < args.positional.size()) {
      test = args.positional[k].Str();
      test_args.positional.assign(args.positional.begin() + k + 1, args.positional.end());
    }
    ValueList out;
    for (const Value& item : Iterate(in)) {
      Value subject = by_attr ? AttrPath(item, attr) : item;
      bool pass = test.empty() ? subject.Truthy() : ApplyTest(test, subject, test_args, ctx);
      if (pass == keep_if) out.push_back(item);
    }
    return out;
  }
  if (name == "map") {
    Value attr = r.Get(99, "attribute");
    ValueList out;
    if (attr.is_string()) {
      Value dflt = r.Get(99, "default");
      for (const Value& item : Iterate(in)) {
        Value v = AttrPath(item, attr.as_string());
        out.push_back(v.is_undefined() && !dflt.is_undefined() ? dflt : v);
      }
      return out;
    }
    if (args.positional.empty()) throw CallError{"map() needs a filter name or attribute="};
    std::string filter = args.positional[0].Str();
    CallArgs fargs;
    fargs.positional.assign(args.positional.begin() + 1, args.positional.end());
    fargs.keyword = args.keyword;
    for (const Value& item : Iterate(in)) {
      CallArgs a = fargs;
      out.push_back(ApplyFilter(filter, item, a, ctx));
    }
    return out;
  }
  if (name == "dictsort") {
    if (!in.is_dict()) throw CallError{"dictsort expects a dict, got " + in.TypeName()};
    std::vector<std::pair<std::string, Value>> items = in.dict().items;
    std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
      return AsciiLower(a.first) < AsciiLower(b.first);
    });
    ValueList out;
    for (auto& [k, v] : items) out.push_back(ValueList{Value(k), v});
    return out;
  }
  if (name == "wordcount") {
    int64_t n = 0;
    bool in_word = false;
    for (char c : in.Str()) {
      bool w = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || (c & 0x80);
      if (w && !in_word) ++n;
      in_word = w;
    }
    return n;
  }
  throw CallError{"no filter named '" + name + "'"};
}

bool ApplyTest(const std::string& name, const Value& v, CallArgs& args, Ctx&) {
  ArgReader r(args, name);
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "callable") return v.is_callable();
  if (name == "lower") return v.is_string() && AsciiLower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && AsciiUpper(v.as_string()) == v.as_string();
  if (name == "even" || name == "odd") {
    if (!v.is_int()) throw CallError{"test '" + name + "' expects an integer, got " + v.TypeName()};
    return (PyMod(v.as_int(), 2) == 0) == (name == "even");
  }
  if (name == "divisibleby") {
    Value n = r.Required(0, "num");
    if (!v.is_int() || !n.is_int() || n.as_int() == 0)
      throw CallError{"divisibleby expects non-zero integers"};
    return PyMod(v.as_int(), n.as_int()) == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return Equal(v, r.Required(0, "other"));
  if (name == "ne" || name == "!=") return !Equal(v, r.Required(0, "other"));
  if (name == "lt" || name == "lessthan" || name == "<")
    return Compare(v, r.Required(0, "other"), "<") < 0;
  if (name == "le" || name == "<=") return Compare(v, r.Required(0, "other"), "<=") <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">")
    return Compare(v, r.Required(0, "other"), ">") > 0;
  if (name == "ge" || name == ">=") return Compare(v, r.Required(0, "other"), ">=") >= 0;
  if (name == "in") return Contains(r.Required(0, "seq"), v);
  if (name == "sameas") {
    Value o = r.Required(0, "other");
    if (v.is_none() || v.is_bool() || o.is_none() || o.is_bool())
      return v.TypeName() == o.TypeName() && Equal(v, o);
    return false;
  }
  throw CallError{"no test named '" + name + "'"};
}

Value SplitString(const std::string& s, const Value& sep_v, int64_t maxsplit) {
  ValueList out;
  if (sep_v.is_undefined() || sep_v.is_none()) {
    // Runs of whitespace; no empty strings.
    std::vector<std::string> cs = Utf8Chars(s);
    size_t i = 0;
    int64_t splits = 0;
    while (i < cs.size()) {
      while (i < cs.size() && IsPySpace(DecodeChar(cs[i]))) ++i;
      if (i >= cs.size()) break;
      std::string word;
      if (maxsplit >= 0 && splits >= maxsplit) {
        for (; i < cs.size(); ++i) word += cs[i];
        word = PyStrip(word, nullptr, false, true);
        out.emplace_back(word);
        break;
      }
      while (i < cs.size() && !IsPySpace(DecodeChar(cs[i]))) word += cs[i++];
      out.emplace_back(word);
      ++splits;
    }
    return out;
  }
  if (!sep_v.is_string()) throw CallError{"split(): separator must be a string"};
  const std::string& sep = sep_v.as_string();
  if (sep.empty()) throw CallError{"empty separator"};
  size_t pos = 0;
  int64_t splits = 0;
  while (maxsplit < 0 || splits < maxsplit) {
    size_t hit = s.find(sep, pos);
    if (hit == std::string::npos) break;
    out.emplace_back(s.substr(pos, hit - pos));
    pos = hit + sep.size();
    ++splits;
  }
  out.emplace_back(s.substr(pos));
  return out;
}

Value CallMethod(const Value& obj, const std::string& name, CallArgs& args, bool* found) {
  *found = true;
  ArgReader r(args, name);
  if (obj.is_string()) {
    const std::string& s = obj.as_string();
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      Value chars = r.Get(0, "chars");
      std::string c = chars.is_string() ? chars.as_string() : "";
      return PyStrip(s, chars.is_string() ? &c : nullptr, name != "rstrip", name != "lstrip");
    }
    if (name == "startswith" || name == "endswith") {
      Value arg = r.Required(0, "prefix");
      std::vector<Value> options = arg.is_list() ? arg.list() : std::vector<Value>{arg};
      for (const Value& o : options) {
        if (!o.is_string())
          throw CallError{name + "() argument must be str or a tuple of str, not " + o.TypeName()};
        const std::string& p = o.as_string();
        if (p.size() <= s.size() &&
            (name == "startswith" ? s.compare(0, p.size(), p) == 0
                                  : s.compare(s.size() - p.size(), p.size(), p) == 0))
          return true;
      }
      return false;
    }
    if (name == "split" || name == "rsplit") {
      Value maxsplit = r.Get(1, "maxsplit");
      int64_t m = maxsplit.is_int() ? maxsplit.as_int() : -1;
      if (name == "rsplit" && m >= 0) {
        // Split from the right: reverse the pieces of a full split and rejoin the head.
        Value all = SplitString(s, r.Get(0, "sep"), -1);
        ValueList& parts = all.list();
        if (static_cast<int64_t>(parts.size()) <= m + 1) return all;
        Value sep = r.Get(0, "sep");
        std::string joiner = sep.is_string() ? sep.as_string() : " ";
        std::string head;
        size_t n_head = parts.size() - static_cast<size_t>(m);
        for (size_t i = 0; i < n_head; ++i) head += (i ? joiner : "") + parts[i].as_string();
        ValueList out{Value(head)};
        for (size_t i = n_head; i < parts.size(); ++i) out.push_back(parts[i]);
        return out;
      }
      return SplitString(s, r.Get(0, "sep"), m);
    }
    if (name == "upper") return AsciiUpper(s);
    if (name == "lower") return AsciiLower(s);
    if (name == "title") return PyTitle(s);
    if (name == "capitalize") return PyCapitalize(s);
    if (name == "replace") {
      Value count = r.Get(2, "count");
      return PyReplace(s, r.String(0, "old"), r.String(1, "new"),
                       count.is_int() ? count.as_int() : -1);
    }
    if (name == "find" || name == "count" || name == "index") {
      std::string sub = r.String(0, "sub");
      if (name == "count") {
        if (sub.empty()) return static_cast<int64_t>(Utf8Chars(s).size() + 1);
        int64_t n = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return n;
      }
      size_t p = s.find(sub);
      if (p == std::string::npos) {
        if (name == "index") throw CallError{"substring not found"};
        return int64_t{-1};
      }
      return static_cast<int64_t>(Utf8Chars(s.substr(0, p)).size());
    }
    if (name == "join") {
      std::string out;
      bool first = true;
      for (const Value& v : Iterate(r.Required(0, "iterable"))) {
        if (!v.is_string())
          throw CallError{"sequence item: expected str instance, " + v.TypeName() + " found"};
        if (!first) out += s;
        first = false;
        out += v.as_string();
      }
      return out;
    }
    if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum") {
      if (s.empty()) return false;
      for (char c : s) {
        unsigned char u = static_cast<unsigned char>(c);
        bool ok = name == "isdigit"   ? std::isdigit(u)
                  : name == "isspace" ? std::isspace(u)
                  : name == "isalpha" ? std::isalpha(u)
                                      : std::isalnum(u);
        if (!ok) return false;
      }
      return true;
    }
    if (name == "splitlines") {
      ValueList out;
      size_t pos = 0;
      while (pos < s.size()) {
        size_t nl = s.find('\n', pos);
        std::string line = s.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        out.emplace_back(line);
        if (nl == std::string::npos) break;
        pos = nl + 1;
      }
      return out;
    }
  } else if (obj.is_dict()) {
    const ValueDict& d = obj.dict();
    if (name == "items") {
      ValueList out;
      for (const auto& [k, v] : d.items) out.push_back(ValueList{Value(k), v});
      return out;
    }
    if (name == "keys") {
      ValueList out;
      for (const auto& kv : d.items) out.emplace_back(kv.first);
      return out;
    }
    if (name == "values") {
      ValueList out;
      for (const auto& kv : d.items) out.push_back(kv.second);
      return out;
    }
    if (name == "get") {
      Value key = r.Required(0, "key");
      if (key.is_string())
        if (const Value* v = d.Find(key.as_string())) return *v;
      return r.Get(1, "default", Value::MakeNone());
    }
  } else if (obj.is_list()) {
    if (name == "index" || name == "count") {
      Value x = r.Required(0, "value");
      int64_t n = 0;
      for (size_t i = 0; i < obj.list().size(); ++i) {
        if (Equal(obj.list()[i], x)) {
          if (name == "index") return static_cast<int64_t>(i);
          ++n;
        }
      }
      if (name == "index") throw CallError{x.Repr() + " is not in list"};
      return n;
    }
  }
  *found = false;
  return Value();
}

Value Global(const std::string& name) {
  static const auto* globals = [] {
    auto* g = new absl::flat_hash_map<std::string, Value>();
    (*g)["raise_exception"] = Value::MakeCallable("raise_exception", [](CallArgs& args) -> Value {
      ArgReader r(args, "raise_exception");
      throw CallError{r.Required(0, "message").Str()};
    });
    (*g)["strftime_now"] = Value::MakeCallable("strftime_now", [](CallArgs& args) -> Value {
      ArgReader r(args, "strftime_now");
      std::string fmt = r.String(0, "format");
      std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[512];
      size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
      return std::string(buf, n);
    });
    (*g)["namespace"] = Value::MakeCallable("namespace", [](CallArgs& args) -> Value {
      ValueDict d;
      d.is_namespace = true;
      for (const Value& p : args.positional) {
        if (!p.is_dict()) throw CallError{"namespace() takes dicts and keyword arguments"};
        for (const auto& [k, v] : p.dict().items) d.Set(k, v);
      }
      for (auto& [k, v] : args.keyword) d.Set(k, v);
      return Value(std::move(d));
    });
    (*g)["dict"] = Value::MakeCallable("dict", [](CallArgs& args) -> Value {
      ValueDict d;
      for (const Value& p : args.positional) {
        if (!p.is_dict()) throw CallError{"dict() takes dicts and keyword arguments"};
        for (const auto& [k, v] : p.dict().items) d.Set(k, v);
      }
      for (auto& [k, v] : args.keyword) d.Set(k, v);
      return Value(std::move(d));
    });
    (*g)["range"] = Value::MakeCallable("range", [](CallArgs& args) -> Value {
      std::vector<int64_t> a;
      for (const Value& v : args.positional) {
        if (!v.is_int()) throw CallError{"range() takes integers, got " + v.TypeName()};
        a.push_back(v.as_int());
      }
      if (a.empty() || a.size() > 3) throw CallError{"range() takes 1 to 3 integers"};
      int64_t start = a.size() == 1 ? 0 : a[0], stop = a.size() == 1 ? a[0] : a[1];
      int64_t step = a.size() == 3 ? a[2] : 1;
      if (step == 0) throw CallError{"range() arg 3 must not be zero"};
      ValueList out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
        if (out.size() >= (1u << 20)) throw CallError{"range() too large"};
        out.emplace_back(i);
        if (__builtin_add_overflow(i, step, &i)) break;
      }
      return out;
    });
    return g;
  }();
  auto it = globals->find(name);
  return it == globals->end() ? Value() : it->second;
}

absl::Status ToStatus(const JinjaError& e) {
  std::string msg = absl::StrCat("line ", e.line, ":", e.col, ": ", e.message);
  return e.resource ? absl::ResourceExhaustedError(msg) : absl::InvalidArgumentError(msg);
}

}  // namespace

struct Template::Impl {
  Body body;
  Limits limits;
};

Template::Template(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Template::~Template() = default;

absl::StatusOr<std::unique_ptr<const Template>> Template::Parse(std::string_view source,
                                                                Limits limits) {
  // As jinja2: newlines normalized to "\n", one trailing newline dropped.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src.push_back(source[i]);
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  try {
    Lexer lexer(src);
    Parser parser(lexer.Run());
    auto impl = std::make_unique<Impl>();
    impl->body = parser.ParseTemplate();
    impl->limits = limits;
    return std::unique_ptr<const Template>(new Template(std::move(impl)));
  } catch (const JinjaError& e) {
    return ToStatus(e);
  }
}

absl::StatusOr<std::string> Template::Render(const ValueDict& context) const {
  std::string out;
  Ctx ctx;
  ctx.context = &context;
  ctx.out = &out;
  ctx.limits = impl_->limits;
  ctx.frames.emplace_back();
  try {
    ExecBody(impl_->body, ctx);
  } catch (const JinjaError& e) {
    return ToStatus(e);
  } catch (const CallError& e) {
    return absl::InvalidArgumentError(e.message);
  }
  return out;
}

}  // namespace llm::jinja
