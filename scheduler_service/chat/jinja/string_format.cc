#include "scheduler_service/chat/jinja/string_format.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/utf8.h"
#include "scheduler_service/chat/jinja/operators.h"
#include "scheduler_service/chat/jinja/python_string.h"

namespace llm::jinja {
namespace {

// A parsed format spec; printf-style conversions are parsed into the same form.
struct Spec {
  std::string fill = " ";
  char align = 0;   // '<', '>', '^', '=', or 0 for the default of the value's type
  char sign = '-';  // '-': only negatives; '+': always; ' ': a space for non-negatives
  bool alt = false;
  int64_t width = 0;
  int64_t precision = -1;
  char grouping = 0;  // ',' or '_' between thousands
  char type = 0;
};

int64_t CharCount(const std::string& s) { return static_cast<int64_t>(SplitUtf8Chars(s).size()); }

// `prefix` (sign, 0x) and `body` padded to spec.width.
std::string Pad(const std::string& prefix, const std::string& body, const Spec& spec,
                char default_align) {
  const int64_t len = CharCount(prefix) + CharCount(body);
  if (spec.width <= len) return prefix + body;
  // A width beyond any output limit fails here rather than allocating it.
  if (spec.width > (int64_t{1} << 24)) throw CallError{"format width too large"};
  const int64_t n = spec.width - len;
  auto fills = [&](int64_t k) {
    std::string out;
    for (int64_t i = 0; i < k; ++i) out += spec.fill;
    return out;
  };
  switch (spec.align ? spec.align : default_align) {
    case '<':
      return prefix + body + fills(n);
    case '^':
      return fills(n / 2) + prefix + body + fills(n - n / 2);
    case '=':
      return prefix + fills(n) + body;
    default:
      return fills(n) + prefix + body;
  }
}

// Inserts `sep` between groups of three digits of the leading run of digits of `s`.
std::string Group(const std::string& s, char sep) {
  if (sep == 0) return s;
  size_t end = 0;
  while (end < s.size() && s[end] >= '0' && s[end] <= '9') ++end;
  std::string out;
  for (size_t i = 0; i < end; ++i) {
    if (i > 0 && (end - i) % 3 == 0) out.push_back(sep);
    out.push_back(s[i]);
  }
  return out + s.substr(end);
}

std::string SignPrefix(bool negative, const Spec& spec) {
  if (negative) return "-";
  if (spec.sign == '+') return "+";
  if (spec.sign == ' ') return " ";
  return "";
}

std::string FormatFloat(double v, Spec spec) {
  const bool negative = std::signbit(v) && !std::isnan(v);
  const double a = std::fabs(v);
  std::string body;
  char type = spec.type == 'n' ? 'g' : spec.type;
  if (type == 0 && spec.precision < 0) {
    body = PyFloatRepr(a);
  } else {
    const bool percent = type == '%';
    if (percent) type = 'f';
    const bool general = type == 0;
    if (general) type = 'g';
    const int precision = static_cast<int>(std::min<int64_t>(
        spec.precision < 0 ? 6 : (general && spec.precision == 0 ? 1 : spec.precision), 100));
    char fmt[16];
    std::snprintf(fmt, sizeof(fmt), "%%%s.*%c", spec.alt ? "#" : "", type);
    char buf[512];
    std::snprintf(buf, sizeof(buf), fmt, precision, percent ? a * 100 : a);
    body = buf;
    // Without a type, Python keeps one digit after the point of a whole number ('1.0').
    if (general && std::isfinite(a) && body.find_first_of(".e") == std::string::npos) body += ".0";
    if (percent) body += "%";
  }
  body = Group(body, spec.grouping);
  return Pad(SignPrefix(negative, spec), body, spec, '>');
}

std::string FormatInt(int64_t v, const Spec& spec) {
  switch (spec.type) {
    case 'e':
    case 'E':
    case 'f':
    case 'F':
    case 'g':
    case 'G':
    case '%':
      return FormatFloat(static_cast<double>(v), spec);
    case 'c': {
      if (v < 0 || v > 0x10ffff) throw CallError{"%c arg not in range(0x110000)"};
      std::string ch;
      AppendUtf8(static_cast<uint32_t>(v), &ch);
      return Pad("", ch, spec, '<');
    }
    default:
      break;
  }
  const uint64_t mag = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  std::string digits;
  std::string prefix = SignPrefix(v < 0, spec);
  int base = 10;
  if (spec.type == 'x' || spec.type == 'X') base = 16;
  if (spec.type == 'o') base = 8;
  if (spec.type == 'b') base = 2;
  if (spec.alt && base != 10) {
    prefix += base == 16 ? (spec.type == 'X' ? "0X" : "0x") : base == 8 ? "0o" : "0b";
  }
  const char* alphabet = spec.type == 'X' ? "0123456789ABCDEF" : "0123456789abcdef";
  uint64_t m = mag;
  do {
    digits.insert(digits.begin(), alphabet[m % base]);
    m /= base;
  } while (m != 0);
  return Pad(prefix, Group(digits, spec.grouping), spec, '>');
}

std::string FormatString(const std::string& s, const Spec& spec) {
  std::string body = s;
  if (spec.precision >= 0) {
    std::vector<std::string_view> cs = SplitUtf8Chars(s);
    body.clear();
    for (int64_t i = 0; i < spec.precision && i < static_cast<int64_t>(cs.size()); ++i)
      body += cs[i];
  }
  return Pad("", body, spec, '<');
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

int64_t ReadNumber(const std::string& s, size_t* i) {
  int64_t n = 0;
  while (*i < s.size() && IsDigit(s[*i])) {
    n = n * 10 + (s[*i] - '0');
    if (n > (int64_t{1} << 31)) throw CallError{"Too many decimal digits in format string"};
    ++*i;
  }
  return n;
}

Spec ParseSpec(const std::string& s) {
  Spec spec;
  size_t i = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  std::vector<std::string_view> cs = SplitUtf8Chars(s);
  if (cs.size() >= 2 && cs[1].size() == 1 && is_align(cs[1][0])) {
    spec.fill = std::string(cs[0]);
    spec.align = cs[1][0];
    i = cs[0].size() + 1;
  } else if (!s.empty() && is_align(s[0])) {
    spec.align = s[0];
    i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) spec.sign = s[i++];
  if (i < s.size() && s[i] == '#') {
    spec.alt = true;
    ++i;
  }
  if (i < s.size() && s[i] == '0') {
    if (spec.align == 0) {
      spec.fill = "0";
      spec.align = '=';
    }
    ++i;
  }
  spec.width = ReadNumber(s, &i);
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) spec.grouping = s[i++];
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (i >= s.size() || !IsDigit(s[i])) throw CallError{"Format specifier missing precision"};
    spec.precision = ReadNumber(s, &i);
  }
  if (i < s.size()) spec.type = s[i++];
  if (i < s.size()) throw CallError{"Invalid format specifier '" + s + "'"};
  return spec;
}

[[noreturn]] void UnknownCode(char type, const Value& v) {
  throw CallError{absl::StrCat("Unknown format code '", std::string(1, type),
                               "' for object of type '", v.TypeName(), "'")};
}

}  // namespace

