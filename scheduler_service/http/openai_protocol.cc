#include "scheduler_service/http/openai_protocol.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"

namespace llm::openai {
namespace {

using json = nlohmann::json;

std::string TypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return absl::StrCat("boolean ", v.get<bool>() ? "true" : "false");
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return absl::StrCat("number ", v.dump());
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    default:
      return "an unsupported value";
  }
}

OpenAIError BadRequest(std::string message, std::string param) {
  return {.http_status = 400,
          .message = std::move(message),
          .type = "invalid_request_error",
          .param = std::move(param),
          .code = ""};
}

OpenAIError WrongType(const std::string& field, const char* expected, const json& got) {
  return BadRequest(absl::StrCat("'", field, "' must be ", expected, ", got ", TypeName(got)),
                    field);
}

// Typed access to the body's fields; null counts as absent. The first error is kept.
class Fields {
 public:
  // `raw`: the body's text, which `body` was parsed from (outlives this); empty for a part of a
  // body, whose OrderedDump is then the parsed value's, keys sorted.
  explicit Fields(const json& body, std::string_view raw = {}) : body_(body), raw_(raw) {}

  // The value at `path` (present) with its object keys in the order the client wrote them
  // (json sorts them): a JSON schema's properties are generated in their written order, as
  // OpenAI and vLLM do.
  std::string OrderedDump(std::initializer_list<const char*> path) const {
    if (raw_.empty()) {
      json v = body_;
      for (const char* key : path) v = json(v[key]);
      return v.dump();
    }
    nlohmann::ordered_json v = nlohmann::ordered_json::parse(raw_, nullptr, false);
    for (const char* key : path) v = nlohmann::ordered_json(v[key]);
    return v.dump();
  }

  const json* Get(const char* name) const {
    auto it = body_.find(name);
    if (it == body_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool failed() const { return error_.has_value(); }
  OpenAIError error() const { return *error_; }
  void Fail(OpenAIError e) {
    if (!error_.has_value()) error_ = std::move(e);
  }

  std::optional<double> Number(const char* name) {
    const json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) {
      Fail(WrongType(name, "a number", *v));
      return std::nullopt;
    }
    return v->get<double>();
  }
  // An integer in [lo, hi]; 2.0 counts as an integer (as in JSON Schema and OpenAI), 2.5 not.
  std::optional<int64_t> Int(const char* name, int64_t lo, int64_t hi) {
    const json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    const char* expected = lo == 0 ? "a non-negative integer" : "an integer";
    std::optional<int64_t> i;
    if (v->is_number_unsigned()) {
      if (v->get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)) i = v->get<int64_t>();
    } else if (v->is_number_integer()) {
      i = v->get<int64_t>();
    } else if (v->is_number_float()) {
      const double d = v->get<double>();
      if (std::isfinite(d) && std::trunc(d) == d && std::abs(d) < 9.0e18) {
        i = static_cast<int64_t>(d);
      }
    }
    if (!v->is_number() || (v->is_number_float() && !i.has_value() &&
                            std::trunc(v->get<double>()) != v->get<double>())) {
      Fail(WrongType(name, expected, *v));
      return std::nullopt;
    }
    if (!i.has_value() || *i < lo || *i > hi) {
      Fail(BadRequest(absl::StrCat("'", name, "' must be ", expected, " in [", lo, ", ", hi,
                                   "], got ", v->dump()),
                      name));
      return std::nullopt;
    }
    return i;
  }
  // Fields the proto keeps as uint32 / int32.
  std::optional<int64_t> Count(const char* name) { return Int(name, 0, UINT32_MAX); }
  std::optional<int64_t> Int32(const char* name) { return Int(name, INT32_MIN, INT32_MAX); }
  std::optional<bool> Bool(const char* name) {
    const json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) {
      Fail(WrongType(name, "a boolean", *v));
      return std::nullopt;
    }
    return v->get<bool>();
  }
  std::optional<std::string> String(const char* name) {
    const json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) {
      Fail(WrongType(name, "a string", *v));
      return std::nullopt;
    }
    return v->get<std::string>();
  }

 private:
  const json& body_;
  std::string_view raw_;
  std::optional<OpenAIError> error_;
};

// Reads a list of token ids (`what` names it in errors) into `out`.
bool TokenIdList(const json& v, const std::string& what, Fields* f,
                 google::protobuf::RepeatedField<int32_t>* out) {
  for (size_t i = 0; i < v.size(); ++i) {
    const json& e = v[i];
    if (!e.is_number_integer() || e.get<int64_t>() < INT32_MIN || e.get<int64_t>() > INT32_MAX) {
      f->Fail(BadRequest(absl::StrCat("'", what, "' must be a list of integer token ids; element ",
                                      i, " is ", TypeName(e)),
                         what));
      return false;
    }
    out->Add(static_cast<int32_t>(e.get<int64_t>()));
  }
  return true;
}

// logit_bias: {"<token id>": bias, ...}, as OpenAI's (keys are strings of decimal token ids;
// biases in [-100, 100]). Whether an id is in the vocabulary is the engine's check.
void ParseLogitBias(Fields* f, v1::SamplingParams* sp) {
  const json* lb = f->Get("logit_bias");
  if (lb == nullptr) return;
  if (!lb->is_object()) {
    f->Fail(WrongType("logit_bias", "an object mapping token ids to biases", *lb));
    return;
  }
  auto* out = sp->mutable_logit_bias();
  for (const auto& [key, value] : lb->items()) {
    int64_t id = 0;
    bool ok = !key.empty() && key.size() <= 10;
    for (char c : key) {
      ok = ok && c >= '0' && c <= '9';
      if (ok) id = id * 10 + (c - '0');
    }
    if (!ok || id > INT32_MAX) {
      f->Fail(BadRequest(absl::StrCat("'logit_bias' keys must be token ids (non-negative integers "
                                      "as strings), got \"",
                                      key, "\""),
                         "logit_bias"));
      return;
    }
    const std::string where = absl::StrCat("logit_bias[\"", key, "\"]");
    if (!value.is_number()) {
      f->Fail(BadRequest(absl::StrCat("'", where, "' must be a number, got ", TypeName(value)),
                         "logit_bias"));
      return;
    }
    const double bias = value.get<double>();
    if (!std::isfinite(bias) || bias < -100 || bias > 100) {
      f->Fail(BadRequest(
          absl::StrCat("'", where, "' is ", value.dump(), "; biases must be in [-100, 100]"),
          "logit_bias"));
      return;
    }
    if (out->contains(static_cast<int32_t>(id))) {
      f->Fail(BadRequest(absl::StrCat("'logit_bias' lists token id ", id, " twice"), "logit_bias"));
      return;
    }
    (*out)[static_cast<int32_t>(id)] = static_cast<float>(bias);
  }
}

