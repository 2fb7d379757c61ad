// Evaluation: the context that the nodes of ast.h run in (scopes, output, limits, loop control)
// for one render.
#ifndef LLM_SCHEDULER_SERVICE_CHAT_JINJA_EVAL_H_
#define LLM_SCHEDULER_SERVICE_CHAT_JINJA_EVAL_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "scheduler_service/chat/jinja.h"
#include "scheduler_service/chat/jinja/ast.h"
#include "scheduler_service/chat/jinja/error.h"

namespace llm::jinja {

struct Ctx {
  // What the template sets, a map per scope, innermost last; Lookup reads them first, then
  // `context` (the caller's variables), then the globals.
  std::vector<absl::flat_hash_map<std::string, Value>> frames;
  const ValueDict* context = nullptr;
  std::string* out = nullptr;  // a macro call or a block set points it at its own capture
  Limits limits;
  int64_t iterations = 0;  // loop iterations run in this render, all loops together
  int depth = 0;           // macro calls in progress
  Flow flow = Flow::kNormal;

  Value Lookup(const std::string& name) const;
  void Set(const std::string& name, Value v) { frames.back()[name] = std::move(v); }
  void Write(const Node& at, std::string_view s) {
    if (static_cast<int64_t>(out->size() + s.size()) > limits.max_output_bytes) {
      throw JinjaError{
          at.line, at.col,
          absl::StrCat("the template's output exceeds ", limits.max_output_bytes, " bytes"), true};
    }
    out->append(s);
  }
  void CountIteration(const Node& at) {
    if (++iterations > limits.max_loop_iterations) {
      throw JinjaError{at.line, at.col,
                       absl::StrCat("the template ran more than ", limits.max_loop_iterations,
                                    " loop iterations"),
                       true};
    }
  }
};

// Runs `body` until it ends or a statement sets ctx.flow to break or continue.
void ExecBody(const Body& body, Ctx& ctx);

}  // namespace llm::jinja

#endif  // LLM_SCHEDULER_SERVICE_CHAT_JINJA_EVAL_H_
