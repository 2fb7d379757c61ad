// Python's letter case over UTF-8: str.upper, lower, title, capitalize, swapcase and isupper /
// islower, with the case pairs of the scripts chat text is written in (Latin with its
// extensions and Vietnamese, Greek, Cyrillic, Armenian, fullwidth Latin) and the special
// cases Python has for them ('ß'.upper() is 'SS', a final 'Σ' lowers to 'ς'). Characters of
// other scripts keep their case.
#ifndef LLM_SCHEDULER_SERVICE_CHAT_JINJA_UNICODE_CASE_H_
#define LLM_SCHEDULER_SERVICE_CHAT_JINJA_UNICODE_CASE_H_

#include <string>

namespace llm::jinja {

std::string PyUpper(const std::string& s);
std::string PyLower(const std::string& s);
// Python's str.title(): a cased letter after an uncased character is upper-cased, the other
// cased letters lower-cased.
std::string PyTitle(const std::string& s);
// Python's str.capitalize(): the first character upper-cased (title-cased), the rest lowered.
std::string PyCapitalize(const std::string& s);
std::string PySwapcase(const std::string& s);
// Python's str.isupper() / islower(): at least one cased letter, and none of the other case.
bool PyIsUpper(const std::string& s);
bool PyIsLower(const std::string& s);
// jinja2's `title` filter: words begin after runs of whitespace, '-', '(', '{', '[' or '<';
// a word's first character is upper-cased and the rest lower-cased.
std::string JinjaTitle(const std::string& s);

}  // namespace llm::jinja

#endif  // LLM_SCHEDULER_SERVICE_CHAT_JINJA_UNICODE_CASE_H_
