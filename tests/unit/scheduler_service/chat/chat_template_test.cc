// ChatTemplate with the chat templates published with real models (SmolLM2, Qwen2.5, Llama 3,
// Llama 3.1, Mistral, Phi-3; tests/data/chat_templates/README.md says where each comes from),
// rendered byte for byte as Python jinja2 renders them under transformers' settings
// (tests/data/chat_templates/cases.json, written by tools/chat/render_fixtures.py); and
// LoadChatTemplate over model directories.
#include "scheduler_service/chat/chat_template.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace llm {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const std::string kDir = std::string(LLM_TEST_DATA_DIR) + "/chat_templates/";

TEST(ChatTemplateTest, RealTemplatesRenderAsJinja2Does) {
  const auto fixture = nlohmann::ordered_json::parse(ReadFile(kDir + "cases.json"));
  int rendered = 0, refused = 0;
  for (const auto& c : fixture["cases"]) {
    const std::string name =
        c["template"].get<std::string>() + "/" + c["conversation"].get<std::string>();
    const auto& t = fixture["templates"][c["template"].get<std::string>()];
    absl::StatusOr<std::shared_ptr<const ChatTemplate>> tmpl = ChatTemplate::Create(
        ReadFile(kDir + t["file"].get<std::string>()), t["bos_token"], t["eos_token"]);
    ASSERT_TRUE(tmpl.ok()) << name << ": " << tmpl.status();
    std::vector<ChatMessage> messages;
    for (const auto& m : c["messages"]) messages.push_back({m["role"], m["content"]});
    const jinja::Value extra = jinja::Value::FromJson(c["extra"]);
    absl::StatusOr<std::string> out =
        (*tmpl)->Render(messages, c["add_generation_prompt"].get<bool>(), extra.dict());
    if (c.contains("expected")) {
      ASSERT_TRUE(out.ok()) << name << ": " << out.status();
      EXPECT_EQ(*out, c["expected"].get<std::string>()) << name;
      ++rendered;
    } else {
      ASSERT_FALSE(out.ok()) << name << " rendered " << *out;
      EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << name;
      EXPECT_THAT(std::string(out.status().message()), HasSubstr(c["error"].get<std::string>()))
          << name;
      EXPECT_THAT(std::string(out.status().message()), HasSubstr("chat template: line ")) << name;
      ++refused;
    }
  }
  EXPECT_EQ(rendered, 63);
  EXPECT_EQ(refused, 3);
}

// The tool-aware templates (Qwen2.5, Llama 3.1) over cases.json's tool_cases, with the
// conversation given as the API gives it: ChatMessage's tool fields, arguments as JSON text (as
// OpenAI clients send them) and the tools as the `tools` array's JSON text. The arguments reach
// the template parsed, as vLLM passes them, so they render as jinja2 renders the fixture's
// dicts; where the fixture passed a string, which both templates write with tojson as a quoted
// string, they write the object.
TEST(ChatTemplateTest, ToolConversationsRenderAsJinja2Does) {
  const auto fixture = nlohmann::ordered_json::parse(ReadFile(kDir + "cases.json"));
  int rendered = 0;
  for (const auto& c : fixture["tool_cases"]) {
    const std::string name =
        c["template"].get<std::string>() + "/" + c["conversation"].get<std::string>();
    const auto& t = fixture["templates"][c["template"].get<std::string>()];
    const auto& context = c["context"];
    absl::StatusOr<std::shared_ptr<const ChatTemplate>> tmpl = ChatTemplate::Create(
        ReadFile(kDir + t["file"].get<std::string>()), context["bos_token"], context["eos_token"]);
    ASSERT_TRUE(tmpl.ok()) << name << ": " << tmpl.status();
    std::vector<ChatMessage> messages;
    bool string_arguments = false;
    for (const auto& m : context["messages"]) {
      ChatMessage& msg = messages.emplace_back();
      msg.role = m["role"];
      msg.content = m["content"];
      if (m.contains("name")) msg.name = m["name"];
      if (m.contains("tool_call_id")) msg.tool_call_id = m["tool_call_id"];
      for (const auto& call : m.value("tool_calls", nlohmann::ordered_json::array())) {
        const auto& args = call["function"]["arguments"];
        string_arguments = string_arguments || args.is_string();
        msg.tool_calls.push_back(
            {.name = call["function"]["name"],
             .arguments = args.is_string() ? args.get<std::string>() : args.dump(-1, ' ', false)});
      }
    }
    absl::StatusOr<jinja::Value> tools = ToolsValue(context["tools"].dump());
    ASSERT_TRUE(tools.ok()) << tools.status();
    jinja::ValueDict extra;
    extra.Set("tools", *tools);
    if (context.contains("tools_in_user_message")) {
      extra.Set("tools_in_user_message", context["tools_in_user_message"].get<bool>());
    }
    absl::StatusOr<std::string> out =
        (*tmpl)->Render(messages, context["add_generation_prompt"].get<bool>(), extra);
    ASSERT_TRUE(out.ok()) << name << ": " << out.status();
    std::string expected = c["expected"];
    if (string_arguments) {
      const std::string quoted = R"("{\"city\": \"Zürich\"}")";
      ASSERT_NE(expected.find(quoted), std::string::npos) << name;
      expected.replace(expected.find(quoted), quoted.size(), R"({"city": "Zürich"})");
    }
    EXPECT_EQ(*out, expected) << name;
    ++rendered;
  }
  EXPECT_EQ(rendered, 10);
}

