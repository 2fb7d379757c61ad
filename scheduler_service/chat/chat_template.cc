#include "scheduler_service/chat/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace llm {
namespace {

using Json = nlohmann::ordered_json;

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<Json> ReadJson(const std::filesystem::path& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  Json json = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": not valid JSON"));
  return json;
}

// A special token in tokenizer_config.json: a string, or {"content": "..."}; absent or null: "".
absl::StatusOr<std::string> TokenString(const Json& config, const char* key,
                                        const std::string& file) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      file, ": \"", key, "\" must be a string or {\"content\": string}, got ", it->dump()));
}

// "chat_template": a string, or [{"name", "template"}, ...] of which "default" is taken.
absl::StatusOr<std::string> TemplateField(const Json& value, const std::string& file) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    for (const Json& entry : value) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string())
        return entry["template"].get<std::string>();
    }
    return absl::InvalidArgumentError(absl::StrCat(
        file,
        ": \"chat_template\" is a list without a {\"name\": \"default\", \"template\": ...}"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(file, ": \"chat_template\" must be a string or a list of {name, template}, got ",
                   std::string(value.type_name())));
}

}  // namespace

absl::StatusOr<jinja::Value> ToolsValue(std::string_view tools_json) {
  if (tools_json.empty()) return jinja::Value::MakeNone();
  const Json tools = Json::parse(tools_json, nullptr, /*allow_exceptions=*/false);
  if (!tools.is_array()) {
    return absl::InvalidArgumentError("chat tools_json must be the JSON text of a list of tools");
  }
  return jinja::Value::FromJson(tools);
}

absl::StatusOr<jinja::Value> DocumentsValue(std::string_view documents_json) {
  if (documents_json.empty()) return jinja::Value::MakeNone();
  const Json docs = Json::parse(documents_json, nullptr, /*allow_exceptions=*/false);
  if (!docs.is_array() ||
      !std::all_of(docs.begin(), docs.end(), [](const Json& d) { return d.is_object(); })) {
    return absl::InvalidArgumentError(
        "chat documents_json must be the JSON text of a list of objects");
  }
  return jinja::Value::FromJson(docs);
}

absl::StatusOr<jinja::ValueDict> TemplateKwargs(std::string_view kwargs_json) {
  jinja::ValueDict out;
  if (kwargs_json.empty()) return out;
  const Json kwargs = Json::parse(kwargs_json, nullptr, /*allow_exceptions=*/false);
  if (!kwargs.is_object()) {
    return absl::InvalidArgumentError(
        "chat template_kwargs_json must be the JSON text of an object");
  }
  for (const auto& [key, value] : kwargs.items()) {
    for (const char* reserved :
         {"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"}) {
      if (key == reserved) {
        return absl::InvalidArgumentError(absl::StrCat(
            "chat template_kwargs_json: '", key,
            "' is a variable the request sets by its own field, not a template argument"));
      }
    }
    out.Set(key, jinja::Value::FromJson(value));
  }
  return out;
}

ChatTemplate::ChatTemplate(std::string source, std::string bos, std::string eos,
                           std::unique_ptr<const jinja::Template> tmpl)
    : source_(std::move(source)),
      bos_token_(std::move(bos)),
      eos_token_(std::move(eos)),
      template_(std::move(tmpl)) {}

absl::StatusOr<std::shared_ptr<const ChatTemplate>> ChatTemplate::Create(std::string source,
                                                                         std::string bos_token,
                                                                         std::string eos_token) {
  absl::StatusOr<std::unique_ptr<const jinja::Template>> tmpl = jinja::Template::Parse(source);
  if (!tmpl.ok()) {
    return absl::Status(tmpl.status().code(),
                        absl::StrCat("chat template: ", tmpl.status().message()));
  }
  return std::shared_ptr<const ChatTemplate>(new ChatTemplate(
      std::move(source), std::move(bos_token), std::move(eos_token), std::move(*tmpl)));
}

absl::StatusOr<std::string> ChatTemplate::Render(absl::Span<const ChatMessage> messages,
                                                 bool add_generation_prompt) const {
  return Render(messages, add_generation_prompt, jinja::ValueDict());
}

