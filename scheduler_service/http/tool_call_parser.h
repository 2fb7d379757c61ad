// Tool calls in a model's free text (tool_choice "auto"), in the formats the published chat
// templates teach their models, as vLLM's tool parsers read them:
//
//   kHermes      Hermes / Qwen2.5:  <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
//                (any number of blocks, text around them is content)
//   kLlama3Json  Llama 3.x:  {"name": ..., "parameters": {...}} as the whole output, optionally
//                after <|python_tag|>; several separated by ';'
//   kMistral     Mistral:  [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...], or (tokenizers
//                v11 on) [TOOL_CALLS]name[ARGS]{...}, each further call after [TOOL_CALLS]
//
// ToolCallFormatOfTemplate picks the format from the chat template's text, by the markers it
// teaches. A call whose JSON does not parse stays in the content, so that no output is lost.
//
// Thread-compatible.
#ifndef LLM_SCHEDULER_SERVICE_HTTP_TOOL_CALL_PARSER_H_
#define LLM_SCHEDULER_SERVICE_HTTP_TOOL_CALL_PARSER_H_

#include <string>
#include <string_view>
#include <vector>

namespace llm::openai {

enum class ToolCallFormat { kNone, kHermes, kLlama3Json, kMistral };

// The format a chat template teaches (kNone: none this server parses).
ToolCallFormat ToolCallFormatOfTemplate(std::string_view template_source);
const char* ToolCallFormatName(ToolCallFormat format);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON text
};

// Reads a model's output as it streams: Add returns the content that can be shown now (text
// that cannot be the start of a call) and the calls completed so far; Finish the rest.
class ToolCallStreamParser {
 public:
  explicit ToolCallStreamParser(ToolCallFormat format) : format_(format) {}

  struct Delta {
    std::string content;
    std::vector<ParsedToolCall> calls;
  };
  Delta Add(std::string_view text);
  Delta Finish();

 private:
  // Parses a call payload (a block's or the rest of the output's); false: not calls.
  bool ParsePayload(std::string_view payload, std::vector<ParsedToolCall>* calls) const;
  void Drain(bool final, Delta* out);

  ToolCallFormat format_;
  std::string pending_;     // text not yet emitted
  bool in_call_ = false;    // pending_ is a call's payload (after its start marker)
  bool seen_text_ = false;  // anything but whitespace emitted or passed
  std::string marker_;      // the start marker of the call being read ("" : a bare JSON call)
  int calls_ = 0;
};

// The whole output at once: the content (outside the calls) and the calls.
struct ParsedOutput {
  std::string content;
  std::vector<ParsedToolCall> calls;
};
ParsedOutput ParseToolCalls(ToolCallFormat format, std::string_view text);

}  // namespace llm::openai

#endif  // LLM_SCHEDULER_SERVICE_HTTP_TOOL_CALL_PARSER_H_