std::string FormatValue(const Value& value, const std::string& spec_text) {
  if (spec_text.empty()) return value.Str();
  const Spec spec = ParseSpec(spec_text);
  if (value.is_int() || value.is_bool()) {
    if (spec.type == 's') UnknownCode(spec.type, value);
    if (spec.type != 0 && std::string_view("bcdoxXneEfFgG%").find(spec.type) == std::string::npos)
      UnknownCode(spec.type, value);
    return FormatInt(value.is_bool() ? int64_t{value.as_bool()} : value.as_int(), spec);
  }
  if (value.is_float()) {
    if (spec.type != 0 && std::string_view("eEfFgGn%").find(spec.type) == std::string::npos)
      UnknownCode(spec.type, value);
    return FormatFloat(value.as_float(), spec);
  }
  if (value.is_string()) {
    if (spec.type != 0 && spec.type != 's') UnknownCode(spec.type, value);
    return FormatString(value.as_string(), spec);
  }
  throw CallError{"unsupported format string passed to " + value.TypeName() + ".__format__"};
}

std::string PercentFormat(const std::string& fmt, const Value& args) {
  // As Python: a tuple is the arguments; a mapping (or anything subscriptable but a string)
  // may serve %(name)s and is never "not all converted"; anything else is one argument.
  const bool tuple = args.is_tuple();
  const bool mapping = !tuple && (args.is_dict() || args.is_list());
  std::vector<Value> positional = tuple ? args.list() : std::vector<Value>{args};
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size();) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i++]);
      continue;
    }
    if (++i >= fmt.size()) throw CallError{"incomplete format"};
    Value arg;
    bool have_arg = false;
    if (fmt[i] == '(') {
      size_t close = fmt.find(')', i);
      if (close == std::string::npos) throw CallError{"incomplete format key"};
      if (!args.is_dict()) throw CallError{"format requires a mapping"};
      const std::string key = fmt.substr(i + 1, close - i - 1);
      const Value* v = args.dict().Find(key);
      if (v == nullptr) throw CallError{PyStrRepr(key)};
      arg = *v;
      have_arg = true;
      i = close + 1;
    }
    Spec spec;
    bool zero = false;
    for (; i < fmt.size(); ++i) {
      const char c = fmt[i];
      if (c == '-') {
        spec.align = '<';
      } else if (c == '+') {
        spec.sign = '+';
      } else if (c == ' ') {
        if (spec.sign != '+') spec.sign = ' ';
      } else if (c == '#') {
        spec.alt = true;
      } else if (c == '0') {
        zero = true;
      } else {
        break;
      }
    }
    auto take = [&]() -> Value {
      if (next >= positional.size()) throw CallError{"not enough arguments for format string"};
      return positional[next++];
    };
    auto star = [&](const char* what) {
      Value v = take();
      if (!v.is_int()) throw CallError{std::string("* wants int") + what};
      return v.as_int();
    };
    if (i < fmt.size() && fmt[i] == '*') {
      spec.width = star("");
      if (spec.width < 0) {
        spec.align = '<';
        spec.width = -spec.width;
      }
      ++i;
    } else {
      spec.width = ReadNumber(fmt, &i);
    }
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      if (i < fmt.size() && fmt[i] == '*') {
        spec.precision = std::max<int64_t>(0, star(""));
        ++i;
      } else {
        spec.precision = ReadNumber(fmt, &i);
      }
    }
    while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) throw CallError{"incomplete format"};
    const char conv = fmt[i++];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (!have_arg) arg = take();
    const bool numeric_zero = zero && spec.align != '<';
    if (numeric_zero && conv != 's' && conv != 'r' && conv != 'a' && conv != 'c') {
      spec.fill = "0";
      spec.align = '=';
    }
    if (spec.align == 0) spec.align = '>';
    switch (conv) {
      case 's':
        out += FormatString(arg.Str(), spec);
        break;
      case 'r':
      case 'a':
        out += FormatString(arg.Repr(), spec);
        break;
      case 'd':
      case 'i':
      case 'u':
      case 'x':
      case 'X':
      case 'o': {
        spec.type = conv == 'x' || conv == 'X' || conv == 'o' ? conv : 'd';
        if (arg.is_int() || arg.is_bool()) {
          out += FormatInt(arg.is_bool() ? int64_t{arg.as_bool()} : arg.as_int(), spec);
        } else if (arg.is_float() && spec.type == 'd') {
          const double t = std::trunc(arg.as_float());
          if (!(t > -9.2e18 && t < 9.2e18))
            throw CallError{"integer overflow in %d (integers are 64-bit here)"};
          out += FormatInt(static_cast<int64_t>(t), spec);
        } else {
          throw CallError{absl::StrCat("%", std::string(1, conv), " format: ",
                                       spec.type == 'd' ? "a real number" : "an integer",
                                       " is required, not ", arg.TypeName())};
        }
        break;
      }
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G':
        if (!arg.is_number() && !arg.is_bool())
          throw CallError{"must be real number, not " + arg.TypeName()};
        spec.type = conv;
        out += FormatFloat(arg.is_bool() ? double{arg.as_bool()} : arg.as_number(), spec);
        break;
      case 'c':
        if (arg.is_int()) {
          spec.type = 'c';
          out += FormatInt(arg.as_int(), spec);
        } else if (arg.is_string() && CharCount(arg.as_string()) == 1) {
          out += FormatString(arg.as_string(), spec);
        } else {
          throw CallError{"%c requires an int or a unicode character, not " + arg.TypeName()};
        }
        break;
      default: {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "0x%x", static_cast<unsigned char>(conv));
        throw CallError{absl::StrCat("unsupported format character '", std::string(1, conv), "' (",
                                     hex, ") at index ", i - 1)};
      }
    }
  }
  if (!mapping && next < positional.size())
    throw CallError{"not all arguments converted during string formatting"};
  return out;
}