// A field whose meaning is known (OpenAI's or vLLM's) but which this server does not implement:
// refused with 400 naming it, unless its value asks for nothing (false, an empty list, the
// default), so that a client never gets a silently different answer. Fields nobody defines
// stay ignored, as OpenAI clients send extras.
struct Unsupported {
  const char* name;
  // Whether `v` (not null) asks for nothing; null: every value is refused.
  bool (*accepts)(const json& v);
  const char* why;  // what is not implemented
  bool completions = true;
  bool chat = true;
};

bool IsFalse(const json& v) { return v.is_boolean() && !v.get<bool>(); }
bool IsTrue(const json& v) { return v.is_boolean() && v.get<bool>(); }
bool IsEmpty(const json& v) { return (v.is_array() || v.is_object()) && v.empty(); }
bool IsNone(const json& v) { return v.is_string() && v.get<std::string>() == "none"; }
bool IsOne(const json& v) { return v.is_number() && v.get<double>() == 1.0; }
bool IsTextFormat(const json& v) {
  return v.is_object() && v.size() == 1 && v.contains("type") && v["type"] == "text";
}
bool IsDefaultTier(const json& v) { return v == "auto" || v == "default"; }
bool IsTextOnly(const json& v) {
  if (!v.is_array()) return false;
  for (const json& m : v) {
    if (m != "text") return false;
  }
  return true;
}

constexpr const char* kLegacyFunctions =
    "the deprecated functions API is not implemented (tools and tool_choice are)";

const Unsupported kUnsupported[] = {
    {"functions", IsEmpty, kLegacyFunctions},
    {"function_call", IsNone, kLegacyFunctions},
    {"store", IsFalse, "completions are not stored"},
    {"service_tier", IsDefaultTier, "there is one service tier (\"auto\" / \"default\")"},
    {"modalities", IsTextOnly, "the output is text only"},
    {"audio", nullptr, "audio output is not implemented"},
    {"prediction", nullptr, "predicted outputs are not implemented"},
    {"reasoning_effort", nullptr, "reasoning effort is not implemented"},
    {"verbosity", nullptr, "verbosity is not implemented"},
    {"web_search_options", nullptr, "web search is not implemented"},
    // vLLM's extras.
    {"guided_whitespace_pattern", nullptr,
     "a whitespace pattern is not implemented (structured_outputs.disable_any_whitespace is)"},
    {"allowed_token_ids", nullptr, "allowed_token_ids is not implemented (logit_bias is)"},
    {"bad_words", IsEmpty, "bad words are not implemented"},
    {"prompt_logprobs", nullptr, "prompt logprobs are not implemented"},
    {"use_beam_search", IsFalse, "beam search is not implemented"},
    {"length_penalty", IsOne, "length_penalty (beam search) is not implemented"},
    {"truncate_prompt_tokens", nullptr, "prompt truncation is not implemented"},
    {"logits_processors", nullptr, "custom logits processors are not implemented"},
    {"return_tokens_as_token_ids", IsFalse, "tokens as token ids are not implemented"},
    {"return_token_ids", IsFalse, "returning token ids is not implemented"},
    {"spaces_between_special_tokens", IsTrue,
     "spaces_between_special_tokens false is not implemented"},
    {"prompt_embeds", nullptr, "prompt embeddings are not implemented"},
    {"kv_transfer_params", nullptr, "KV-cache transfer is not implemented"},
    {"vllm_xargs", nullptr, "vLLM's extra arguments are not implemented"},
    {"mm_processor_kwargs", IsEmpty, "multimodal input is not implemented"},
    {"echo", IsFalse, "echoing the last message is not implemented", /*completions=*/false},
    {"continue_final_message", IsFalse, "continuing the final message is not implemented",
     /*completions=*/false},
    {"chat_template", nullptr, "only the model's chat template is used", /*completions=*/false},
    {"tools", IsEmpty, "tools are a chat completions field", /*completions=*/true,
     /*chat=*/false},
    {"tool_choice", IsNone, "tools are a chat completions field", /*completions=*/true,
     /*chat=*/false},
};

void RefuseUnsupported(Fields* f, Endpoint endpoint) {
  for (const Unsupported& u : kUnsupported) {
    if (!(endpoint == Endpoint::kChatCompletions ? u.chat : u.completions)) continue;
    const json* v = f->Get(u.name);
    if (v == nullptr || (u.accepts != nullptr && u.accepts(*v))) continue;
    std::string what = absl::StrCat("'", u.name, "'");
    if (v->is_string() || v->is_boolean() || v->is_number()) {
      what = absl::StrCat("'", u.name, "' = ", v->dump());
    }
    f->Fail(BadRequest(absl::StrCat(what, " is not supported: ", u.why), u.name));
    return;
  }
}

// A JSON schema given as an object (or true / false) at `path`, or as its text: its text.
std::optional<std::string> SchemaText(Fields* f, const json& v, const std::string& where,
                                      std::initializer_list<const char*> path) {
  if (v.is_object()) return f->OrderedDump(path);
  if (v.is_boolean()) return v.dump();
  if (v.is_string()) return v.get<std::string>();
  f->Fail(WrongType(where.c_str(), "a JSON schema (an object)", v));
  return std::nullopt;
}

// Sets `so`'s constraint of kind `kind` ("json", "regex", "grammar" or "choice", as vLLM names
// them) from `v`, the value of the field `where` found at `path`; false, the failure recorded,
// when `v` has the wrong type.
bool SetConstraint(Fields* f, const std::string& kind, const json& v, const std::string& where,
                   std::initializer_list<const char*> path, v1::StructuredOutput* so) {
  if (kind == "json") {
    std::optional<std::string> text = SchemaText(f, v, where, path);
    if (text.has_value()) so->set_json_schema(*text);
    return text.has_value();
  }
  if (kind == "choice") {
    if (!v.is_array() ||
        !std::all_of(v.begin(), v.end(), [](const json& c) { return c.is_string(); })) {
      f->Fail(WrongType(where, "a list of strings", v));
      return false;
    }
    for (const json& c : v) so->mutable_choice()->add_choices(c.get<std::string>());
    return true;
  }
  if (!v.is_string()) {
    f->Fail(WrongType(where, "a string", v));
    return false;
  }
  kind == "regex" ? so->set_regex(v.get<std::string>()) : so->set_grammar(v.get<std::string>());
  return true;
}

