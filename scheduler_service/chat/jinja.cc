#include "scheduler_service/chat/jinja.h"

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "scheduler_service/chat/jinja/ast.h"
#include "scheduler_service/chat/jinja/error.h"
#include "scheduler_service/chat/jinja/eval.h"
#include "scheduler_service/chat/jinja/lexer.h"
#include "scheduler_service/chat/jinja/parser.h"

namespace llm::jinja {
namespace {

absl::Status ToStatus(const JinjaError& e) {
  std::string msg = absl::StrCat("line ", e.line, ":", e.col, ": ", e.message);
  return e.resource ? absl::ResourceExhaustedError(msg) : absl::InvalidArgumentError(msg);
}

}  // namespace

struct Template::Impl {
  Body body;
  Limits limits;
};

Template::Template(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Template::~Template() = default;

absl::StatusOr<std::unique_ptr<const Template>> Template::Parse(std::string_view source,
                                                                Limits limits) {
  // As jinja2: newlines normalized to "\n", one trailing newline dropped.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src.push_back(source[i]);
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  try {
    auto impl = std::make_unique<Impl>();
    impl->body = ParseTokens(Tokenize(src));
    impl->limits = limits;
    return std::unique_ptr<const Template>(new Template(std::move(impl)));
  } catch (const JinjaError& e) {
    return ToStatus(e);
  }
}

absl::StatusOr<std::string> Template::Render(const ValueDict& context) const {
  std::string out;
  Ctx ctx;
  ctx.context = &context;
  ctx.out = &out;
  ctx.limits = impl_->limits;
  ctx.frames.emplace_back();
  try {
    ExecBody(impl_->body, ctx);
  } catch (const JinjaError& e) {
    return ToStatus(e);
  } catch (const CallError& e) {
    return absl::InvalidArgumentError(e.message);
  }
  return out;
}

}  // namespace llm::jinja
