// A Jinja2 interpreter for the subset of the language that chat templates use, configured as
// Hugging Face transformers configures jinja2 for them (ImmutableSandboxedEnvironment with
// trim_blocks=True, lstrip_blocks=True, the loopcontrols extension, `tojson` as
// json.dumps(ensure_ascii=False), and the globals raise_exception and strftime_now).
//
// Supported: text, {{ expressions }}, {% statements %}, {# comments #}, whitespace control
// ("-" on either side; "+" turns lstrip_blocks / trim_blocks off for one tag); statements
// for (tuple unpacking, an `if` filter, `else`, `recursive` with loop(items), the `loop`
// object: index, index0, revindex, revindex0, first, last, length, depth, depth0, previtem,
// nextitem, cycle(), changed()), break / continue, if / elif / else, set (names, tuples,
// `ns.attr` on a namespace, block set), macro (positional and keyword arguments, defaults),
// call blocks with caller(), filter blocks, with, generation (rendered as its body);
// expressions: literals (strings, ints, floats, lists, tuples, dicts, true/false/none in
// either case), arithmetic (+ - * / // % **), `str % args` and str.format, comparison
// (chained), in / not in, and / or / not, `a if c else b`, ~ concatenation, attributes,
// subscripts and slices, filters (jinja/builtins.cc's ApplyFilter and
// jinja/collection_filters.cc), tests (`is defined`, `is not none`, ...), Python's string,
// dict and list methods that templates call (jinja/methods.cc), and the globals range,
// namespace, dict, raise_exception and strftime_now.
//
// Values are Python's: undefined, none, bool, int, float, string, list, tuple, dict (keys
// strings or other hashable values) plus callables; lists and dicts have reference semantics
// as in Python. An undefined variable, or an attribute a value does not have, behaves as
// jinja2's default Undefined: it prints as "", is false, iterates as empty, and is an error
// when one takes its attribute or calls it. Integers are 64-bit: overflow is an error, not a
// wrapped number.
//
// Errors (syntax, unknown filter or test, calling what is not callable, type errors,
// raise_exception) are absl::InvalidArgumentError "line L:C: <message>"; a template that runs
// away (output larger than Limits::max_output_bytes, more than Limits::max_loop_iterations
// loop iterations in all, macro recursion deeper than Limits::max_call_depth) is
// absl::ResourceExhaustedError.
//
// Thread-safety: a parsed Template is immutable; Render may be called from many threads.
#ifndef LLM_SCHEDULER_SERVICE_CHAT_JINJA_H_
#define LLM_SCHEDULER_SERVICE_CHAT_JINJA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "scheduler_service/chat/jinja/value.h"

namespace llm::jinja {

struct Limits {
  int64_t max_output_bytes = 16 << 20;
  int64_t max_loop_iterations = 1 << 20;
  int max_call_depth = 64;
};

class Template {
 public:
  // Parses `source`. Syntax errors: InvalidArgumentError "line L:C: ...".
  static absl::StatusOr<std::unique_ptr<const Template>> Parse(std::string_view source,
                                                               Limits limits = Limits());
  ~Template();

  // Renders with the variables of `context` (a dict; its values are shared, not copied) over
  // the built-in globals.
  absl::StatusOr<std::string> Render(const ValueDict& context) const;

  struct Impl;

 private:
  explicit Template(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace llm::jinja

#endif  // LLM_SCHEDULER_SERVICE_CHAT_JINJA_H_
