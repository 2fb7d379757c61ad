// Python's operators on values, as jinja2 evaluates them: iteration, equality, ordering,
// `in`, arithmetic, slicing, and attribute and item lookup. Errors are CallError with Python's
// message; the node that applied the operator adds the position.
#ifndef LLM_SCHEDULER_SERVICE_CHAT_JINJA_OPERATORS_H_
#define LLM_SCHEDULER_SERVICE_CHAT_JINJA_OPERATORS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "scheduler_service/chat/jinja/value.h"

namespace llm::jinja {

// Fails as using the undefined value `v` does (its message names what was undefined).
[[noreturn]] void UndefinedError(const Value& v);
// The items of a list, the keys of a dict, the characters of a string; undefined: none.
std::vector<Value> Iterate(const Value& v);
bool Equal(const Value& a, const Value& b);
// -1, 0, 1; CallError when Python would raise TypeError.
int Compare(const Value& a, const Value& b, const char* op);
// `item in container`.
bool Contains(const Value& container, const Value& item);
// Python's a % b: the result has the sign of b.
int64_t PyMod(int64_t a, int64_t b);
// a op b for op in + - * / // % **.
Value Arith(const std::string& op, const Value& a, const Value& b);
// Python slicing over `n` items: the indices taken.
std::vector<int64_t> SliceIndices(int64_t n, const Value& start, const Value& stop,
                                  const Value& step);
// jinja2's "'str object'" (the type as its messages name it).
std::string ObjectTypeRepr(const Value& obj);
// The undefined value of an attribute `name` that `obj` lacks.
Value MissingAttribute(const Value& obj, const std::string& name);
// obj.name as jinja2's getattr: the method of that name (bound), else a dict's entry or a
// named tuple's field, else undefined (so `x.name is defined` is false).
Value GetAttrValue(const Value& obj, const std::string& name);
// obj[key]: a dict's entry, a list's item or a string's character (negative indices count
// from the end), or for a string key that is not an entry, obj.name; undefined when absent.
Value GetItemValue(const Value& obj, const Value& key);

// jinja2's attribute getter of filters (`map(attribute="a.b")`, `sort(attribute="0")`): the
// dot-separated parts looked up in turn as items, integers as list indices.
Value AttrPath(const Value& v, const std::string& path);

}  // namespace llm::jinja

#endif  // LLM_SCHEDULER_SERVICE_CHAT_JINJA_OPERATORS_H_
