#include "scheduler_service/chat/jinja/lexer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/utf8.h"
#include "scheduler_service/chat/jinja/error.h"
#include "scheduler_service/chat/jinja/python_string.h"

namespace llm::jinja {
namespace {

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

}  // namespace

std::vector<Token> Tokenize(std::string_view source) { return Lexer(source).Run(); }

}  // namespace llm::jinja