// Structured outputs, in the three ways clients ask for them: OpenAI's response_format
// (json_object, json_schema), vLLM's structured_outputs object, and vLLM's older guided_* fields.
// One constraint per request. OpenAI's json_schema `strict` is accepted either way: the schema is
// always enforced.
void ParseStructured(Fields* f, v1::SamplingParams* sp) {
  v1::StructuredOutput so;
  std::vector<std::string> sources;  // the fields that set a constraint
  auto set_once = [&](const std::string& source) {
    sources.push_back(source);
    if (sources.size() == 2) {
      f->Fail(BadRequest(absl::StrCat("'", sources[0], "' and '", sources[1],
                                      "' both constrain the output; give one"),
                         source));
    }
  };
  if (const json* rf = f->Get("response_format")) {
    const json* type = rf->is_object() && rf->contains("type") ? &(*rf)["type"] : nullptr;
    if (type == nullptr || !type->is_string()) {
      f->Fail(WrongType("response_format", "an object with a string 'type'", *rf));
      return;
    }
    const std::string t = type->get<std::string>();
    if (t == "json_object") {
      so.set_json_object(true);
      set_once("response_format");
    } else if (t == "json_schema") {
      const json* js = rf->contains("json_schema") ? &(*rf)["json_schema"] : nullptr;
      if (js == nullptr || !js->is_object() || !js->contains("schema") ||
          (*js)["schema"].is_null()) {
        f->Fail(
            BadRequest("'response_format' of type 'json_schema' needs 'json_schema' with a "
                       "'schema'",
                       "response_format.json_schema"));
        return;
      }
      const json& strict = js->value("strict", json());
      if (!strict.is_null() && !strict.is_boolean()) {
        f->Fail(WrongType("response_format.json_schema.strict", "a boolean", strict));
        return;
      }
      std::optional<std::string> text =
          SchemaText(f, (*js)["schema"], "response_format.json_schema.schema",
                     {"response_format", "json_schema", "schema"});
      if (!text.has_value()) return;
      so.set_json_schema(*text);
      set_once("response_format");
    } else if (t != "text") {
      f->Fail(BadRequest(absl::StrCat("'response_format' of type '", t,
                                      "' is not supported: the types are 'text', 'json_object' "
                                      "and 'json_schema'"),
                         "response_format.type"));
      return;
    }
  }
  // vLLM's structured_outputs: one of json, regex, choice, grammar, json_object.
  if (const json* s = f->Get("structured_outputs")) {
    if (!s->is_object()) {
      f->Fail(WrongType("structured_outputs", "an object", *s));
      return;
    }
    for (const auto& [key, v] : s->items()) {
      const std::string where = "structured_outputs." + key;
      if (v.is_null()) continue;
      if (key == "json" || key == "regex" || key == "grammar" || key == "choice") {
        if (!SetConstraint(f, key, v, where, {"structured_outputs", key.c_str()}, &so)) return;
      } else if (key == "json_object") {
        if (!v.is_boolean()) {
          f->Fail(WrongType(where.c_str(), "a boolean", v));
          return;
        }
        if (!v.get<bool>()) continue;
        so.set_json_object(true);
      } else if (key == "disable_any_whitespace") {
        if (!v.is_boolean()) {
          f->Fail(WrongType(where.c_str(), "a boolean", v));
          return;
        }
        so.set_any_whitespace(!v.get<bool>());
        continue;
      } else if (key == "backend" || key == "disable_fallback") {
        continue;  // one engine, which never falls back: nothing to choose
      } else {
        f->Fail(BadRequest(absl::StrCat("'", where,
                                        "' is not supported (supported: json, regex, "
                                        "choice, grammar, json_object, disable_any_whitespace)"),
                           where));
        return;
      }
      set_once(where);
    }
  }
  // vLLM's older names for the same.
  for (const char* name : {"guided_json", "guided_regex", "guided_choice", "guided_grammar"}) {
    const json* v = f->Get(name);
    if (v == nullptr) continue;
    const std::string key(name);
    if (!SetConstraint(f, key.substr(std::string_view("guided_").size()), *v, key, {name}, &so)) {
      return;
    }
    set_once(key);
  }
  if (f->failed() || sources.empty()) return;
  *sp->mutable_structured_output() = std::move(so);
}

// The sampling fields both endpoints share.
void ParseSampling(Fields* f, v1::SamplingParams* sp) {
  if (auto n = f->Count("n")) sp->set_n(static_cast<uint32_t>(*n));
  if (auto v = f->Number("temperature")) sp->set_temperature(static_cast<float>(*v));
  if (auto v = f->Number("top_p")) sp->set_top_p(static_cast<float>(*v));
  if (auto v = f->Int32("top_k")) sp->set_top_k(*v == 0 ? -1 : static_cast<int32_t>(*v));
  if (auto v = f->Number("min_p")) sp->set_min_p(static_cast<float>(*v));
  if (auto v = f->Int("seed", INT64_MIN, INT64_MAX)) sp->set_seed(static_cast<uint64_t>(*v));
  if (auto v = f->Count("min_tokens")) sp->set_min_tokens(static_cast<uint32_t>(*v));
  if (auto v = f->Bool("ignore_eos")) sp->set_ignore_eos(*v);
  if (auto v = f->Number("presence_penalty")) sp->set_presence_penalty(static_cast<float>(*v));
  if (auto v = f->Number("frequency_penalty")) sp->set_frequency_penalty(static_cast<float>(*v));
  if (auto v = f->Number("repetition_penalty")) {
    sp->set_repetition_penalty(static_cast<float>(*v));
  }
  if (auto v = f->Bool("skip_special_tokens")) sp->set_skip_special_tokens(*v);
  if (auto v = f->Bool("include_stop_str_in_output")) sp->set_include_stop_str_in_output(*v);
  ParseLogitBias(f, sp);
  ParseStructured(f, sp);
  if (const json* stop = f->Get("stop")) {
    if (stop->is_string()) {
      sp->add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) {
          f->Fail(BadRequest(absl::StrCat("'stop' must be a string or a list of strings; element ",
                                          i, " is ", TypeName((*stop)[i])),
                             "stop"));
          return;
        }
        sp->add_stop((*stop)[i].get<std::string>());
      }
    } else {
      f->Fail(WrongType("stop", "a string or a list of strings", *stop));
    }
  }
  if (const json* ids = f->Get("stop_token_ids")) {
    if (!ids->is_array()) {
      f->Fail(WrongType("stop_token_ids", "a list of integers", *ids));
    } else {
      TokenIdList(*ids, "stop_token_ids", f, sp->mutable_stop_token_ids());
    }
  }
}

