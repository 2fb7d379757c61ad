// The Jinja interpreter against Python jinja2 (3.1, configured as transformers configures it):
// tests/data/chat_templates/snippets.json holds small templates, one feature each, with
// jinja2's output or error (tools/chat/render_fixtures.py writes it). Plus the limits that
// guard against runaway templates, which jinja2 does not have.
#include "scheduler_service/chat/jinja.h"

#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace llm::jinja {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

nlohmann::ordered_json ReadFixture(const std::string& name) {
  std::ifstream in(std::string(LLM_TEST_DATA_DIR) + "/chat_templates/" + name);
  EXPECT_TRUE(in.good()) << name;
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::ordered_json::parse(ss.str());
}

absl::StatusOr<std::string> RenderSource(const std::string& source, const ValueDict& context,
                                         Limits limits = Limits()) {
  absl::StatusOr<std::unique_ptr<const Template>> t = Template::Parse(source, limits);
  if (!t.ok()) return t.status();
  return (*t)->Render(context);
}

TEST(JinjaTest, SnippetsRenderAsJinja2Does) {
  const nlohmann::ordered_json fixture = ReadFixture("snippets.json");
  int checked = 0;
  for (const auto& s : fixture["snippets"]) {
    const std::string name = s["name"];
    const Value context = Value::FromJson(s["context"]);
    absl::StatusOr<std::string> out = RenderSource(s["source"], context.dict());
    if (s.contains("expected")) {
      ASSERT_TRUE(out.ok()) << name << ": " << out.status();
      EXPECT_EQ(*out, s["expected"].get<std::string>()) << name;
    } else {
      ASSERT_FALSE(out.ok()) << name << " rendered " << *out << "; jinja2 failed with "
                             << s["error"];
      EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << name;
      EXPECT_THAT(std::string(out.status().message()), MatchesRegex("line [0-9]+:[0-9]+: .*"))
          << name;
      // jinja2's runtime errors ("UndefinedError: 'x' is undefined"): the same message.
      const std::string error = s["error"];
      const size_t type_end = error.find("Error: ");
      if (type_end != std::string::npos && error.find(' ') > type_end) {
        EXPECT_THAT(std::string(out.status().message()), HasSubstr(error.substr(type_end + 7)))
            << name;
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 86);
}

// The published templates that take tools (Qwen2.5, Llama 3.1) over conversations that offer
// tools, call them and answer from them (cases.json's tool_cases), with the whole context a
// caller passes (messages with tool_calls, tools, tools_in_user_message).
TEST(JinjaTest, RealTemplatesWithToolsRenderAsJinja2Does) {
  const nlohmann::ordered_json fixture = ReadFixture("cases.json");
  int rendered = 0;
  for (const auto& c : fixture["tool_cases"]) {
    const std::string name =
        c["template"].get<std::string>() + "/" + c["conversation"].get<std::string>();
    const std::string file = fixture["templates"][c["template"].get<std::string>()]["file"];
    std::ifstream in(std::string(LLM_TEST_DATA_DIR) + "/chat_templates/" + file);
    std::stringstream source;
    source << in.rdbuf();
    const Value context = Value::FromJson(c["context"]);
    absl::StatusOr<std::string> out = RenderSource(source.str(), context.dict());
    ASSERT_TRUE(c.contains("expected")) << name;
    ASSERT_TRUE(out.ok()) << name << ": " << out.status();
    EXPECT_EQ(*out, c["expected"].get<std::string>()) << name;
    ++rendered;
  }
  EXPECT_EQ(rendered, 10);
}

TEST(JinjaTest, ErrorsNameTheLineColumnAndTheMessage) {
  absl::StatusOr<std::string> out =
      RenderSource("line one\n  {{ raise_exception('Custom failure: ' ~ 42) }}", {});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "line 2:6: Custom failure: 42");

  out = RenderSource("{{ not_a_function(1) }}", {});
  EXPECT_EQ(out.status().message(), "line 1:4: 'not_a_function' is undefined");

  out = RenderSource("{% if true %}\nnever closed", {});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("expected '{% endif %}'"));

  out = RenderSource("{{ 'a' | no_such_filter }}", {});
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("no filter named 'no_such_filter'"));
}

