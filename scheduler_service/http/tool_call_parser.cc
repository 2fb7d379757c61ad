#include "scheduler_service/http/tool_call_parser.h"

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "scheduler_service/http/partial_marker.h"

namespace llm::openai {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kHermesStart = "<tool_call>";
constexpr std::string_view kHermesEnd = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralStart = "[TOOL_CALLS]";

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsAsciiSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsAsciiSpace(s.back())) s.remove_suffix(1);
  return s;
}

bool AllSpace(std::string_view s) { return Trim(s).empty(); }

std::string_view StartMarker(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return kHermesStart;
    case ToolCallFormat::kLlama3Json:
      return kPythonTag;
    case ToolCallFormat::kMistral:
      return kMistralStart;
    default:
      return {};
  }
}

// {"name": <string>, <args_key>: <object or JSON text>} as a call; false: not one.
bool CallFromJson(const Json& j, std::initializer_list<const char*> args_keys,
                  ParsedToolCall* call) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  call->name = j["name"].get<std::string>();
  call->arguments = "{}";
  for (const char* key : args_keys) {
    auto it = j.find(key);
    if (it == j.end()) continue;
    if (it->is_object()) {
      call->arguments = it->dump();
    } else if (it->is_string()) {
      call->arguments = it->get<std::string>();
    } else {
      return false;
    }
    break;
  }
  return true;
}

// The JSON objects in `text`, separated by whitespace or ';' (Llama 3's parallel calls);
// false when there is anything else.
bool SplitObjects(std::string_view text, std::vector<std::string_view>* out) {
  size_t i = 0;
  while (true) {
    while (i < text.size() && (IsAsciiSpace(text[i]) || text[i] == ';')) ++i;
    if (i == text.size()) return !out->empty();
    if (text[i] != '{') return false;
    const size_t start = i;
    int depth = 0;
    bool in_string = false;
    for (; i < text.size(); ++i) {
      const char c = text[i];
      if (in_string) {
        if (c == '\\') {
          ++i;
        } else if (c == '"') {
          in_string = false;
        }
      } else if (c == '"') {
        in_string = true;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (--depth == 0) break;
      }
    }
    if (i >= text.size()) return false;
    out->push_back(text.substr(start, ++i - start));
  }
}

// Mistral's newer form (tokenizers v11 on): name[ARGS]{...}, further calls each after another
// [TOOL_CALLS]; false when any part is not one.
bool ParseMistralNamedCalls(std::string_view payload, std::vector<ParsedToolCall>* found) {
  constexpr std::string_view kArgs = "[ARGS]";
  while (true) {
    const size_t next = payload.find(kMistralStart);
    const std::string_view call = payload.substr(0, next);
    const size_t args = call.find(kArgs);
    if (args == std::string_view::npos) return false;
    const std::string_view name = Trim(call.substr(0, args));
    if (name.empty() || name.find_first_of(" \n\t\r{[\"") != std::string_view::npos) return false;
    const Json j = Json::parse(Trim(call.substr(args + kArgs.size())), nullptr,
                               /*allow_exceptions=*/false);
    if (!j.is_object()) return false;
    found->push_back({std::string(name), j.dump()});
    if (next == std::string_view::npos) return true;
    payload.remove_prefix(next + kMistralStart.size());
  }
}

}  // namespace

ToolCallFormat ToolCallFormatOfTemplate(std::string_view source) {
  if (source.find(kHermesStart) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (source.find(kMistralStart) != std::string_view::npos) return ToolCallFormat::kMistral;
  if (source.find(kPythonTag) != std::string_view::npos ||
      (source.find("ipython") != std::string_view::npos &&
       source.find("\"parameters\"") != std::string_view::npos)) {
    return ToolCallFormat::kLlama3Json;
  }
  return ToolCallFormat::kNone;
}

const char* ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kMistral:
      return "mistral";
    default:
      return "none";
  }
}

