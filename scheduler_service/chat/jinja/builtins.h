// The built-in library of templates: filters (`x|name(...)`), tests (`x is name(...)`) and the
// globals (range, namespace, dict, raise_exception, strftime_now). Errors are CallError.
#ifndef LLM_SCHEDULER_SERVICE_CHAT_JINJA_BUILTINS_H_
#define LLM_SCHEDULER_SERVICE_CHAT_JINJA_BUILTINS_H_

#include <string>

#include "scheduler_service/chat/jinja/value.h"

namespace llm::jinja {

struct Ctx;

Value ApplyFilter(const std::string& name, const Value& input, CallArgs& args, Ctx& ctx);
bool ApplyTest(const std::string& name, const Value& input, CallArgs& args, Ctx& ctx);
// The global `name`; undefined when there is none.
Value Global(const std::string& name);

}  // namespace llm::jinja

#endif  // LLM_SCHEDULER_SERVICE_CHAT_JINJA_BUILTINS_H_