absl::StatusOr<std::string> ChatTemplate::Render(absl::Span<const ChatMessage> messages,
                                                 bool add_generation_prompt,
                                                 const jinja::ValueDict& extra) const {
  jinja::ValueList list;
  list.reserve(messages.size());
  for (const ChatMessage& m : messages) {
    jinja::ValueDict d;
    d.Set("role", m.role);
    d.Set("content", m.content_is_none ? jinja::Value::MakeNone() : jinja::Value(m.content));
    if (!m.tool_calls.empty()) {
      jinja::ValueList calls;
      for (const ToolCall& c : m.tool_calls) {
        jinja::ValueDict function;
        function.Set("name", c.name);
        const Json args = Json::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
        function.Set("arguments",
                     args.is_object() ? jinja::Value::FromJson(args) : jinja::Value(c.arguments));
        jinja::ValueDict call;
        if (!c.id.empty()) call.Set("id", c.id);
        call.Set("type", c.type);
        call.Set("function", std::move(function));
        calls.emplace_back(std::move(call));
      }
      d.Set("tool_calls", std::move(calls));
    }
    if (!m.tool_call_id.empty()) d.Set("tool_call_id", m.tool_call_id);
    if (!m.name.empty()) d.Set("name", m.name);
    if (m.reasoning_content.has_value()) d.Set("reasoning_content", *m.reasoning_content);
    list.emplace_back(std::move(d));
  }
  jinja::ValueDict context;
  context.Set("messages", std::move(list));
  context.Set("tools", jinja::Value::MakeNone());
  context.Set("documents", jinja::Value::MakeNone());
  context.Set("add_generation_prompt", add_generation_prompt);
  context.Set("bos_token", bos_token_);
  context.Set("eos_token", eos_token_);
  for (const auto& [k, v] : extra.items) context.Set(k, v);
  absl::StatusOr<std::string> out = template_->Render(context);
  if (!out.ok()) {
    return absl::Status(out.status().code(),
                        absl::StrCat("chat template: ", out.status().message()));
  }
  return out;
}

absl::StatusOr<std::shared_ptr<const ChatTemplate>> LoadChatTemplate(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  std::string bos, eos;
  std::optional<std::string> source;
  std::string origin;
  const fs::path config_path = dir / "tokenizer_config.json";
  if (fs::exists(config_path)) {
    absl::StatusOr<Json> config = ReadJson(config_path);
    if (!config.ok()) return config.status();
    if (!config->is_object())
      return absl::InvalidArgumentError(absl::StrCat(config_path.string(), ": not a JSON object"));
    absl::StatusOr<std::string> b = TokenString(*config, "bos_token", config_path.string());
    if (!b.ok()) return b.status();
    absl::StatusOr<std::string> e = TokenString(*config, "eos_token", config_path.string());
    if (!e.ok()) return e.status();
    bos = *b;
    eos = *e;
    auto it = config->find("chat_template");
    if (it != config->end() && !it->is_null()) {
      absl::StatusOr<std::string> t = TemplateField(*it, config_path.string());
      if (!t.ok()) return t.status();
      source = *t;
      origin = config_path.string();
    }
  }
  const fs::path json_path = dir / "chat_template.json";
  if (fs::exists(json_path)) {
    absl::StatusOr<Json> json = ReadJson(json_path);
    if (!json.ok()) return json.status();
    if (!json->is_object() || !json->contains("chat_template"))
      return absl::InvalidArgumentError(
          absl::StrCat(json_path.string(), ": expected an object with \"chat_template\""));
    absl::StatusOr<std::string> t = TemplateField((*json)["chat_template"], json_path.string());
    if (!t.ok()) return t.status();
    source = *t;
    origin = json_path.string();
  }
  const fs::path jinja_path = dir / "chat_template.jinja";
  if (fs::exists(jinja_path)) {
    absl::StatusOr<std::string> t = ReadFile(jinja_path);
    if (!t.ok()) return t.status();
    source = *t;
    origin = jinja_path.string();
  }
  if (!source.has_value()) return std::shared_ptr<const ChatTemplate>();
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> tmpl =
      ChatTemplate::Create(std::move(*source), std::move(bos), std::move(eos));
  if (!tmpl.ok()) {
    return absl::Status(tmpl.status().code(), absl::StrCat(origin, ": ", tmpl.status().message()));
  }
  return tmpl;
}

}  // namespace llm