bool ToolCallStreamParser::ParsePayload(std::string_view payload,
                                        std::vector<ParsedToolCall>* calls) const {
  std::vector<ParsedToolCall> found;
  if (format_ == ToolCallFormat::kLlama3Json) {
    std::vector<std::string_view> objects;
    if (!SplitObjects(payload, &objects)) return false;
    for (std::string_view o : objects) {
      const Json j = Json::parse(o, nullptr, /*allow_exceptions=*/false);
      if (!CallFromJson(j, {"parameters", "arguments"}, &found.emplace_back())) return false;
    }
  } else if (format_ == ToolCallFormat::kMistral && !Trim(payload).starts_with('[') &&
             !Trim(payload).starts_with('{')) {
    if (!ParseMistralNamedCalls(payload, &found)) return false;
  } else {
    const Json j = Json::parse(Trim(payload), nullptr, /*allow_exceptions=*/false);
    if (format_ == ToolCallFormat::kMistral && j.is_array()) {
      if (j.empty()) return false;
      for (const Json& e : j) {
        if (!CallFromJson(e, {"arguments"}, &found.emplace_back())) return false;
      }
    } else if (!CallFromJson(j, {"arguments"}, &found.emplace_back())) {
      return false;
    }
  }
  for (ParsedToolCall& c : found) calls->push_back(std::move(c));
  return true;
}

void ToolCallStreamParser::Drain(bool final, Delta* out) {
  const std::string_view start = StartMarker(format_);
  while (true) {
    if (!in_call_) {
      if (start.empty()) {
        out->content += pending_;
        pending_.clear();
        return;
      }
      // Llama 3 writes a call as the whole output, without a marker.
      if (format_ == ToolCallFormat::kLlama3Json && !seen_text_ && calls_ == 0) {
        const size_t first = pending_.find_first_not_of(" \n\t\r");
        if (first == std::string::npos && !final) return;
        if (first != std::string::npos && pending_[first] == '{') {
          pending_.erase(0, first);
          in_call_ = true;
          marker_.clear();
          continue;
        }
      }
      const size_t at = pending_.find(start);
      if (at != std::string::npos) {
        std::string_view before = std::string_view(pending_).substr(0, at);
        while (!before.empty() && IsAsciiSpace(before.back())) before.remove_suffix(1);
        if (!seen_text_) before = Trim(before);
        if (!before.empty()) {
          out->content += before;
          seen_text_ = true;
        }
        pending_.erase(0, at + start.size());
        in_call_ = true;
        marker_ = std::string(start);
        continue;
      }
      // Held back: what may become the marker, and trailing whitespace (dropped if a call
      // follows).
      size_t keep = final ? 0 : PartialMarker(pending_, start);
      while (!final && keep < pending_.size() &&
             IsAsciiSpace(pending_[pending_.size() - keep - 1])) {
        ++keep;
      }
      std::string_view emit = std::string_view(pending_).substr(0, pending_.size() - keep);
      if (final && calls_ > 0 && AllSpace(emit)) emit = {};
      if (!seen_text_) {
        while (!emit.empty() && IsAsciiSpace(emit.front())) emit.remove_prefix(1);
      }
      if (!emit.empty()) {
        out->content += emit;
        seen_text_ = true;
      }
      pending_.erase(0, pending_.size() - keep);
      return;
    }
    if (format_ == ToolCallFormat::kHermes) {
      const size_t end = pending_.find(kHermesEnd);
      if (end != std::string::npos) {
        const std::string payload = pending_.substr(0, end);
        if (ParsePayload(payload, &out->calls)) {
          ++calls_;
        } else {
          out->content += marker_ + payload + std::string(kHermesEnd);
          seen_text_ = true;
        }
        pending_.erase(0, end + kHermesEnd.size());
        in_call_ = false;
        continue;
      }
    }
    if (!final) return;
    // The payload runs to the end of the output (or a block was not closed).
    if (ParsePayload(pending_, &out->calls)) {
      ++calls_;
    } else {
      out->content += marker_ + pending_;
    }
    pending_.clear();
    in_call_ = false;
    return;
  }
}

ToolCallStreamParser::Delta ToolCallStreamParser::Add(std::string_view text) {
  Delta out;
  pending_.append(text);
  Drain(/*final=*/false, &out);
  return out;
}

ToolCallStreamParser::Delta ToolCallStreamParser::Finish() {
  Delta out;
  Drain(/*final=*/true, &out);
  return out;
}

ParsedOutput ParseToolCalls(ToolCallFormat format, std::string_view text) {
  ToolCallStreamParser parser(format);
  ToolCallStreamParser::Delta a = parser.Add(text);
  ToolCallStreamParser::Delta b = parser.Finish();
  ParsedOutput out;
  out.content = a.content + b.content;
  out.calls = std::move(a.calls);
  for (ParsedToolCall& c : b.calls) out.calls.push_back(std::move(c));
  if (!out.calls.empty()) out.content = std::string(Trim(out.content));
  return out;
}

}  // namespace llm::openai
