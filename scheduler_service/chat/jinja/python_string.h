// Python's str semantics over UTF-8 bytes, as jinja2 inherits them: whitespace, strip,
// replace, and the reprs of strings and floats (unicode_case.h has letter case).
#ifndef LLM_SCHEDULER_SERVICE_CHAT_JINJA_PYTHON_STRING_H_
#define LLM_SCHEDULER_SERVICE_CHAT_JINJA_PYTHON_STRING_H_

#include <cstdint>
#include <string>
#include <vector>

namespace llm::jinja {

// Python's str.isspace() for one code point.
bool IsPySpace(uint32_t cp);
// Python's str.strip / lstrip / rstrip; `chars` null: whitespace.
std::string PyStrip(const std::string& s, const std::string* chars, bool left, bool right);
std::string AsciiUpper(std::string s);
std::string AsciiLower(std::string s);
bool IsAlpha(char c);  // an ASCII letter
// Python's str.splitlines(): lines end at \n, \r, \r\n, \v, \f, \x1c-\x1e, \x85, U+2028 and
// U+2029; the ends are dropped, and a final end makes no empty line.
std::vector<std::string> PySplitlines(const std::string& s);
// Python's str.replace(from, to, count); count < 0: all.
std::string PyReplace(const std::string& s, const std::string& from, const std::string& to,
                      int64_t count);
// Python's repr(float).
std::string PyFloatRepr(double d);
// Python's repr(str).
std::string PyStrRepr(const std::string& s);

}  // namespace llm::jinja

#endif  // LLM_SCHEDULER_SERVICE_CHAT_JINJA_PYTHON_STRING_H_