TEST(JinjaTest, RunawayTemplatesAreStopped) {
  Limits limits;
  limits.max_output_bytes = 1000;
  absl::StatusOr<std::string> out =
      RenderSource("{% for i in range(100000) %}xxxxxxxxxx{% endfor %}", {}, limits);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted) << out.status();
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("exceeds 1000 bytes"));

  limits = Limits();
  limits.max_loop_iterations = 5000;
  out = RenderSource("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}",
                     {}, limits);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted) << out.status();

  out = RenderSource("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", {});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted) << out.status();
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("nested deeper than"));
}

TEST(JinjaTest, ToJsonIsPythonsJsonDumps) {
  ValueDict d;
  d.Set("text", "tab\there \"q\" \x01 é");
  d.Set("list", ValueList{Value(1), Value(0.5), Value::MakeNone()});
  EXPECT_EQ(ToJson(Value(d), -1, false),
            "{\"text\": \"tab\\there \\\"q\\\" \\u0001 é\", \"list\": [1, 0.5, null]}");
  EXPECT_EQ(ToJson(Value(ValueList{Value(1)}), 2, false), "[\n  1\n]");
}

}  // namespace
}  // namespace llm::jinja

namespace llm::jinja {
namespace {

TEST(JinjaTest, DeepNestingAndGrowingValuesAreErrorsNotCrashes) {
  absl::StatusOr<std::string> out =
      RenderSource("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}", {});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("nests deeper than"));
  std::string ifs;
  for (int i = 0; i < 5000; ++i) ifs += "{% if true %}";
  out = RenderSource(ifs, {});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();

  out = RenderSource(
      "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}{{ ns.s | length }}",
      {});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted) << out.status();
}

// Integers are 64-bit (Python's are unbounded): overflow is an error naming the operator, not
// a wrapped number.
TEST(JinjaTest, IntegerOverflowIsAnError) {
  for (const char* source :
       {"{{ 9223372036854775807 + 1 }}", "{{ 2 ** 64 }}", "{{ 4611686018427387904 * 2 }}",
        "{{ -(-9223372036854775807 - 1) }}"}) {
    absl::StatusOr<std::string> out = RenderSource(source, {});
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << source;
    EXPECT_THAT(std::string(out.status().message()), HasSubstr("integer overflow")) << source;
  }
  EXPECT_EQ(*RenderSource("{{ 2 ** 62 }} {{ 1e300 | int }} {{ (-1) ** 7 }}", {}),
            "4611686018427387904 0 -1");
}

// Every prefix of every real template (most of them broken templates) parses or fails with
// InvalidArgument, and renders or fails with a status: never a crash.
TEST(JinjaTest, TruncatedTemplatesFailCleanly) {
  ValueDict message;
  message.Set("role", "user");
  message.Set("content", "hi");
  ValueDict context;
  context.Set("messages", ValueList{Value(message)});
  context.Set("add_generation_prompt", true);
  int parsed = 0;
  for (const char* file : {"smollm2", "qwen2.5", "llama3", "llama3.1", "mistral", "phi3"}) {
    std::ifstream in(std::string(LLM_TEST_DATA_DIR) + "/chat_templates/templates/" + file +
                     ".jinja");
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string source = ss.str();
    ASSERT_FALSE(source.empty()) << file;
    for (size_t n = 0; n <= source.size(); ++n) {
      absl::StatusOr<std::unique_ptr<const Template>> t = Template::Parse(source.substr(0, n));
      if (!t.ok()) {
        EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << file << " " << n;
        continue;
      }
      ++parsed;
      (void)(*t)->Render(context);
    }
  }
  EXPECT_GT(parsed, 0);
}

}  // namespace
}  // namespace llm::jinja
