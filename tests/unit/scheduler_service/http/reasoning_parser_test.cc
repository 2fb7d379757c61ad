// A reasoning model's <think>...</think> read from its output, whole and streamed in pieces of
// every size (which must split it the same way).
#include "scheduler_service/http/reasoning_parser.h"

#include <optional>
#include <string>

#include "gtest/gtest.h"

namespace llm::openai {
namespace {

// Streams `text` in pieces of `step` bytes; the joined reasoning and content.
ReasoningSplit Streamed(bool starts_in_reasoning, const std::string& text, size_t step) {
  ReasoningStreamParser parser(starts_in_reasoning);
  std::string reasoning;
  std::string content;
  for (size_t i = 0; i < text.size(); i += step) {
    ReasoningStreamParser::Delta d = parser.Add(text.substr(i, step));
    reasoning += d.reasoning;
    content += d.content;
  }
  ReasoningStreamParser::Delta d = parser.Finish();
  reasoning += d.reasoning;
  content += d.content;
  ReasoningSplit out;
  if (parser.reasoned()) out.reasoning = reasoning;
  out.content = content;
  return out;
}

struct Case {
  bool starts_in_reasoning;
  std::string text;
  std::optional<std::string> reasoning;
  std::string content;
};

TEST(ReasoningParserTest, SplitsWholeAndStreamedAlike) {
  const Case cases[] = {
      // Opened by the output: both parsers.
      {false, "<think>\nWhy? Because.\n</think>\n\nThe answer.", "\nWhy? Because.\n",
       "\n\nThe answer."},
      {true, "<think>a < b</think>c", "a < b", "c"},
      {false, "  \n<think>x</think>y", "x", "y"},
      // deepseek_r1: the prompt opened it.
      {true, "Let me see </thin k> no.</think>Yes.", "Let me see </thin k> no.", "Yes."},
      {true, "still thinking when max_tokens cut it <", "still thinking when max_tokens cut it <",
       ""},
      {true, "", "", ""},
      // qwen3 (or constrained): no opening tag, no reasoning; a later tag is text.
      {false, "Plain answer </think> <think>", std::nullopt, "Plain answer </think> <think>"},
      {false, "<thinking>not it</thinking>", std::nullopt, "<thinking>not it</thinking>"},
      {false, "<thi", std::nullopt, "<thi"},
      {false, " ", std::nullopt, " "},
      {false, "<think></think>", "", ""},
      {false, "<think>unterminated", "unterminated", ""},
  };
  for (const Case& c : cases) {
    const ReasoningSplit whole = SplitReasoning(c.starts_in_reasoning, c.text);
    EXPECT_EQ(whole.reasoning, c.reasoning) << c.text;
    EXPECT_EQ(whole.content, c.content) << c.text;
    for (size_t step = 1; step <= c.text.size(); ++step) {
      const ReasoningSplit s = Streamed(c.starts_in_reasoning, c.text, step);
      EXPECT_EQ(s.reasoning, c.reasoning) << c.text << " step " << step;
      EXPECT_EQ(s.content, c.content) << c.text << " step " << step;
    }
  }
}

// Text that cannot be the start of a marker is released at once, not held to the end.
TEST(ReasoningParserTest, StreamsWithoutWaitingForTheEnd) {
  ReasoningStreamParser parser(/*starts_in_reasoning=*/true);
  ReasoningStreamParser::Delta d = parser.Add("First, ");
  EXPECT_EQ(d.reasoning, "First, ");
  d = parser.Add("then </th");
  EXPECT_EQ(d.reasoning, "then ");  // "</th" may be the end marker
  d = parser.Add("ink>Done");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "Done");

  ReasoningStreamParser plain(/*starts_in_reasoning=*/false);
  EXPECT_EQ(plain.Add("Hello").content, "Hello");
  EXPECT_FALSE(plain.reasoned());
}

TEST(ReasoningParserTest, FormatsByName) {
  EXPECT_EQ(*ReasoningFormatFromName(""), ReasoningFormat::kNone);
  EXPECT_EQ(*ReasoningFormatFromName("none"), ReasoningFormat::kNone);
  EXPECT_EQ(*ReasoningFormatFromName("deepseek_r1"), ReasoningFormat::kDeepSeekR1);
  EXPECT_EQ(*ReasoningFormatFromName("qwen3"), ReasoningFormat::kQwen3);
  const absl::StatusOr<ReasoningFormat> bad = ReasoningFormatFromName("granite");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("granite"), std::string::npos);
}

}  // namespace
}  // namespace llm::openai
