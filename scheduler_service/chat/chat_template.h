// ChatTemplate: a model's chat template (Jinja, see jinja.h) rendering a conversation into the
// prompt text, with the variables transformers' apply_chat_template gives it: messages (a list
// of {"role", "content"} dicts, with "tool_calls", "tool_call_id", "name" and
// "reasoning_content" where a message has them), add_generation_prompt, bos_token, eos_token,
// tools and documents (none unless given), and any further variables the caller gives.
//
// LoadChatTemplate finds a model directory's template as transformers does:
// chat_template.jinja, else chat_template.json's "chat_template", else tokenizer_config.json's
// "chat_template" (a string, or a list of {"name", "template"} of which "default" is taken);
// bos_token / eos_token come from tokenizer_config.json (a string or {"content": ...}).
//
// Thread-safety: immutable after Create; Render may be called from many threads.
#ifndef LLM_SCHEDULER_SERVICE_CHAT_CHAT_TEMPLATE_H_
#define LLM_SCHEDULER_SERVICE_CHAT_CHAT_TEMPLATE_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "scheduler_service/chat/jinja.h"

namespace llm {

// A call as transformers' chat format has it: {"id", "type", "function": {"name",
// "arguments"}}. `arguments` is JSON text; the template gets it parsed when it is a JSON object,
// as vLLM passes it (the published templates write it with tojson, or test `is string`).
struct ToolCall {
  std::string id;  // empty: no "id" key
  std::string type = "function";
  std::string name;
  std::string arguments;
};

struct ChatMessage {
  std::string role;
  std::string content;
  bool content_is_none = false;  // content none in the template (a message that only calls tools)
  std::vector<ToolCall> tool_calls;              // empty: no "tool_calls" key
  std::string tool_call_id;                      // empty: no "tool_call_id" key
  std::string name;                              // empty: no "name" key
  std::optional<std::string> reasoning_content;  // unset: no "reasoning_content" key
};

// The `tools` variable from the OpenAI `tools` array's JSON text, its objects' keys in the
// order written (templates write them with tojson); empty text: none. Not a JSON array:
// InvalidArgumentError.
absl::StatusOr<jinja::Value> ToolsValue(std::string_view tools_json);
// The `documents` variable from a JSON list of objects; empty text: none. Otherwise
// InvalidArgumentError.
absl::StatusOr<jinja::Value> DocumentsValue(std::string_view documents_json);
// More variables for Render's `extra` from a JSON object's text (transformers'
// apply_chat_template kwargs); empty text: none. Not an object, or a key that names a standard
// variable (messages, tools, documents, add_generation_prompt, bos_token, eos_token):
// InvalidArgumentError naming it.
absl::StatusOr<jinja::ValueDict> TemplateKwargs(std::string_view kwargs_json);

class ChatTemplate {
 public:
  // Parses `source`; a syntax error is InvalidArgumentError "chat template: line L:C: ...".
  static absl::StatusOr<std::shared_ptr<const ChatTemplate>> Create(std::string source,
                                                                    std::string bos_token,
                                                                    std::string eos_token);

  // The prompt for `messages`. Errors (the template's raise_exception, type errors) are
  // InvalidArgumentError "chat template: line L:C: <message>"; a runaway template is
  // ResourceExhaustedError.
  absl::StatusOr<std::string> Render(absl::Span<const ChatMessage> messages,
                                     bool add_generation_prompt) const;
  // As above, with more variables (e.g. date_string) that override the standard ones.
  absl::StatusOr<std::string> Render(absl::Span<const ChatMessage> messages,
                                     bool add_generation_prompt,
                                     const jinja::ValueDict& extra) const;

  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }

 private:
  ChatTemplate(std::string source, std::string bos, std::string eos,
               std::unique_ptr<const jinja::Template> tmpl);

  std::string source_;
  std::string bos_token_;
  std::string eos_token_;
  std::unique_ptr<const jinja::Template> template_;
};

// The template of the model in `model_dir` (see above); null, without error, when the model
// has none. Unreadable or malformed files, and templates that do not parse, are errors naming
// the file.
absl::StatusOr<std::shared_ptr<const ChatTemplate>> LoadChatTemplate(const std::string& model_dir);

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_CHAT_CHAT_TEMPLATE_H_
