#include "structured/regex_parser.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/utf8.h"
#include "structured/utf8_class.h"

namespace llm::structured {
namespace {

using Ranges = std::vector<CodepointRange>;

Ranges Complement(const Ranges& in) {
  Ranges sorted = in;
  std::sort(sorted.begin(), sorted.end(),
            [](const CodepointRange& a, const CodepointRange& b) { return a.lo < b.lo; });
  Ranges out;
  uint32_t next = 0;
  for (const CodepointRange& r : sorted) {
    if (r.lo > next) out.push_back({next, r.lo - 1});
    next = std::max(next, r.hi + 1);
  }
  if (next <= kMaxCodepoint) out.push_back({next, kMaxCodepoint});
  return out;
}

// The ranges of \d \w \s (lower case) or their complements (upper case); empty if `c` is none.
Ranges ShorthandClass(char c) {
  Ranges r;
  switch (std::tolower(static_cast<unsigned char>(c))) {
    case 'd':
      r = {{'0', '9'}};
      break;
    case 'w':
      r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
      break;
    case 's':
      r = {{'\t', '\r'}, {' ', ' '}};
      break;
    default:
      return r;
  }
  return std::isupper(static_cast<unsigned char>(c)) ? Complement(r) : r;
}

class RegexParser {
 public:
  explicit RegexParser(std::string_view pattern) : p_(pattern) {}

  absl::StatusOr<Expr> Parse() {
    if (Peek() == '^') ++pos_;
    absl::StatusOr<Expr> e = ParseAlternation();
    if (!e.ok()) return e;
    if (Peek() == '$' && pos_ + 1 == p_.size()) ++pos_;
    if (pos_ < p_.size()) {
      if (p_[pos_] == ')') return Error("unbalanced ')'");
      return Error(absl::StrCat("unexpected '", std::string(1, p_[pos_]), "'"));
    }
    return e;
  }

 private:
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat("regex at offset ", pos_, ": ", what));
  }
  char Peek() const { return pos_ < p_.size() ? p_[pos_] : '\0'; }
  bool AtEnd() const { return pos_ >= p_.size(); }

  absl::StatusOr<Expr> ParseAlternation() {
    std::vector<Expr> choices;
    while (true) {
      absl::StatusOr<Expr> seq = ParseConcat();
      if (!seq.ok()) return seq;
      choices.push_back(std::move(seq).value());
      if (Peek() != '|') break;
      ++pos_;
    }
    return Expr::Choice(std::move(choices));
  }