// The fields both endpoints read the same way: model, stream, stream_options, priority, ...
void ParseCommon(Fields* f, OpenAIRequest* r) {
  if (auto m = f->String("model")) r->model = *m;
  const bool stream = f->Bool("stream").value_or(false);
  r->request.set_stream(stream);
  if (const json* so = f->Get("stream_options")) {
    if (!so->is_object()) {
      f->Fail(WrongType("stream_options", "an object", *so));
    } else if (!stream) {
      f->Fail(
          BadRequest("'stream_options' is only allowed when 'stream' is true", "stream_options"));
    } else {
      Fields so_fields(*so);
      if (auto u = so_fields.Bool("include_usage")) r->include_usage = *u;
      if (so_fields.failed()) {
        OpenAIError e = so_fields.error();
        e.param = "stream_options." + e.param;
        f->Fail(e);
      }
    }
  }
  if (auto v = f->Int32("priority")) r->request.set_priority(static_cast<int32_t>(*v));
  if (auto v = f->String("cache_salt")) r->request.set_cache_salt(*v);
  ParseSampling(f, r->request.mutable_sampling_params());
  RefuseUnsupported(f, r->endpoint);
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name",
// "arguments"}}]; arguments as JSON text (OpenAI's) or an object.
void ParseMessageToolCalls(Fields* f, const json& m, const std::string& where,
                           v1::ChatMessage* msg) {
  auto calls = m.find("tool_calls");
  if (calls == m.end() || calls->is_null()) return;
  const std::string cwhere = where + ".tool_calls";
  if (!calls->is_array()) {
    f->Fail(WrongType(cwhere, "a list of tool calls", *calls));
    return;
  }
  for (size_t k = 0; k < calls->size(); ++k) {
    const json& c = (*calls)[k];
    const std::string kwhere = absl::StrCat(cwhere, "[", k, "]");
    if (!c.is_object()) {
      f->Fail(WrongType(kwhere, "an object", c));
      return;
    }
    v1::ToolCall* call = msg->add_tool_calls();
    const json& id = c.value("id", json());
    if (!id.is_null() && !id.is_string()) {
      f->Fail(WrongType(kwhere + ".id", "a string", id));
      return;
    }
    if (id.is_string()) call->set_id(id.get<std::string>());
    const json& type = c.value("type", json("function"));
    if (type != "function") {
      f->Fail(
          BadRequest(absl::StrCat("'", kwhere, ".type' must be \"function\", got ", type.dump()),
                     kwhere + ".type"));
      return;
    }
    call->set_type("function");
    const json& fn = c.value("function", json());
    if (!fn.is_object()) {
      f->Fail(WrongType(kwhere + ".function", "an object with 'name' and 'arguments'", fn));
      return;
    }
    const json& name = fn.value("name", json());
    if (!name.is_string() || name.get<std::string>().empty()) {
      f->Fail(WrongType(kwhere + ".function.name", "a non-empty string", name));
      return;
    }
    call->mutable_function()->set_name(name.get<std::string>());
    const json& args = fn.value("arguments", json());
    if (args.is_string()) {
      call->mutable_function()->set_arguments(args.get<std::string>());
    } else if (args.is_object()) {
      call->mutable_function()->set_arguments(args.dump());
    } else if (!args.is_null()) {
      f->Fail(WrongType(kwhere + ".function.arguments", "a string of JSON", args));
      return;
    }
  }
}

// vLLM's chat `documents` (a list of objects) and `chat_template_kwargs` (an object whose keys
// are more template variables), their keys in the order written.
void ParseTemplateInputs(Fields* f, v1::ChatPrompt* chat) {
  if (f->failed()) return;
  if (const json* d = f->Get("documents")) {
    if (!d->is_array() ||
        !std::all_of(d->begin(), d->end(), [](const json& doc) { return doc.is_object(); })) {
      f->Fail(WrongType("documents", "a list of objects", *d));
      return;
    }
    chat->set_documents_json(f->OrderedDump({"documents"}));
  }
  if (const json* k = f->Get("chat_template_kwargs")) {
    if (!k->is_object()) {
      f->Fail(WrongType("chat_template_kwargs", "an object", *k));
      return;
    }
    for (const char* reserved :
         {"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"}) {
      if (!k->contains(reserved)) continue;
      const std::string param = absl::StrCat("chat_template_kwargs.", reserved);
      f->Fail(BadRequest(absl::StrCat("'", param, "' is not a template argument: the request's ",
                                      "own fields set it"),
                         param));
      return;
    }
    if (!k->empty()) chat->set_template_kwargs_json(f->OrderedDump({"chat_template_kwargs"}));
  }
}

// tools, tool_choice and parallel_tool_calls. tool_choice defaults to "auto" with tools, as
// OpenAI's; "required" and a named function constrain the output with a JSON schema, as vLLM
// does: named, to the function's parameters (the output is the call's arguments); required, to
// a list of {"name", "parameters"} calls of the tools.
void ParseTools(Fields* f, OpenAIRequest* r) {
  if (f->failed()) return;
  using ojson = nlohmann::ordered_json;
  ojson tools = ojson::array();
  if (const json* t = f->Get("tools")) {
    if (!t->is_array()) {
      f->Fail(WrongType("tools", "a list of tools", *t));
      return;
    }
    tools = ojson::parse(f->OrderedDump({"tools"}));
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& tool = tools[i];
    const std::string where = absl::StrCat("tools[", i, "]");
    if (!tool.is_object()) {
      f->Fail(WrongType(where, "an object {\"type\": \"function\", \"function\": {...}}", tool));
      return;
    }
    if (tool.value("type", ojson()) != "function") {
      f->Fail(BadRequest(absl::StrCat("'", where, ".type' must be \"function\", got ",
                                      tool.value("type", ojson()).dump()),
                         where + ".type"));
      return;
    }
    const ojson& fn = tool.value("function", ojson());
    if (!fn.is_object()) {
      f->Fail(WrongType(where + ".function", "an object with a 'name'", json::parse(fn.dump())));
      return;
    }
    const ojson& name = fn.value("name", ojson());
    if (!name.is_string() || name.get<std::string>().empty()) {
      f->Fail(WrongType(where + ".function.name", "a non-empty string", json::parse(name.dump())));
      return;
    }
    for (const char* key : {"description"}) {
      if (fn.contains(key) && !fn[key].is_null() && !fn[key].is_string()) {
        f->Fail(WrongType(absl::StrCat(where, ".function.", key), "a string",
                          json::parse(fn[key].dump())));
        return;
      }
    }
    if (fn.contains("parameters") && !fn["parameters"].is_null() && !fn["parameters"].is_object()) {
      f->Fail(WrongType(where + ".function.parameters", "a JSON schema (an object)",
                        json::parse(fn["parameters"].dump())));
      return;
    }
    if (fn.contains("strict") && !fn["strict"].is_null() && !fn["strict"].is_boolean()) {
      f->Fail(WrongType(where + ".function.strict", "a boolean", json::parse(fn["strict"].dump())));
      return;
    }
    const std::string n = name.get<std::string>();
    if (std::find(names.begin(), names.end(), n) != names.end()) {
      f->Fail(BadRequest(absl::StrCat("'tools' has two functions named '", n, "'"),
                         where + ".function.name"));
      return;
    }
    names.push_back(n);
  }
  if (auto v = f->Bool("parallel_tool_calls")) r->parallel_tool_calls = *v;
  ToolChoice choice = tools.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
  if (const json* tc = f->Get("tool_choice")) {
    if (tc->is_string()) {
      const std::string c = tc->get<std::string>();
      if (c == "none") {
        choice = ToolChoice::kNone;
      } else if (c == "auto") {
        choice = ToolChoice::kAuto;
      } else if (c == "required") {
        choice = ToolChoice::kRequired;
      } else {
        f->Fail(BadRequest(absl::StrCat("'tool_choice' = \"", c,
                                        "\" is not one of \"none\", \"auto\", \"required\" or "
                                        "{\"type\": \"function\", \"function\": {\"name\": ...}}"),
                           "tool_choice"));
        return;
      }
    } else if (tc->is_object() && tc->value("type", json()) == "function" &&
               tc->contains("function") && (*tc)["function"].is_object() &&
               (*tc)["function"].value("name", json()).is_string()) {
      choice = ToolChoice::kNamed;
      r->tool_name = (*tc)["function"]["name"].get<std::string>();
      if (std::find(names.begin(), names.end(), r->tool_name) == names.end()) {
        f->Fail(BadRequest(absl::StrCat("'tool_choice.function.name' is '", r->tool_name,
                                        "', which is not among the tools"),
                           "tool_choice.function.name"));
        return;
      }
    } else {
      f->Fail(WrongType("tool_choice",
                        "\"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                        "\"function\": {\"name\": <string>}}",
                        *tc));
      return;
    }
    if (choice != ToolChoice::kNone && tools.empty()) {
      f->Fail(BadRequest("'tool_choice' other than \"none\" needs 'tools'", "tool_choice"));
      return;
    }
  }
  r->tool_choice = choice;
  if (!tools.empty()) r->request.mutable_chat()->set_tools_json(tools.dump());
  if (choice != ToolChoice::kRequired && choice != ToolChoice::kNamed) return;
  v1::SamplingParams* sp = r->request.mutable_sampling_params();
  if (sp->has_structured_output()) {
    f->Fail(
        BadRequest("'tool_choice' \"required\" or a named function constrains the output to "
                   "tool calls; it cannot be combined with response_format or "
                   "structured_outputs",
                   "tool_choice"));
    return;
  }
  auto parameters = [](const ojson& fn) {
    const ojson p = fn.value("parameters", ojson());
    return p.is_object() ? p : ojson{{"type", "object"}};
  };
  ojson schema;
  if (choice == ToolChoice::kNamed) {
    for (const ojson& tool : tools) {
      if (tool["function"]["name"] == r->tool_name) schema = parameters(tool["function"]);
    }
  } else {
    ojson any_of = ojson::array();
    for (const ojson& tool : tools) {
      ojson props = ojson::object();
      props["name"] = {{"type", "string"}, {"enum", ojson::array({tool["function"]["name"]})}};
      props["parameters"] = parameters(tool["function"]);
      any_of.push_back({{"type", "object"},
                        {"properties", std::move(props)},
                        {"required", ojson::array({"name", "parameters"})}});
    }
    schema = {{"type", "array"}, {"minItems", 1}};
    if (!r->parallel_tool_calls) schema["maxItems"] = 1;
    schema["items"] = any_of.size() == 1 ? any_of[0] : ojson{{"anyOf", std::move(any_of)}};
  }
  sp->mutable_structured_output()->set_json_schema(schema.dump());
}

ParseResult Finish(Fields& f, OpenAIRequest r) {
  ParseResult out;
  if (f.failed()) {
    out.error = f.error();
  } else {
    out.request = std::move(r);
  }
  return out;
}

std::optional<json> ParseBody(std::string_view body, ParseResult* out) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    out->error = BadRequest("the request body is not valid JSON", "");
    return std::nullopt;
  }
  if (!j.is_object()) {
    out->error =
        BadRequest(absl::StrCat("the request body must be a JSON object, got ", TypeName(j)), "");
    return std::nullopt;
  }
  return j;
}

