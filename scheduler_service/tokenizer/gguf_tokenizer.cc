#include "scheduler_service/tokenizer/gguf_tokenizer.h"

#include <algorithm>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "scheduler_service/tokenizer/tokenizer.h"

namespace llm {
namespace {

using json = nlohmann::json;

constexpr int kTypeNormal = 1, kTypeUnknown = 2, kTypeControl = 3, kTypeUserDefined = 4;

// Llama 3's split (llama.cpp LLAMA_VOCAB_PRE_TYPE_LLAMA3).
constexpr char kLlama3Regex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2's (LLAMA_VOCAB_PRE_TYPE_QWEN2): single digits.
constexpr char kQwen2Regex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

absl::Status Invalid(const GgufFile& f, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("gguf ", f.path(), ": ", std::string(what)));
}

// An array key's elements, each of type `elem` (or any integer type when elem is kI32).
absl::StatusOr<const std::vector<GgufValue>*> GetArray(const GgufFile& f, const char* key,
                                                       GgufValueType elem, bool required) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) {
    if (required) return Invalid(f, absl::StrCat("no ", key));
    return nullptr;
  }
  const bool ok = v->type == GgufValueType::kArray &&
                  (elem == GgufValueType::kI32
                       ? (v->array.empty() || v->array[0].is_int())
                       : (elem == GgufValueType::kF32 ? (v->array.empty() || v->array[0].is_float())
                                                      : v->elem_type == elem));
  if (!ok) {
    return Invalid(f, absl::StrCat(key, ": expected an array of ", GgufValueTypeName(elem),
                                   ", got ", GgufValueTypeName(v->type)));
  }
  return &v->array;
}

std::optional<int64_t> OptInt(const GgufFile& f, const char* key) {
  absl::StatusOr<int64_t> v = f.GetInt(key);
  if (!v.ok()) return std::nullopt;
  return *v;
}

bool OptBool(const GgufFile& f, const char* key, bool def) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr || !v->is_int()) return def;
  return v->i != 0;
}

size_t CodePoints(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// transformers' generate_merges (convert_slow_tokenizer.py) with scores: for each token in
// vocab order, each split into two tokens (at code point boundaries), ordered by the ids of
// the halves; then all of them stably ordered by score, longer left half, longer right half,
// each descending.
std::vector<std::pair<std::string, std::string>> MergesFromScores(
    const std::vector<std::string>& tokens, const std::vector<double>& scores,
    const absl::flat_hash_map<std::string, int>& vocab, const std::vector<bool>& kept) {
  struct M {
    int l, r;
    double score;
    size_t ll, lr;
  };
  std::vector<M> merges;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const absl::string_view s = tokens[t];
    if (!kept[t]) continue;  // a duplicate: Python's dict keeps one
    std::vector<M> local;
    for (size_t i = 1; i < s.size(); ++i) {
      if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) continue;
      auto l = vocab.find(s.substr(0, i)), r = vocab.find(s.substr(i));
      if (l == vocab.end() || r == vocab.end()) continue;
      local.push_back(
          {l->second, r->second, scores[t], CodePoints(l->first), CodePoints(r->first)});
    }
    std::stable_sort(local.begin(), local.end(),
                     [](const M& a, const M& b) { return a.l != b.l ? a.l < b.l : a.r < b.r; });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(), [](const M& a, const M& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.ll != b.ll) return a.ll > b.ll;
    return a.lr > b.lr;
  });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (const M& m : merges) out.emplace_back(tokens[m.l], tokens[m.r]);
  return out;
}

}  // namespace

