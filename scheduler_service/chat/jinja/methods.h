// The methods of strings, dicts and lists that templates call (`s.strip()`, `d.items()`,
// `'{}'.format(x)`, ...): Python's, over this interpreter's values. Errors are CallError.
#ifndef LLM_SCHEDULER_SERVICE_CHAT_JINJA_METHODS_H_
#define LLM_SCHEDULER_SERVICE_CHAT_JINJA_METHODS_H_

#include <string>

#include "scheduler_service/chat/jinja/value.h"

namespace llm::jinja {

// Whether a string, dict or list has the method `name` (one CallMethod implements). As in
// jinja2, an attribute a value does not have is undefined, so `s.content is defined` is false
// for a string s; the methods that mutate a list or dict are absent, as jinja2's immutable
// sandbox refuses them.
bool HasMethod(const Value& obj, const std::string& name);
// The method `name` of a string, dict or list; *found is false (and the value undefined) when
// it has none of that name.
Value CallMethod(const Value& obj, const std::string& name, CallArgs& args, bool* found);

}  // namespace llm::jinja

#endif  // LLM_SCHEDULER_SERVICE_CHAT_JINJA_METHODS_H_
