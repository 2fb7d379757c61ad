#include "structured/gbnf_parser.h"

#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/utf8.h"
#include "structured/utf8_class.h"

namespace llm::structured {
namespace {

bool IsNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
}

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : text_(text) {}

  absl::StatusOr<Grammar> Parse() {
    SkipBlank(/*newlines=*/true);
    while (pos_ < text_.size()) {
      if (absl::Status s = ParseRule(); !s.ok()) return s;
      SkipBlank(/*newlines=*/true);
    }
    for (const auto& [name, id] : rule_ids_) {
      if (!defined_[id])
        return absl::InvalidArgumentError(absl::StrCat("undefined rule '", name, "'"));
    }
    auto root = rule_ids_.find("root");
    if (root == rule_ids_.end())
      return absl::InvalidArgumentError("the grammar has no rule 'root'");
    grammar_.set_root(root->second);
    return std::move(grammar_);
  }

 private:
  absl::Status Error(const std::string& what) const {
    int line = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) line += text_[i] == '\n';
    return absl::InvalidArgumentError(absl::StrCat("GBNF line ", line, ": ", what));
  }
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }

  // Skips spaces, tabs, comments and (when `newlines`) line ends.
  void SkipBlank(bool newlines) {
    while (!AtEnd()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++pos_;
      } else if (c == '#') {
        while (!AtEnd() && text_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  int32_t RuleId(const std::string& name) {
    auto [it, inserted] = rule_ids_.try_emplace(name, 0);
    if (inserted) {
      it->second = grammar_.AddRule(name);
      defined_.push_back(false);
    }
    return it->second;
  }

  std::string ParseName() {
    const size_t start = pos_;
    while (!AtEnd() && IsNameChar(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  absl::Status ParseRule() {
    const std::string name = ParseName();
    if (name.empty())
      return Error(absl::StrCat("expected a rule name, found '", std::string(1, Peek()), "'"));
    SkipBlank(false);
    if (text_.substr(pos_, 3) != "::=")
      return Error(absl::StrCat("expected ::= after '", name, "'"));
    pos_ += 3;
    SkipBlank(true);
    const int32_t id = RuleId(name);
    if (defined_[id]) return Error(absl::StrCat("rule '", name, "' defined twice"));
    defined_[id] = true;
    absl::StatusOr<Expr> body = ParseAlternatives(/*depth=*/0);
    if (!body.ok()) return body.status();
    grammar_.SetBody(id, std::move(body).value());
    return absl::OkStatus();
  }

  absl::StatusOr<Expr> ParseAlternatives(int depth) {
    std::vector<Expr> choices;
    while (true) {
      absl::StatusOr<Expr> seq = ParseSequence(depth);
      if (!seq.ok()) return seq.status();
      choices.push_back(std::move(seq).value());
      // At the top level a rule may continue on a line that starts with '|'.
      const size_t save = pos_;
      SkipBlank(/*newlines=*/true);
      if (Peek() != '|') {
        pos_ = save;
        break;
      }
      ++pos_;
      SkipBlank(true);
    }
    return Expr::Choice(std::move(choices));
  }

  absl::StatusOr<Expr> ParseSequence(int depth) {
    std::vector<Expr> items;
    while (true) {
      SkipBlank(depth > 0);
      const char c = Peek();
      if (AtEnd() || c == '\n' || c == '|' || c == ')') break;
      absl::StatusOr<Expr> item = ParseElement(depth);
      if (!item.ok()) return item.status();
      absl::StatusOr<Expr> repeated = ParseQuantifier(std::move(item).value());
      if (!repeated.ok()) return repeated.status();
      items.push_back(std::move(repeated).value());
    }
    return Expr::Sequence(std::move(items));
  }

  absl::StatusOr<Expr> ParseElement(int depth) {
    const char c = Peek();
    if (c == '"') return ParseLiteral();
    if (c == '[') return ParseClass();
    if (c == '.') {
      ++pos_;
      return AnyUtf8Char();
    }
    if (c == '(') {
      ++pos_;
      SkipBlank(true);
      absl::StatusOr<Expr> inner = ParseAlternatives(depth + 1);
      if (!inner.ok()) return inner.status();
      SkipBlank(true);
      if (Peek() != ')') return Error("expected ')'");
      ++pos_;
      return inner;
    }
    if (c == '<') return Error("token references (<...>) are not supported");
    if (IsNameChar(c)) {
      const size_t start = pos_;
      const std::string name = ParseName();
      SkipBlank(false);
      if (text_.substr(pos_, 3) == "::=") {
        pos_ = start;
        return Error(absl::StrCat("rule '", name, "' starts before the previous rule ended"));
      }
      return Expr::Rule(RuleId(name));
    }
    return Error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  // One character of a literal or class (after an optional backslash escape); -1 on error.
  int32_t ParseChar() {
    if (text_[pos_] != '\\') {
      const int32_t cp = DecodeUtf8(text_, &pos_);
      return cp;
    }
    ++pos_;
    if (AtEnd()) return -1;
    const char e = text_[pos_++];
    auto hex = [&](int digits) { return ReadHexDigits(text_, &pos_, digits); };
    switch (e) {
      case 'x':
        return hex(2);
      case 'u':
        return hex(4);
      case 'U':
        return hex(8);
      case 'n':
        return '\n';
      case 'r':
        return '\r';
      case 't':
        return '\t';
      default:
        if (std::ispunct(static_cast<unsigned char>(e))) return e;
        return -1;
    }
  }

  absl::StatusOr<Expr> ParseLiteral() {
    ++pos_;  // "
    std::string bytes;
    while (!AtEnd() && text_[pos_] != '"') {
      if (text_[pos_] == '\n') return Error("unterminated string literal");
      const int32_t cp = ParseChar();
      if (cp < 0 || cp > static_cast<int32_t>(kMaxCodepoint))
        return Error("bad escape or UTF-8 in a literal");
      AppendUtf8(static_cast<uint32_t>(cp), &bytes);
    }
    if (AtEnd()) return Error("unterminated string literal");
    ++pos_;
    return Expr::Literal(bytes);
  }

  absl::StatusOr<Expr> ParseClass() {
    ++pos_;  // [
    bool negated = false;
    if (Peek() == '^') {
      negated = true;
      ++pos_;
    }
    std::vector<CodepointRange> ranges;
    while (!AtEnd() && text_[pos_] != ']') {
      const int32_t lo = ParseChar();
      if (lo < 0) return Error("bad escape or UTF-8 in a character class");
      int32_t hi = lo;
      if (Peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        ++pos_;
        hi = ParseChar();
        if (hi < lo) return Error("bad range in a character class");
      }
      ranges.push_back({static_cast<uint32_t>(lo), static_cast<uint32_t>(hi)});
    }
    if (AtEnd()) return Error("unterminated character class");
    ++pos_;
    return Utf8Class(std::move(ranges), negated);
  }

  absl::StatusOr<Expr> ParseQuantifier(Expr item) {
    const char c = Peek();
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      return c == '*'   ? Expr::Star(std::move(item))
             : c == '+' ? Expr::Plus(std::move(item))
                        : Expr::Optional(std::move(item));
    }
    if (c != '{') return item;
    ++pos_;
    auto number = [&]() -> int64_t {
      SkipBlank(false);
      if (!std::isdigit(static_cast<unsigned char>(Peek()))) return -1;
      int64_t v = 0;
      while (std::isdigit(static_cast<unsigned char>(Peek())) && v < (int64_t{1} << 31)) {
        v = v * 10 + (text_[pos_++] - '0');
      }
      SkipBlank(false);
      return v;
    };
    int64_t min = number();
    int64_t max = min;
    if (Peek() == ',') {
      ++pos_;
      max = number();
      if (min < 0) min = 0;
      if (max < 0) max = Expr::kUnbounded;
    }
    if (min < 0 || Peek() != '}') return Error("bad repetition {m,n}");
    ++pos_;
    if (max != Expr::kUnbounded && max < min) return Error("repetition {m,n} with n < m");
    if (max > (int64_t{1} << 30) || min > (int64_t{1} << 30))
      return Error("repetition count too large");
    return Expr::Repeat(std::move(item), static_cast<int32_t>(min), static_cast<int32_t>(max));
  }

  std::string_view text_;
  size_t pos_ = 0;
  Grammar grammar_;
  absl::flat_hash_map<std::string, int32_t> rule_ids_;
  std::vector<bool> defined_;
};

}  // namespace

absl::StatusOr<Grammar> ParseGbnf(std::string_view text) { return GbnfParser(text).Parse(); }

}  // namespace llm::structured
