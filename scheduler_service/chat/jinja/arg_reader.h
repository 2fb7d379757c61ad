// Reading a call's arguments as a Python function with named parameters reads them: by
// position or by name, with defaults. Shared by the filters, tests, methods and globals.
#ifndef LLM_SCHEDULER_SERVICE_CHAT_JINJA_ARG_READER_H_
#define LLM_SCHEDULER_SERVICE_CHAT_JINJA_ARG_READER_H_

#include <string>
#include <utility>

#include "scheduler_service/chat/jinja/value.h"

namespace llm::jinja {

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
  // An integer argument (a bool counts, as in Python); `fallback` when absent.
  int64_t Int(size_t index, const std::string& name, int64_t fallback) {
    Value v = Get(index, name);
    if (v.is_undefined() || v.is_none()) return fallback;
    if (v.is_bool()) return v.as_bool();
    if (!v.is_int())
      throw CallError{fn_ + "(): argument '" + name + "' must be an integer, got " + v.TypeName()};
    return v.as_int();
  }
  std::string String(size_t index, const std::string& name) {
    Value v = Required(index, name);
    if (!v.is_string())
      throw CallError{fn_ + "(): argument '" + name + "' must be a string, got " + v.TypeName()};
    return v.as_string();
  }

 private:
  CallArgs& args_;
  std::string fn_;
};

}  // namespace llm::jinja

#endif  // LLM_SCHEDULER_SERVICE_CHAT_JINJA_ARG_READER_H_