absl::StatusOr<GgufTokenizerFiles> GgufTokenizerToJson(const GgufFile& f) {
  ASSIGN_OR_RETURN(std::string model, f.GetString("tokenizer.ggml.model"));
  if (model != "gpt2" && model != "llama") {
    return absl::UnimplementedError(absl::StrCat("gguf ", f.path(), ": tokenizer.ggml.model \"",
                                                 model,
                                                 "\" is not supported (gpt2: byte-level BPE; "
                                                 "llama: SentencePiece-style BPE)"));
  }
  ASSIGN_OR_RETURN(const std::vector<GgufValue>* tokens_v,
                   GetArray(f, "tokenizer.ggml.tokens", GgufValueType::kString, true));
  ASSIGN_OR_RETURN(const std::vector<GgufValue>* types_v,
                   GetArray(f, "tokenizer.ggml.token_type", GgufValueType::kI32, false));
  if (types_v != nullptr && types_v->size() != tokens_v->size()) {
    return Invalid(f, absl::StrCat("tokenizer.ggml.token_type has ", types_v->size(),
                                   " entries for ", tokens_v->size(), " tokens"));
  }
  const size_t n = tokens_v->size();
  std::vector<std::string> tokens(n);
  absl::flat_hash_map<std::string, int> vocab;
  vocab.reserve(n);
  json vocab_json = json::object();
  for (size_t i = 0; i < n; ++i) {
    tokens[i] = (*tokens_v)[i].s;
    vocab.insert_or_assign(tokens[i], static_cast<int>(i));  // a repeated token keeps its last id
  }
  // A repeated token appears once, with its last id.
  std::vector<bool> kept(n);
  for (size_t i = 0; i < n; ++i) {
    kept[i] = vocab.find(tokens[i])->second == static_cast<int>(i);
    if (kept[i]) vocab_json[tokens[i]] = i;
  }
  auto type_of = [&](size_t i) {
    return types_v != nullptr ? static_cast<int>((*types_v)[i].i) : kTypeNormal;
  };
  const std::optional<int64_t> bos = OptInt(f, "tokenizer.ggml.bos_token_id");
  const std::optional<int64_t> eos = OptInt(f, "tokenizer.ggml.eos_token_id");
  for (const auto& id : {bos, eos}) {
    if (id.has_value() && (*id < 0 || static_cast<size_t>(*id) >= n)) {
      return Invalid(f, absl::StrCat("token id ", *id, " (bos/eos) is outside the ", n, " tokens"));
    }
  }

  json tok = json::object();
  tok["version"] = "1.0";
  json added = json::array();
  // User-defined tokens are matched in the raw text, before the SentencePiece-style
  // normalizer turns spaces into U+2581, as llama.cpp and Gemma's tokenizer.json do (Gemma's
  // whitespace runs and "\n" are such tokens); in byte-level BPE vocabularies they are matched
  // after the normalizer, as transformers' added tokens are by default.
  const bool user_tokens_normalized = model == "gpt2";
  for (size_t i = 0; i < n; ++i) {
    const int t = type_of(i);
    if (t != kTypeControl && t != kTypeUnknown && t != kTypeUserDefined) continue;
    if (!kept[i] || tokens[i].empty()) continue;
    added.push_back({{"id", i},
                     {"content", tokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", t == kTypeUserDefined && user_tokens_normalized},
                     {"special", t != kTypeUserDefined}});
  }
  tok["added_tokens"] = added;
  json bpe = {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"ignore_merges", false}};
  bool add_bos_default = false;
  if (model == "gpt2") {
    std::string pre = "default";
    if (absl::StatusOr<std::string> p = f.GetString("tokenizer.ggml.pre"); p.ok()) pre = *p;
    const json byte_level_regex = {{"type", "ByteLevel"},
                                   {"add_prefix_space", false},
                                   {"trim_offsets", true},
                                   {"use_regex", true}};
    const json byte_level_plain = {{"type", "ByteLevel"},
                                   {"add_prefix_space", false},
                                   {"trim_offsets", true},
                                   {"use_regex", false}};
    auto split = [](const char* regex) {
      return json{{"type", "Split"},
                  {"pattern", {{"Regex", regex}}},
                  {"behavior", "Isolated"},
                  {"invert", false}};
    };
    tok["normalizer"] = nullptr;
    if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") {
      tok["pre_tokenizer"] = {{"type", "Sequence"},
                              {"pretokenizers", {split(kLlama3Regex), byte_level_plain}}};
      bpe["ignore_merges"] = true;
    } else if (pre == "qwen2") {
      tok["normalizer"] = {{"type", "NFC"}};
      tok["pre_tokenizer"] = {{"type", "Sequence"},
                              {"pretokenizers", {split(kQwen2Regex), byte_level_plain}}};
    } else if (pre == "smollm") {
      tok["pre_tokenizer"] = {
          {"type", "Sequence"},
          {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level_regex}}};
    } else if (pre == "gpt-2" || pre == "gpt2" || pre == "default" || pre == "olmo") {
      // llama.cpp splits "olmo" (OLMo's and OLMoE's GPT-NeoX-style vocabulary) as GPT-2's.
      tok["pre_tokenizer"] = byte_level_regex;
    } else {
      return absl::UnimplementedError(
          absl::StrCat("gguf ", f.path(), ": tokenizer.ggml.pre \"", pre,
                       "\" is not supported (llama-bpe, llama3, llama-v3, qwen2, smollm, gpt-2, "
                       "default, olmo)"));
    }
    ASSIGN_OR_RETURN(const std::vector<GgufValue>* merges_v,
                     GetArray(f, "tokenizer.ggml.merges", GgufValueType::kString, true));
    json merges = json::array();
    for (size_t i = 0; i < merges_v->size(); ++i) {
      const std::string& m = (*merges_v)[i].s;
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) {
        return Invalid(f, absl::StrCat("tokenizer.ggml.merges[", i, "] \"", m,
                                       "\" is not two tokens separated by a space"));
      }
      merges.push_back({m.substr(0, sp), m.substr(sp + 1)});
    }
    bpe["vocab"] = std::move(vocab_json);
    bpe["merges"] = std::move(merges);
    tok["decoder"] = {{"type", "ByteLevel"},
                      {"add_prefix_space", true},
                      {"trim_offsets", true},
                      {"use_regex", true}};
  } else {
    add_bos_default = true;
    ASSIGN_OR_RETURN(const std::vector<GgufValue>* scores_v,
                     GetArray(f, "tokenizer.ggml.scores", GgufValueType::kF32, true));
    if (scores_v->size() != n) {
      return Invalid(f, absl::StrCat("tokenizer.ggml.scores has ", scores_v->size(),
                                     " entries for ", n, " tokens"));
    }
    std::vector<double> scores(n);
    for (size_t i = 0; i < n; ++i) scores[i] = (*scores_v)[i].f;
    const bool prefix = OptBool(f, "tokenizer.ggml.add_space_prefix", true);
    const std::string kMeta = "\xE2\x96\x81";
    json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMeta}};
    if (prefix) {
      tok["normalizer"] = {{"type", "Sequence"},
                           {"normalizers", {{{"type", "Prepend"}, {"prepend", kMeta}}, replace}}};
    } else {
      tok["normalizer"] = replace;
    }
    tok["pre_tokenizer"] = nullptr;
    json merges = json::array();
    for (auto& [l, r] : MergesFromScores(tokens, scores, vocab, kept)) merges.push_back({l, r});
    const int64_t unk = OptInt(f, "tokenizer.ggml.unknown_token_id").value_or(0);
    if (unk >= 0 && static_cast<size_t>(unk) < n) bpe["unk_token"] = tokens[unk];
    bpe["fuse_unk"] = true;
    bpe["byte_fallback"] = true;
    bpe["vocab"] = std::move(vocab_json);
    bpe["merges"] = std::move(merges);
    json decoders = {{{"type", "Replace"}, {"pattern", {{"String", kMeta}}}, {"content", " "}},
                     {{"type", "ByteFallback"}},
                     {{"type", "Fuse"}}};
    if (prefix)
      decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    tok["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  }
  tok["model"] = std::move(bpe);
  tok["post_processor"] = nullptr;

  json config = json::object();
  if (bos.has_value()) config["bos_token"] = tokens[*bos];
  if (eos.has_value()) config["eos_token"] = tokens[*eos];
  config["add_bos_token"] = OptBool(f, "tokenizer.ggml.add_bos_token", add_bos_default);
  config["add_eos_token"] = OptBool(f, "tokenizer.ggml.add_eos_token", false);
  if (absl::StatusOr<std::string> t = f.GetString("tokenizer.chat_template"); t.ok()) {
    config["chat_template"] = *t;
  }
  json generation = json::object();
  if (bos.has_value()) generation["bos_token_id"] = *bos;
  if (eos.has_value()) generation["eos_token_id"] = *eos;

  GgufTokenizerFiles out;
  // Invalid UTF-8 in a token would make dump() throw; replace it as Python would decode.
  out.tokenizer_json = tok.dump(-1, ' ', false, json::error_handler_t::replace);
  out.tokenizer_config_json = config.dump(-1, ' ', false, json::error_handler_t::replace);
  out.generation_config_json = generation.dump();
  return out;
}

GgufChatInfo GgufChatInfoOf(const GgufFile& f) {
  GgufChatInfo info;
  if (absl::StatusOr<std::string> t = f.GetString("tokenizer.chat_template"); t.ok()) {
    info.chat_template = *t;
  }
  const GgufValue* tokens = f.Find("tokenizer.ggml.tokens");
  auto token = [&](const char* key) -> std::string {
    const std::optional<int64_t> id = OptInt(f, key);
    if (tokens == nullptr || !id.has_value() || *id < 0 ||
        static_cast<size_t>(*id) >= tokens->array.size()) {
      return "";
    }
    return tokens->array[*id].s;
  };
  info.bos_token = token("tokenizer.ggml.bos_token_id");
  info.eos_token = token("tokenizer.ggml.eos_token_id");
  return info;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& file) {
  ASSIGN_OR_RETURN(GgufTokenizerFiles files, GgufTokenizerToJson(file));
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      FromJson(files.tokenizer_json, files.tokenizer_config_json, files.generation_config_json);
  if (!tok.ok()) {
    return absl::Status(tok.status().code(),
                        absl::StrCat("gguf ", file.path(), ": ", tok.status().message()));
  }
  return tok;
}

}  // namespace llm
