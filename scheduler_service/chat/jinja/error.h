// How the interpreter fails. Errors travel as C++ exceptions, thrown and caught only inside
// this library: Template::Parse and Template::Render turn them into absl::Status, so nothing
// escapes it. A JinjaError carries the line and column of the template; a CallError (value.h),
// thrown by code that knows no position, is given one by the node that called it.
#ifndef LLM_SCHEDULER_SERVICE_CHAT_JINJA_ERROR_H_
#define LLM_SCHEDULER_SERVICE_CHAT_JINJA_ERROR_H_

#include <string>
#include <utility>

namespace llm::jinja {

struct JinjaError {
  int line;
  int col;
  std::string message;
  bool resource = false;  // ResourceExhausted (runaway template) rather than InvalidArgument
};

[[noreturn]] inline void Fail(int line, int col, std::string message) {
  throw JinjaError{line, col, std::move(message)};
}

}  // namespace llm::jinja

#endif  // LLM_SCHEDULER_SERVICE_CHAT_JINJA_ERROR_H_