  absl::StatusOr<Expr> ParseConcat() {
    std::vector<Expr> items;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      if (Peek() == '$' && pos_ + 1 == p_.size()) break;  // the end anchor
      absl::StatusOr<Expr> atom = ParseAtom();
      if (!atom.ok()) return atom;
      absl::StatusOr<Expr> q = ParseQuantifier(std::move(atom).value());
      if (!q.ok()) return q;
      items.push_back(std::move(q).value());
    }
    return Expr::Sequence(std::move(items));
  }

  absl::StatusOr<Expr> ParseAtom() {
    const char c = p_[pos_];
    switch (c) {
      case '(':
        return ParseGroup();
      case '[':
        return ParseClass();
      case '.':
        ++pos_;
        return Utf8Class({{'\n', '\n'}}, /*negated=*/true);
      case '^':
      case '$':
        return Error(absl::StrCat("anchor '", std::string(1, c), "' inside the pattern"));
      case '*':
      case '+':
      case '?':
        return Error(absl::StrCat("quantifier '", std::string(1, c), "' without an operand"));
      case '\\':
        return ParseEscapeAtom();
      default: {
        const int32_t cp = DecodeUtf8(p_, &pos_);
        if (cp < 0) return Error("invalid UTF-8");
        return Char(static_cast<uint32_t>(cp));
      }
    }
  }

  static Expr Char(uint32_t cp) {
    std::string s;
    AppendUtf8(cp, &s);
    return Expr::Literal(s);
  }

  absl::StatusOr<Expr> ParseGroup() {
    ++pos_;  // (
    if (Peek() == '?') {
      const std::string_view rest = p_.substr(pos_);
      if (rest.starts_with("?:")) {
        pos_ += 2;
      } else if (rest.starts_with("?P<") ||
                 (rest.starts_with("?<") && rest.size() > 2 && rest[2] != '=' && rest[2] != '!')) {
        const size_t close = p_.find('>', pos_);
        if (close == std::string_view::npos) return Error("unterminated group name");
        pos_ = close + 1;
      } else if (rest.starts_with("?=") || rest.starts_with("?!") || rest.starts_with("?<=") ||
                 rest.starts_with("?<!")) {
        return Error("lookaround assertions are not supported");
      } else if (rest.starts_with("?P=")) {
        return Error("backreferences are not supported");
      } else {
        return Error("inline flags and other (?...) groups are not supported");
      }
    }
    absl::StatusOr<Expr> inner = ParseAlternation();
    if (!inner.ok()) return inner;
    if (Peek() != ')') return Error("missing ')'");
    ++pos_;
    return inner;
  }

  // After a backslash: a codepoint (>= 0), or -2 with *ranges set for \d \w \s and negations;
  // -1 with *error set when refused.
  int32_t ParseEscape(Ranges* ranges, absl::Status* error) {
    ++pos_;  // backslash
    if (AtEnd()) {
      *error = Error("trailing backslash");
      return -1;
    }
    const char e = p_[pos_++];
    Ranges shorthand = ShorthandClass(e);
    if (!shorthand.empty()) {
      *ranges = std::move(shorthand);
      return -2;
    }
    auto hex = [&](int digits) { return ReadHexDigits(p_, &pos_, digits); };
    int32_t cp = -1;
    switch (e) {
      case 'n':
        return '\n';
      case 'r':
        return '\r';
      case 't':
        return '\t';
      case 'f':
        return '\f';
      case 'v':
        return '\v';
      case '0':
        return 0;
      case 'x':
        cp = hex(2);
        break;
      case 'u':
        cp = hex(4);
        break;
      case 'b':
      case 'B':
        *error = Error("word boundaries (\\b, \\B) are not supported");
        return -1;
      case 'A':
      case 'Z':
      case 'z':
        *error = Error("anchors \\A \\Z are not supported");
        return -1;
      case 'p':
      case 'P':
        *error = Error("Unicode properties (\\p{...}) are not supported");
        return -1;
      default:
        if (e >= '1' && e <= '9') {
          *error = Error("backreferences are not supported");
          return -1;
        }
        if (std::ispunct(static_cast<unsigned char>(e)) || e == ' ') return e;
        *error = Error(absl::StrCat("unknown escape \\", std::string(1, e)));
        return -1;
    }
    if (cp < 0) *error = Error("bad \\x or \\u escape");
    return cp;
  }

  absl::StatusOr<Expr> ParseEscapeAtom() {
    Ranges ranges;
    absl::Status error;
    const int32_t cp = ParseEscape(&ranges, &error);
    if (cp == -1) return error;
    if (cp == -2) return Utf8Class(std::move(ranges), false);
    return Char(static_cast<uint32_t>(cp));
  }

  absl::StatusOr<Expr> ParseClass() {
    ++pos_;  // [
    bool negated = false;
    if (Peek() == '^') {
      negated = true;
      ++pos_;
    }
    if (p_.substr(pos_).starts_with("[:"))
      return Error("POSIX classes [[:...:]] are not supported");
    Ranges ranges;
    bool first = true;
    while (!AtEnd() && (p_[pos_] != ']' || first)) {
      first = false;
      int32_t lo;
      if (p_[pos_] == '\\') {
        Ranges shorthand;
        absl::Status error;
        lo = ParseEscape(&shorthand, &error);
        if (lo == -1) return error;
        if (lo == -2) {
          ranges.insert(ranges.end(), shorthand.begin(), shorthand.end());
          continue;
        }
      } else {
        lo = DecodeUtf8(p_, &pos_);
        if (lo < 0) return Error("invalid UTF-8");
      }
      int32_t hi = lo;
      if (Peek() == '-' && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        ++pos_;
        if (p_[pos_] == '\\') {
          Ranges shorthand;
          absl::Status error;
          hi = ParseEscape(&shorthand, &error);
          if (hi == -1) return error;
          if (hi == -2) return Error("a class shorthand cannot end a range");
        } else {
          hi = DecodeUtf8(p_, &pos_);
        }
        if (hi < lo) return Error("bad range in a character class");
      }
      ranges.push_back({static_cast<uint32_t>(lo), static_cast<uint32_t>(hi)});
    }
    if (AtEnd()) return Error("missing ']'");
    ++pos_;
    return Utf8Class(std::move(ranges), negated);
  }

  // A quantifier's {m}, {m,}, {m,n}; false (position restored) when the brace is a literal.
  bool ParseBraces(int32_t* min, int32_t* max) {
    const size_t save = pos_;
    ++pos_;
    auto number = [&]() -> int64_t {
      if (!std::isdigit(static_cast<unsigned char>(Peek()))) return -1;
      int64_t v = 0;
      while (std::isdigit(static_cast<unsigned char>(Peek())) && v < (int64_t{1} << 30)) {
        v = v * 10 + (p_[pos_++] - '0');
      }
      return v;
    };
    const int64_t lo = number();
    int64_t hi = lo;
    if (Peek() == ',') {
      ++pos_;
      hi = number();
      if (hi < 0) hi = Expr::kUnbounded;
    }
    if (lo < 0 || Peek() != '}') {
      pos_ = save;
      return false;
    }
    ++pos_;
    *min = static_cast<int32_t>(lo);
    *max = static_cast<int32_t>(hi);
    return true;
  }

  absl::StatusOr<Expr> ParseQuantifier(Expr atom) {
    while (true) {
      const char c = Peek();
      int32_t min, max;
      if (c == '*' || c == '+' || c == '?') {
        ++pos_;
        min = c == '+' ? 1 : 0;
        max = c == '?' ? 1 : Expr::kUnbounded;
      } else if (c == '{' && ParseBraces(&min, &max)) {
        if (max != Expr::kUnbounded && max < min) return Error("repetition {m,n} with n < m");
      } else {
        return atom;
      }
      if (Peek() == '?') {
        ++pos_;  // lazy: the same language
      } else if (Peek() == '+') {
        return Error("possessive quantifiers are not supported");
      }
      atom = Expr::Repeat(std::move(atom), min, max);
    }
  }

  std::string_view p_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<Expr> RegexToExpr(std::string_view pattern) { return RegexParser(pattern).Parse(); }

absl::StatusOr<Grammar> ParseRegex(std::string_view pattern) {
  absl::StatusOr<Expr> e = RegexToExpr(pattern);
  if (!e.ok()) return e.status();
  Grammar g;
  g.set_root(g.AddRule("root", std::move(e).value()));
  return g;
}

}  // namespace llm::structured
