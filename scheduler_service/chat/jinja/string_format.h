// Python's string formatting, which templates reach through `fmt % args`, `fmt.format(...)` and
// the `format` filter: printf-style conversions (%s %r %d %i %f %e %g %x %o %c %%, flags,
// width, precision, %(name)s) and str.format's replacement fields ({} {0} {name} {x[0]}
// {x.attr}, !r / !s, and the format-spec mini-language). Errors are CallError with Python's
// message.
#ifndef LLM_SCHEDULER_SERVICE_CHAT_JINJA_STRING_FORMAT_H_
#define LLM_SCHEDULER_SERVICE_CHAT_JINJA_STRING_FORMAT_H_

#include <string>

#include "scheduler_service/chat/jinja/value.h"

namespace llm::jinja {

// Python's `fmt % args`: a tuple gives the arguments, a dict the mapping of %(name)s, anything
// else is the one argument.
std::string PercentFormat(const std::string& fmt, const Value& args);
// Python's fmt.format(*args.positional, **args.keyword).
std::string StrFormat(const std::string& fmt, const CallArgs& args);
// Python's format(value, spec).
std::string FormatValue(const Value& value, const std::string& spec);

}  // namespace llm::jinja

#endif  // LLM_SCHEDULER_SERVICE_CHAT_JINJA_STRING_FORMAT_H_