namespace {

// str.format over one set of arguments; a nested spec ("{:{width}}") formats with the same
// argument numbering.
class Formatter {
 public:
  explicit Formatter(const CallArgs& args) : args_(args) {}

  std::string Format(const std::string& fmt, int depth) {
    if (depth > 2) throw CallError{"Max string recursion exceeded"};
    std::string out;
    for (size_t i = 0; i < fmt.size();) {
      const char c = fmt[i];
      if (c == '}') {
        if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
          out.push_back('}');
          i += 2;
          continue;
        }
        throw CallError{"Single '}' encountered in format string"};
      }
      if (c != '{') {
        out.push_back(c);
        ++i;
        continue;
      }
      if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
        out.push_back('{');
        i += 2;
        continue;
      }
      // The field runs to the '}' that closes it; a spec may nest one level of fields.
      size_t j = i + 1;
      int nest = 1;
      bool in_index = false;
      for (; j < fmt.size(); ++j) {
        if (in_index) {
          in_index = fmt[j] != ']';
        } else if (fmt[j] == '[') {
          in_index = true;
        } else if (fmt[j] == '{') {
          ++nest;
        } else if (fmt[j] == '}' && --nest == 0) {
          break;
        }
      }
      if (j >= fmt.size()) throw CallError{"expected '}' before end of string"};
      out += Field(fmt.substr(i + 1, j - i - 1), depth);
      i = j + 1;
    }
    return out;
  }

 private:
  std::string Field(const std::string& field, int depth) {
    // field_name ["!" conversion] [":" spec]; brackets may hold ':' or '!'.
    size_t end = 0;
    bool in_index = false;
    for (; end < field.size(); ++end) {
      if (in_index) {
        in_index = field[end] != ']';
      } else if (field[end] == '[') {
        in_index = true;
      } else if (field[end] == '!' || field[end] == ':') {
        break;
      }
    }
    const std::string name = field.substr(0, end);
    char conversion = 0;
    std::string spec;
    if (end < field.size() && field[end] == '!') {
      if (end + 1 >= field.size()) throw CallError{"end of string while looking for conversion"};
      conversion = field[end + 1];
      end += 2;
      if (end < field.size() && field[end] != ':')
        throw CallError{"expected ':' after conversion specifier"};
    }
    if (end < field.size() && field[end] == ':') spec = field.substr(end + 1);
    Value v = Resolve(name);
    if (conversion == 'r' || conversion == 'a') {
      v = v.Repr();
    } else if (conversion == 's') {
      v = v.Str();
    } else if (conversion != 0) {
      throw CallError{absl::StrCat("Unknown conversion specifier ", std::string(1, conversion))};
    }
    if (spec.find('{') != std::string::npos) spec = Format(spec, depth + 1);
    return FormatValue(v, spec);
  }

  Value Resolve(const std::string& name) {
    size_t i = 0;
    while (i < name.size() && name[i] != '.' && name[i] != '[') ++i;
    const std::string first = name.substr(0, i);
    Value v;
    if (first.empty() || std::all_of(first.begin(), first.end(), IsDigit)) {
      size_t index;
      if (first.empty()) {
        if (manual_) {
          throw CallError{
              "cannot switch from manual field specification to automatic field numbering"};
        }
        automatic_ = true;
        index = next_++;
      } else {
        if (automatic_) {
          throw CallError{
              "cannot switch from automatic field numbering to manual field specification"};
        }
        manual_ = true;
        index = first.size() > 9 ? args_.positional.size() : std::stoul(first);
      }
      if (index >= args_.positional.size()) {
        throw CallError{"tuple index out of range"};
      }
      v = args_.positional[index];
    } else {
      bool found = false;
      for (const auto& [k, kv] : args_.keyword) {
        if (k == first) {
          v = kv;
          found = true;
        }
      }
      if (!found) throw CallError{PyStrRepr(first)};
    }
    while (i < name.size()) {
      if (name[i] == '.') {
        size_t j = i + 1;
        while (j < name.size() && name[j] != '.' && name[j] != '[') ++j;
        const std::string attr = name.substr(i + 1, j - i - 1);
        if (attr.empty()) throw CallError{"Empty attribute in format string"};
        v = GetAttrValue(v, attr);
        i = j;
      } else {
        size_t close = name.find(']', i);
        if (close == std::string::npos) throw CallError{"Missing ']' in format string"};
        const std::string key = name.substr(i + 1, close - i - 1);
        if (key.empty()) throw CallError{"Empty attribute in format string"};
        const bool numeric = key.size() < 19 && std::all_of(key.begin(), key.end(), IsDigit);
        v = GetItemValue(v, numeric ? Value(static_cast<int64_t>(std::stoll(key))) : Value(key));
        i = close + 1;
        if (i < name.size() && name[i] != '.' && name[i] != '[')
          throw CallError{"Only '.' or '[' may follow ']' in format field specifier"};
      }
    }
    return v;
  }

  const CallArgs& args_;
  size_t next_ = 0;
  bool automatic_ = false;
  bool manual_ = false;
};

}  // namespace

std::string StrFormat(const std::string& fmt, const CallArgs& args) {
  return Formatter(args).Format(fmt, 0);
}

}  // namespace llm::jinja