float ClampLogprob(float lp) { return std::max(lp, -9999.0f); }

json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// Completions' logprobs object for `o`'s tokens; `text_offset` is where they start in the
// choice's text (advanced past them).
json CompletionLogprobs(const v1::SequenceOutput& o, size_t* text_offset) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (const v1::Logprobs& lp : o.logprobs()) {
    tokens.push_back(lp.sampled().text());
    token_logprobs.push_back(ClampLogprob(lp.sampled().logprob()));
    json t = json::object();
    for (const v1::TokenLogprob& alt : lp.top()) t[alt.text()] = ClampLogprob(alt.logprob());
    if (!t.contains(lp.sampled().text())) {
      t[lp.sampled().text()] = ClampLogprob(lp.sampled().logprob());
    }
    top.push_back(std::move(t));
    offsets.push_back(*text_offset);
    *text_offset += lp.sampled().text().size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

json ChatLogprobs(const v1::SequenceOutput& o) {
  json content = json::array();
  for (const v1::Logprobs& lp : o.logprobs()) {
    json top = json::array();
    for (const v1::TokenLogprob& alt : lp.top()) {
      top.push_back({{"token", alt.text()},
                     {"logprob", ClampLogprob(alt.logprob())},
                     {"bytes", Bytes(alt.text())}});
    }
    content.push_back({{"token", lp.sampled().text()},
                       {"logprob", ClampLogprob(lp.sampled().logprob())},
                       {"bytes", Bytes(lp.sampled().text())},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

// vLLM's stop_reason: the stop string, the stop token id (an integer), or null (EOS, length).
json StopReason(const v1::SequenceOutput& o) {
  if (!o.stop_reason().empty()) return o.stop_reason();
  if (o.has_stop_token_id()) return o.stop_token_id();
  return nullptr;
}

// "call_" and 24 random letters and digits, as OpenAI's ids.
std::string ToolCallId() {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kChars[rng() % (sizeof(kChars) - 1)];
  return id;
}

json ToolCallJson(const ParsedToolCall& c) {
  return {{"id", ToolCallId()},
          {"type", "function"},
          {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

// kRequired's output: the constrained list of {"name", "parameters"}; nullopt when it does not
// parse (cut by max_tokens).
std::optional<std::vector<ParsedToolCall>> RequiredCalls(const std::string& text) {
  const nlohmann::ordered_json j =
      nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array() || j.empty()) return std::nullopt;
  std::vector<ParsedToolCall> calls;
  for (const auto& c : j) {
    if (!c.is_object() || !c.contains("name") || !c["name"].is_string()) return std::nullopt;
    calls.push_back({c["name"].get<std::string>(),
                     c.contains("parameters") ? c["parameters"].dump() : std::string("{}")});
  }
  return calls;
}

// The calls and content of a whole chat output's `text` (after its reasoning) under the
// request's tool_choice.
ParsedOutput ChatToolOutput(const OpenAIRequest& req, const std::string& text) {
  ParsedOutput out;
  switch (req.tool_choice) {
    case ToolChoice::kNamed:
      // The constrained arguments; cut by max_tokens, the text as it is.
      if (json::accept(text)) {
        out.calls.push_back({req.tool_name, text});
      } else {
        out.content = text;
      }
      break;
    case ToolChoice::kRequired:
      if (auto calls = RequiredCalls(text)) {
        out.calls = std::move(*calls);
      } else {
        out.content = text;
      }
      break;
    case ToolChoice::kAuto:
      out = ParseToolCalls(req.tool_format, text);
      if (!req.parallel_tool_calls && out.calls.size() > 1) out.calls.resize(1);
      break;
    default:
      out.content = text;
  }
  return out;
}

// A stop with tool calls is finish_reason "tool_calls", as OpenAI's.
json ChatFinishReason(const v1::SequenceOutput& o, bool called) {
  if (called && o.finish_reason() == v1::FINISH_REASON_STOP) return "tool_calls";
  return FinishReasonJson(o.finish_reason());
}

// A streamed chat output's delta (`text`, after its reasoning; `final`: its last) under the
// request's tool_choice: content that cannot be part of a call streams as content; a call is
// sent whole once read (kAuto, kRequired), or, named, its name first and its arguments as they
// are generated.
json ToolDelta(const OpenAIRequest& req, const std::string& text, bool final,
               StreamState::Tools* t) {
  std::string content;
  json calls = json::array();
  auto add_calls = [&](std::vector<ParsedToolCall>& parsed) {
    for (ParsedToolCall& call : parsed) {
      if (!req.parallel_tool_calls && t->calls > 0) break;
      json j = ToolCallJson(call);
      j["index"] = t->calls++;
      calls.push_back(std::move(j));
    }
  };
  switch (req.tool_choice) {
    case ToolChoice::kNamed:
      if (t->named_id.empty()) {
        t->named_id = ToolCallId();
        t->calls = 1;
        calls.push_back({{"index", 0},
                         {"id", t->named_id},
                         {"type", "function"},
                         {"function", {{"name", req.tool_name}, {"arguments", text}}}});
      } else if (!text.empty()) {
        calls.push_back({{"index", 0}, {"function", {{"arguments", text}}}});
      }
      break;
    case ToolChoice::kRequired:
      t->text += text;
      if (final) {
        if (auto parsed = RequiredCalls(t->text)) {
          add_calls(*parsed);
        } else {
          content = t->text;
        }
      }
      break;
    default: {
      if (t->parser == nullptr) t->parser = std::make_shared<ToolCallStreamParser>(req.tool_format);
      ToolCallStreamParser::Delta d = t->parser->Add(text);
      content = std::move(d.content);
      add_calls(d.calls);
      if (final) {
        ToolCallStreamParser::Delta rest = t->parser->Finish();
        content += rest.content;
        add_calls(rest.calls);
      }
    }
  }
  json delta = json::object();
  if (!content.empty() || calls.empty()) delta["content"] = content;
  if (!calls.empty()) delta["tool_calls"] = std::move(calls);
  return delta;
}

}  // namespace

bool StartsInReasoning(const OpenAIRequest& req) {
  const bool constrained = req.request.sampling_params().has_structured_output() ||
                           req.tool_choice == ToolChoice::kRequired ||
                           req.tool_choice == ToolChoice::kNamed;
  return req.reasoning == ReasoningFormat::kDeepSeekR1 && !constrained;
}

json OpenAIError::ToJson() const {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

ParseResult ParseCompletionRequest(std::string_view body) {
  ParseResult out;
  std::optional<json> j = ParseBody(body, &out);
  if (!j.has_value()) return out;
  Fields f(*j, body);
  OpenAIRequest r;
  r.endpoint = Endpoint::kCompletions;
  ParseCommon(&f, &r);
  // OpenAI's completions take a string, a token list, or a batch of either; one prompt here.
  const json* prompt = f.Get("prompt");
  if (prompt == nullptr) {
    f.Fail(BadRequest("'prompt' is required", "prompt"));
  } else {
    const json* p = prompt;
    if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) {
      p = &(*p)[0];  // a batch of one
    }
    if (p->is_string()) {
      r.request.set_text(p->get<std::string>());
    } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
      TokenIdList(*p, "prompt", &f, r.request.mutable_token_ids()->mutable_ids());
    } else if (p->is_array() && p->size() > 1 && ((*p)[0].is_string() || (*p)[0].is_array())) {
      f.Fail(BadRequest(absl::StrCat("'prompt' is a batch of ", p->size(),
                                     " prompts; send one prompt per request"),
                        "prompt"));
    } else {
      f.Fail(WrongType("prompt", "a string or a non-empty list of token ids", *p));
    }
  }
  r.request.set_add_special_tokens(f.Bool("add_special_tokens").value_or(true));
  v1::SamplingParams* sp = r.request.mutable_sampling_params();
  // Completions default to 16 tokens, as OpenAI's and vLLM's; chat fills the context.
  sp->set_max_tokens(static_cast<uint32_t>(f.Count("max_tokens").value_or(16)));
  if (auto v = f.Count("logprobs")) {
    sp->set_logprobs(static_cast<uint32_t>(*v));
    r.logprobs = true;
  }
  if (f.Bool("echo").value_or(false)) f.Fail(BadRequest("'echo' is not supported", "echo"));
  if (auto s = f.String("suffix"); s.has_value() && !s->empty()) {
    f.Fail(BadRequest("'suffix' is not supported", "suffix"));
  }
  if (auto b = f.Count("best_of"); b.has_value() && *b != (sp->has_n() ? sp->n() : 1)) {
    f.Fail(BadRequest("'best_of' other than n is not supported", "best_of"));
  }
  return Finish(f, std::move(r));
}

ParseResult ParseChatCompletionRequest(std::string_view body) {
  ParseResult out;
  std::optional<json> j = ParseBody(body, &out);
  if (!j.has_value()) return out;
  Fields f(*j, body);
  OpenAIRequest r;
  r.endpoint = Endpoint::kChatCompletions;
  ParseCommon(&f, &r);
  v1::ChatPrompt* chat = r.request.mutable_chat();
  const json* messages = f.Get("messages");
  if (messages == nullptr) {
    f.Fail(BadRequest("'messages' is required", "messages"));
  } else if (!messages->is_array() || messages->empty()) {
    f.Fail(WrongType("messages", "a non-empty list of messages", *messages));
  } else {
    for (size_t i = 0; i < messages->size() && !f.failed(); ++i) {
      const json& m = (*messages)[i];
      const std::string where = absl::StrCat("messages[", i, "]");
      if (!m.is_object()) {
        f.Fail(WrongType(where, "an object", m));
        break;
      }
      auto role = m.find("role");
      if (role == m.end() || !role->is_string()) {
        f.Fail(WrongType(where + ".role", "a string", role == m.end() ? json(nullptr) : *role));
        break;
      }
      const std::string role_name = role->get<std::string>();
      if (role_name == "function") {
        f.Fail(BadRequest(absl::StrCat("'", where, ".role' is 'function': ", kLegacyFunctions,
                                       "; send role 'tool'"),
                          where + ".role"));
        break;
      }
      for (const char* field : {"function_call", "audio"}) {
        auto it = m.find(field);
        if (it == m.end() || it->is_null() || IsEmpty(*it)) continue;
        f.Fail(
            BadRequest(absl::StrCat("'", where, ".", field, "' is not supported: ",
                                    std::string_view(field) == "audio" ? "audio is not implemented"
                                                                       : kLegacyFunctions),
                       absl::StrCat(where, ".", field)));
        break;
      }
      if (f.failed()) break;
      v1::ChatMessage* msg = chat->add_messages();
      msg->set_role(role_name);
      // The message's string fields; a reasoning model's earlier thinking is vLLM's
      // reasoning_content, or reasoning (its newer name).
      using Setter = void (*)(v1::ChatMessage*, std::string);
      const struct {
        const char* name;
        Setter set;
      } strings[] = {
          {"tool_call_id", [](v1::ChatMessage* p, std::string v) { p->set_tool_call_id(v); }},
          {"name", [](v1::ChatMessage* p, std::string v) { p->set_name(v); }},
          {"reasoning", [](v1::ChatMessage* p, std::string v) { p->set_reasoning_content(v); }},
          {"reasoning_content",
           [](v1::ChatMessage* p, std::string v) { p->set_reasoning_content(v); }}};
      for (const auto& field : strings) {
        auto it = m.find(field.name);
        if (it == m.end() || it->is_null()) continue;
        if (!it->is_string()) {
          f.Fail(WrongType(absl::StrCat(where, ".", field.name), "a string", *it));
          break;
        }
        field.set(msg, it->get<std::string>());
      }
      if (f.failed()) break;
      ParseMessageToolCalls(&f, m, where, msg);
      if (f.failed()) break;
      auto content = m.find("content");
      if (content == m.end() || content->is_null()) {
        // "" rather than none, as vLLM passes it: templates that know nothing of tools
        // concatenate every message's content.
        msg->set_content("");
        continue;
      }
      if (content->is_string()) {
        msg->set_content(content->get<std::string>());
      } else if (content->is_array()) {
        // Content parts: only text ones, concatenated.
        for (size_t k = 0; k < content->size(); ++k) {
          const json& part = (*content)[k];
          const std::string pwhere = absl::StrCat(where, ".content[", k, "]");
          const json* type = part.is_object() && part.contains("type") ? &part["type"] : nullptr;
          if (type != nullptr && type->is_string() && *type != "text") {
            f.Fail(BadRequest(
                absl::StrCat("'", pwhere, "' is a content part of type '", type->get<std::string>(),
                             "', which is not supported: only text parts are"),
                pwhere));
            break;
          }
          if (!part.is_object() || type == nullptr || !part.contains("text") ||
              !part["text"].is_string()) {
            f.Fail(BadRequest(
                absl::StrCat("'", pwhere, "' must be {\"type\": \"text\", \"text\": <string>}; ",
                             "other content parts are not supported"),
                pwhere));
            break;
          }
          msg->mutable_content()->append(part["text"].get<std::string>());
        }
      } else {
        f.Fail(WrongType(where + ".content", "a string or a list of content parts", *content));
      }
    }
  }
  ParseTools(&f, &r);
  ParseTemplateInputs(&f, chat);
  r.include_reasoning = f.Bool("include_reasoning").value_or(true);
  if (auto v = f.Bool("add_generation_prompt")) chat->set_add_generation_prompt(*v);
  r.request.set_add_special_tokens(f.Bool("add_special_tokens").value_or(false));
  v1::SamplingParams* sp = r.request.mutable_sampling_params();
  // max_completion_tokens replaces the deprecated max_tokens.
  std::optional<int64_t> max_tokens = f.Count("max_completion_tokens");
  if (!max_tokens.has_value()) max_tokens = f.Count("max_tokens");
  if (max_tokens.has_value()) sp->set_max_tokens(static_cast<uint32_t>(*max_tokens));
  r.logprobs = f.Bool("logprobs").value_or(false);
  const std::optional<int64_t> top = f.Count("top_logprobs");
  if (top.has_value() && !r.logprobs && !f.failed()) {
    f.Fail(BadRequest("'top_logprobs' requires 'logprobs' to be true", "top_logprobs"));
  }
  if (r.logprobs) sp->set_logprobs(static_cast<uint32_t>(top.value_or(0)));
  return Finish(f, std::move(r));
}

int HttpStatusFromGrpc(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return 200;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::ALREADY_EXISTS:
      return 400;
    case grpc::StatusCode::UNAUTHENTICATED:
      return 401;
    case grpc::StatusCode::PERMISSION_DENIED:
      return 403;
    case grpc::StatusCode::NOT_FOUND:
      return 404;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return 429;
    case grpc::StatusCode::CANCELLED:
      return 499;
    case grpc::StatusCode::UNIMPLEMENTED:
      return 501;
    case grpc::StatusCode::UNAVAILABLE:
      return 503;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return 504;
    default:
      return 500;
  }
}

OpenAIError ErrorFromGrpc(const grpc::Status& status) {
  OpenAIError e;
  e.http_status = HttpStatusFromGrpc(status.error_code());
  e.message = status.error_message();
  switch (e.http_status) {
    case 400:
    case 404:
      e.type = "invalid_request_error";
      break;
    case 401:
      e.type = "authentication_error";
      e.code = "invalid_api_key";
      break;
    case 403:
      e.type = "permission_error";
      break;
    case 429:
      e.type = "rate_limit_error";
      e.code = "rate_limit_exceeded";
      break;
    case 501:
      e.type = "invalid_request_error";
      e.code = "not_implemented";
      break;
    case 503:
      e.type = "service_unavailable_error";
      break;
    default:
      e.type = "server_error";
  }
  return e;
}

OpenAIError ModelNotFound(const std::string& model) {
  return {.http_status = 404,
          .message = absl::StrCat("The model `", model, "` does not exist."),
          .type = "invalid_request_error",
          .param = "model",
          .code = "model_not_found"};
}

json FinishReasonJson(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_ABORT:
      return "abort";
    default:
      return nullptr;
  }
}

std::string ResponseId(Endpoint endpoint, const std::string& request_id) {
  return absl::StrCat(endpoint == Endpoint::kCompletions ? "cmpl-" : "chatcmpl-", request_id);
}

json UsageJson(const v1::Usage& usage) {
  json u = {{"prompt_tokens", usage.prompt_tokens()},
            {"completion_tokens", usage.completion_tokens()},
            {"total_tokens", usage.prompt_tokens() + usage.completion_tokens()}};
  if (usage.cached_prompt_tokens() > 0) {
    u["prompt_tokens_details"] = {{"cached_tokens", usage.cached_prompt_tokens()}};
  }
  return u;
}

json CompletionBody(const OpenAIRequest& req, const ResponseContext& ctx,
                    const v1::GenerateResponse& response) {
  const bool chat = req.endpoint == Endpoint::kChatCompletions;
  json choices = json::array();
  for (const v1::SequenceOutput& o : response.outputs()) {
    json c = {{"index", o.index()}};
    bool called = false;
    if (chat) {
      ReasoningSplit split;
      if (req.reasoning != ReasoningFormat::kNone) {
        split = SplitReasoning(StartsInReasoning(req), o.text());
      } else {
        split.content = o.text();
      }
      ParsedOutput parsed = ChatToolOutput(req, split.content);
      called = !parsed.calls.empty();
      // content null when the output was all calls or all reasoning, as vLLM's.
      const bool no_content = parsed.content.empty() && (called || split.reasoning.has_value());
      c["message"] = {{"role", "assistant"},
                      {"content", no_content ? json(nullptr) : json(parsed.content)}};
      if (req.reasoning != ReasoningFormat::kNone && req.include_reasoning) {
        c["message"]["reasoning_content"] =
            split.reasoning.has_value() ? json(*split.reasoning) : json(nullptr);
      }
      if (called) {
        json calls = json::array();
        for (const ParsedToolCall& call : parsed.calls) calls.push_back(ToolCallJson(call));
        c["message"]["tool_calls"] = std::move(calls);
      }
      c["logprobs"] = req.logprobs ? ChatLogprobs(o) : json(nullptr);
    } else {
      c["text"] = o.text();
      size_t offset = 0;
      c["logprobs"] = req.logprobs ? CompletionLogprobs(o, &offset) : json(nullptr);
    }
    c["finish_reason"] = chat ? ChatFinishReason(o, called) : FinishReasonJson(o.finish_reason());
    c["stop_reason"] = StopReason(o);
    choices.push_back(std::move(c));
  }
  return {{"id", ctx.id},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", ctx.created},
          {"model", ctx.model},
          {"choices", std::move(choices)},
          {"usage", UsageJson(response.usage())}};
}

std::vector<json> StreamChunks(const OpenAIRequest& req, const ResponseContext& ctx,
                               const v1::GenerateResponse& response, StreamState* state) {
  const bool chat = req.endpoint == Endpoint::kChatCompletions;
  std::vector<json> chunks;
  for (const v1::SequenceOutput& o : response.outputs()) {
    const size_t i = o.index();
    if (state->role_sent.size() <= i) state->role_sent.resize(i + 1, false);
    if (state->text_offset.size() <= i) state->text_offset.resize(i + 1, 0);
    json c = {{"index", i}};
    bool called = false;
    if (chat) {
      const bool final = o.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
      std::string text = o.text();
      std::string reasoning;
      if (req.reasoning != ReasoningFormat::kNone) {
        if (state->reasoning.size() <= i) state->reasoning.resize(i + 1);
        std::shared_ptr<ReasoningStreamParser>& parser = state->reasoning[i];
        if (parser == nullptr)
          parser = std::make_shared<ReasoningStreamParser>(StartsInReasoning(req));
        ReasoningStreamParser::Delta d = parser->Add(text);
        if (final) {
          ReasoningStreamParser::Delta rest = parser->Finish();
          d.reasoning += rest.reasoning;
          d.content += rest.content;
        }
        text = std::move(d.content);
        if (req.include_reasoning) reasoning = std::move(d.reasoning);
      }
      json delta = {{"content", text}};
      if (req.tool_choice != ToolChoice::kNone) {
        if (state->tools.size() <= i) state->tools.resize(i + 1);
        delta = ToolDelta(req, text, final, &state->tools[i]);
        called = state->tools[i].calls > 0;
      }
      if (!reasoning.empty()) {
        // A reasoning delta without content, as vLLM's, unless this chunk carries both.
        if (delta.contains("content") && delta["content"] == "") delta.erase("content");
        delta["reasoning_content"] = std::move(reasoning);
      }
      if (!state->role_sent[i]) {
        delta["role"] = "assistant";
        state->role_sent[i] = true;
      }
      c["delta"] = std::move(delta);
      c["logprobs"] = req.logprobs ? ChatLogprobs(o) : json(nullptr);
    } else {
      c["text"] = o.text();
      c["logprobs"] = req.logprobs ? CompletionLogprobs(o, &state->text_offset[i]) : json(nullptr);
    }
    c["finish_reason"] = chat ? ChatFinishReason(o, called) : FinishReasonJson(o.finish_reason());
    c["stop_reason"] = StopReason(o);
    chunks.push_back({{"id", ctx.id},
                      {"object", chat ? "chat.completion.chunk" : "text_completion"},
                      {"created", ctx.created},
                      {"model", ctx.model},
                      {"choices", json::array({std::move(c)})}});
  }
  return chunks;
}

json UsageChunk(const OpenAIRequest& req, const ResponseContext& ctx, const v1::Usage& usage) {
  const bool chat = req.endpoint == Endpoint::kChatCompletions;
  return {{"id", ctx.id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", ctx.created},
          {"model", ctx.model},
          {"choices", json::array()},
          {"usage", UsageJson(usage)}};
}

std::string SseEvent(const json& j) {
  return absl::StrCat("data: ", j.dump(-1, ' ', false, json::error_handler_t::replace), "\n\n");
}

}  // namespace llm::openai
