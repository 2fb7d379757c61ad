// The tool-call formats of the published chat templates read from a model's output, whole and
// streamed in pieces (which must give the same content and calls).
#include "scheduler_service/http/tool_call_parser.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace llm::openai {
namespace {

// Streams `text` in pieces of `step` bytes and joins what comes out.
ParsedOutput Streamed(ToolCallFormat format, const std::string& text, size_t step) {
  ToolCallStreamParser parser(format);
  ParsedOutput out;
  auto take = [&](ToolCallStreamParser::Delta d) {
    out.content += d.content;
    for (auto& c : d.calls) out.calls.push_back(c);
  };
  for (size_t i = 0; i < text.size(); i += step) take(parser.Add(text.substr(i, step)));
  take(parser.Finish());
  return out;
}

void ExpectCalls(const ParsedOutput& out, const std::vector<ParsedToolCall>& want) {
  ASSERT_EQ(out.calls.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(out.calls[i].name, want[i].name) << i;
    EXPECT_EQ(out.calls[i].arguments, want[i].arguments) << i;
  }
}

TEST(ToolCallParserTest, FormatFromTheTemplate) {
  EXPECT_EQ(ToolCallFormatOfTemplate("... within <tool_call></tool_call> XML tags ..."),
            ToolCallFormat::kHermes);
  EXPECT_EQ(ToolCallFormatOfTemplate("{{- \"<|python_tag|>\" + tool_call.name }}"),
            ToolCallFormat::kLlama3Json);
  EXPECT_EQ(ToolCallFormatOfTemplate("{{- '[TOOL_CALLS] [' }}"), ToolCallFormat::kMistral);
  EXPECT_EQ(ToolCallFormatOfTemplate("{% for m in messages %}{{ m.content }}{% endfor %}"),
            ToolCallFormat::kNone);
}

TEST(ToolCallParserTest, HermesBlocksAndTheTextAround) {
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
      "{}}\n</tool_call>";
  for (size_t step : {size_t{1}, size_t{3}, size_t{7}, text.size()}) {
    const ParsedOutput out = Streamed(ToolCallFormat::kHermes, text, step);
    EXPECT_EQ(out.content, "Let me check.") << step;
    ExpectCalls(out, {{"get_weather", R"({"city":"Paris"})"}, {"get_time", "{}"}});
  }
  const ParsedOutput whole = ParseToolCalls(ToolCallFormat::kHermes, text);
  EXPECT_EQ(whole.content, "Let me check.");
  EXPECT_EQ(whole.calls.size(), 2u);
}

TEST(ToolCallParserTest, TextWithoutCallsIsContent) {
  for (ToolCallFormat f :
       {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral}) {
    const std::string text = "The answer is 42 <tool 9 [TOOL <|pyth";
    for (size_t step : {size_t{1}, size_t{4}, text.size()}) {
      const ParsedOutput out = Streamed(f, text, step);
      EXPECT_EQ(out.content, text) << ToolCallFormatName(f) << " " << step;
      EXPECT_TRUE(out.calls.empty());
    }
  }
}

TEST(ToolCallParserTest, MalformedCallsStayContent) {
  const std::string text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": </tool_call>";
  const ParsedOutput out = ParseToolCalls(ToolCallFormat::kHermes, text);
  EXPECT_TRUE(out.calls.empty());
  EXPECT_EQ(out.content, text);
  // An unclosed last block (the model stopped at its end token) is read to the end.
  const ParsedOutput unclosed =
      ParseToolCalls(ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}");
  ExpectCalls(unclosed, {{"f", "{}"}});
}

TEST(ToolCallParserTest, Llama3JsonWholeOutputOrAfterPythonTag) {
  const std::string text =
      " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; {\"name\": "
      "\"get_time\", "
      "\"parameters\": {}}";
  for (size_t step : {size_t{1}, size_t{5}, text.size()}) {
    const ParsedOutput out = Streamed(ToolCallFormat::kLlama3Json, text, step);
    EXPECT_EQ(out.content, "") << step;
    ExpectCalls(out, {{"get_weather", R"({"city":"Oslo"})"}, {"get_time", "{}"}});
  }
  const ParsedOutput tagged = ParseToolCalls(
      ToolCallFormat::kLlama3Json, "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": 1}}");
  ExpectCalls(tagged, {{"f", R"({"a":1})"}});
  // JSON that is not a call is the answer.
  const ParsedOutput answer = ParseToolCalls(ToolCallFormat::kLlama3Json, "{\"x\": 1}");
  EXPECT_TRUE(answer.calls.empty());
  EXPECT_EQ(answer.content, "{\"x\": 1}");
}

// Mistral's tokenizers from v11 write name[ARGS]{...} after each [TOOL_CALLS].
TEST(ToolCallParserTest, MistralNamedCalls) {
  const std::string text =
      "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}";
  for (size_t step : {size_t{1}, size_t{5}, text.size()}) {
    const ParsedOutput out = Streamed(ToolCallFormat::kMistral, text, step);
    EXPECT_EQ(out.content, "") << step;
    ExpectCalls(out, {{"get_weather", R"({"city":"Paris"})"}, {"get_time", "{}"}});
  }
  // Arguments that do not parse, or no name: all of it stays content.
  for (const std::string bad :
       {"[TOOL_CALLS]f[ARGS]{\"x\": ", "[TOOL_CALLS][ARGS]{}", "[TOOL_CALLS]f{}"}) {
    const ParsedOutput out = ParseToolCalls(ToolCallFormat::kMistral, bad);
    EXPECT_TRUE(out.calls.empty()) << bad;
    EXPECT_EQ(out.content, bad);
  }
}

TEST(ToolCallParserTest, MistralList) {
  const std::string text =
      "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"k\": [1, 2]}}, {\"name\": \"b\", "
      "\"arguments\": {}}]";
  for (size_t step : {size_t{1}, size_t{6}, text.size()}) {
    const ParsedOutput out = Streamed(ToolCallFormat::kMistral, text, step);
    EXPECT_EQ(out.content, "") << step;
    ExpectCalls(out, {{"a", R"({"k":[1,2]})"}, {"b", "{}"}});
  }
}

}  // namespace
}  // namespace llm::openai