// An assistant message that only calls tools has content none, as OpenAI clients send it.
TEST(ChatTemplateTest, ContentNoneAndToolCallIds) {
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> tmpl = ChatTemplate::Create(
      "{% for m in messages %}{{ m.content is none }}|{% if m.tool_calls %}{{ m.tool_calls[0].id "
      "}}|"
      "{{ m.tool_calls[0].function.arguments.x }}{% endif %}|{{ m.tool_call_id is defined }};"
      "{% endfor %}",
      "", "");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  std::vector<ChatMessage> messages(2);
  messages[0].role = "assistant";
  messages[0].content_is_none = true;
  messages[0].tool_calls.push_back({.id = "call_1", .name = "f", .arguments = R"({"x": 5})"});
  messages[1].role = "tool";
  messages[1].content = "ok";
  messages[1].tool_call_id = "call_1";
  absl::StatusOr<std::string> out = (*tmpl)->Render(messages, false);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "True|call_1|5|False;False||True;");
  EXPECT_FALSE(ToolsValue("{}").ok());
}

class LoadChatTemplateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/chat_template_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << text;
  }
  std::string dir_;
};

TEST_F(LoadChatTemplateTest, NoTemplateIsNullWithoutError) {
  Write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> t = LoadChatTemplate(dir_);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, nullptr);
  std::filesystem::remove(dir_ + "/tokenizer_config.json");
  t = LoadChatTemplate(dir_);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, nullptr);
}

TEST_F(LoadChatTemplateTest, TokenizerConfigStringTemplateWithAddedTokenObjects) {
  Write("tokenizer_config.json",
        R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
            "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"})");
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> t = LoadChatTemplate(dir_);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_NE(*t, nullptr);
  EXPECT_EQ((*t)->bos_token(), "<s>");
  absl::StatusOr<std::string> out = (*t)->Render({{"user", "hi"}, {"assistant", "yo"}}, true);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "<s>hi</s>yo</s>");
}

TEST_F(LoadChatTemplateTest, ListOfNamedTemplatesTakesDefault) {
  Write("tokenizer_config.json",
        R"({"chat_template": [{"name": "tool_use", "template": "tools"},
                              {"name": "default", "template": "default: {{ messages[0].content }}"}]})");
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> t = LoadChatTemplate(dir_);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_NE(*t, nullptr);
  EXPECT_EQ(*(*t)->Render({{"user", "x"}}, true), "default: x");

  Write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "t"}]})");
  t = LoadChatTemplate(dir_);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("\"default\""));
}

TEST_F(LoadChatTemplateTest, ChatTemplateJinjaTakesPrecedence) {
  Write("tokenizer_config.json", R"({"eos_token": "</s>", "chat_template": "from config"})");
  Write("chat_template.jinja", "from jinja {{ eos_token }}\n");
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> t = LoadChatTemplate(dir_);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*(*t)->Render({{"user", "x"}}, true), "from jinja </s>");
}

TEST_F(LoadChatTemplateTest, BadFilesAreErrorsNamingTheFile) {
  Write("tokenizer_config.json", "{not json");
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> t = LoadChatTemplate(dir_);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("tokenizer_config.json"));

  Write("tokenizer_config.json", R"({"bos_token": 7})");
  t = LoadChatTemplate(dir_);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("\"bos_token\""));

  Write("tokenizer_config.json", "{}");
  Write("chat_template.jinja", "{% for m in messages %}unclosed");
  t = LoadChatTemplate(dir_);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr("chat_template.jinja: chat template: line 1:"));
}

// The committed demo model chats with SmolLM2's template, as the SmolLM2 fixtures render it.
TEST(ChatTemplateTest, FortuneLlamaHasSmolLM2sTemplate) {
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> t =
      LoadChatTemplate(std::string(LLM_TEST_DATA_DIR) + "/../../models/fortune-llama");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_NE(*t, nullptr);
  EXPECT_EQ((*t)->source(), ReadFile(kDir + "templates/smollm2.jinja"));
}

}  // namespace
}  // namespace llm
