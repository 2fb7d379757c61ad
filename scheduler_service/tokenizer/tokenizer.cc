#include "scheduler_service/tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/gguf.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"
#include "scheduler_service/tokenizer/json_util.h"
#include "scheduler_service/tokenizer/string_view_compat.h"

namespace llm {
namespace {

using nlohmann::json;

absl::StatusOr<json> ParseJson(std::string_view text, std::string_view name) {
  json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(name), " is not valid JSON"));
  }
  return parsed;
}

// A file's contents; nullopt when it does not exist.
absl::StatusOr<std::optional<std::string>> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::optional<std::string>();
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return std::optional<std::string>(ss.str());
}

// The prefix and suffix ids of a post_processor for a single sequence.
absl::Status ParsePostProcessor(const json& spec, const AddedVocabulary& added,
                                const BpeModel& model, std::vector<TokenId>* prefix,
                                std::vector<TokenId>* suffix, bool* found) {
  if (spec.is_null()) return absl::OkStatus();
  const std::string type = json_util::TypeOf(spec);
  if (type == "ByteLevel") return absl::OkStatus();  // offsets only
  if (type == "Sequence") {
    for (const auto& sub : spec.value("processors", json::array())) {
      RETURN_IF_ERROR(ParsePostProcessor(sub, added, model, prefix, suffix, found));
    }
    return absl::OkStatus();
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    // "cls": [token, id], "sep": [token, id]: <cls> $A <sep>.
    const json cls = spec.value("cls", json()), sep = spec.value("sep", json());
    if (!cls.is_array() || cls.size() != 2 || !sep.is_array() || sep.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat("post_processor ", type, ": bad cls/sep"));
    }
    *prefix = {cls[1].get<TokenId>()};
    *suffix = {sep[1].get<TokenId>()};
    *found = true;
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported post_processor type '", type,
        "' (supported: TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, "
        "Sequence)"));
  }
  const json single = spec.value("single", json::array());
  const json specials = spec.value("special_tokens", json::object());
  std::vector<TokenId> before, after;
  bool seen_sequence = false;
  for (const auto& item : single) {
    if (item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken")) {
      return absl::InvalidArgumentError("post_processor TemplateProcessing: bad 'single' item");
    }
    const std::string name = item["SpecialToken"].value("id", "");
    std::vector<TokenId> ids;
    if (auto it = specials.find(name); it != specials.end() && it->contains("ids")) {
      ids = (*it)["ids"].get<std::vector<TokenId>>();
    } else if (const AddedToken* t = added.FindByContent(name)) {
      ids = {t->id};
    } else if (auto id = model.TokenToId(name)) {
      ids = {*id};
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("post_processor TemplateProcessing: special token '", name, "' has no id"));
    }
    auto& out = seen_sequence ? after : before;
    out.insert(out.end(), ids.begin(), ids.end());
  }
  *prefix = std::move(before);
  *suffix = std::move(after);
  *found = true;
  return absl::OkStatus();
}

// A token named in tokenizer_config.json: a string or an AddedToken object.
std::optional<std::string> ConfigToken(const json& config, std::string_view key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDirectory(const std::string& dir) {
  if (dir.ends_with(".gguf")) {
    ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(dir));
    return FromGguf(*file);
  }
  const std::string path = dir + "/tokenizer.json";
  ASSIGN_OR_RETURN(std::optional<std::string> tokenizer_json, ReadFile(path));
  if (!tokenizer_json.has_value()) {
    return absl::NotFoundError(absl::StrCat("no tokenizer.json in ", dir));
  }
  ASSIGN_OR_RETURN(std::optional<std::string> config, ReadFile(dir + "/tokenizer_config.json"));
  ASSIGN_OR_RETURN(std::optional<std::string> generation,
                   ReadFile(dir + "/generation_config.json"));
  auto tokenizer = FromJson(*tokenizer_json, config.value_or(""), generation.value_or(""));
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat(dir, ": ", tokenizer.status().message()));
  }
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(
    std::string_view tokenizer_json, std::string_view tokenizer_config_json,
    std::string_view generation_config_json) {
  // A field of the wrong JSON type makes nlohmann::json throw; that is a bad file too.
  try {
    return FromJsonOrThrow(tokenizer_json, tokenizer_config_json, generation_config_json);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("malformed tokenizer files: ", e.what()));
  }
}

namespace {

// The spelling a decoder undoes: ByteLevel anywhere in it, or SentencePiece's "▁" and byte
// fallback; a decoder of neither (or none) leaves token strings as they are.
Tokenizer::TokenSpelling SpellingOf(const json& decoder) {
  using Spelling = Tokenizer::TokenSpelling;
  if (!decoder.is_object()) return Spelling::kRaw;
  const std::string type = decoder.value("type", "");
  if (type == "ByteLevel") return Spelling::kByteLevel;
  if (type == "Metaspace" || type == "ByteFallback") return Spelling::kSentencePiece;
  if (type == "Replace") {
    const json& pattern = decoder.value("pattern", json());
    if (pattern.is_object() && pattern.value("String", "") == "\xE2\x96\x81" /* ▁ */) {
      return Spelling::kSentencePiece;
    }
  }
  if (type == "Sequence") {
    Spelling found = Spelling::kRaw;
    for (const json& d : decoder.value("decoders", json::array())) {
      const Spelling s = SpellingOf(d);
      if (s == Spelling::kByteLevel) return s;
      if (s != Spelling::kRaw) found = s;
    }
    return found;
  }
  return Spelling::kRaw;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJsonOrThrow(
    std::string_view tokenizer_json, std::string_view tokenizer_config_json,
    std::string_view generation_config_json) {
  ASSIGN_OR_RETURN(json spec, ParseJson(tokenizer_json, "tokenizer.json"));
  if (!spec.is_object()) return absl::InvalidArgumentError("tokenizer.json is not an object");
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  ASSIGN_OR_RETURN(tok->normalizer_, ParseNormalizer(spec.value("normalizer", json())));
  ASSIGN_OR_RETURN(tok->pre_tokenizer_, ParsePreTokenizer(spec.value("pre_tokenizer", json())));
  ASSIGN_OR_RETURN(tok->model_, BpeModel::FromJson(spec.value("model", json())));
  ASSIGN_OR_RETURN(tok->decoder_, ParseDecoder(spec.value("decoder", json())));
  tok->token_spelling_ = SpellingOf(spec.value("decoder", json()));

  std::vector<AddedToken> added;
  for (const auto& t : spec.value("added_tokens", json::array())) {
    if (!t.contains("id") || !t.contains("content") || !t["content"].is_string()) {
      return absl::InvalidArgumentError("tokenizer.json: malformed added_tokens entry");
    }
    added.push_back({t["id"].get<TokenId>(), t["content"].get<std::string>(),
                     t.value("special", false), t.value("lstrip", false), t.value("rstrip", false),
                     t.value("normalized", false), t.value("single_word", false)});
  }
  tok->vocab_size_ = tok->model_->vocab_size();
  for (const AddedToken& t : added) tok->vocab_size_ = std::max(tok->vocab_size_, t.id + 1);
  tok->added_ = AddedVocabulary(std::move(added));

  bool has_post_processor = false;
  RETURN_IF_ERROR(ParsePostProcessor(spec.value("post_processor", json()), tok->added_,
                                     *tok->model_, &tok->prefix_ids_, &tok->suffix_ids_,
                                     &has_post_processor));

  json config = json::object(), generation = json::object();
  if (!tokenizer_config_json.empty()) {
    ASSIGN_OR_RETURN(config, ParseJson(tokenizer_config_json, "tokenizer_config.json"));
  }
  if (!generation_config_json.empty()) {
    ASSIGN_OR_RETURN(generation, ParseJson(generation_config_json, "generation_config.json"));
  }
  std::optional<TokenId> config_bos, config_eos;
  if (auto name = ConfigToken(config, "bos_token")) config_bos = tok->TokenToId(*name);
  if (auto name = ConfigToken(config, "eos_token")) config_eos = tok->TokenToId(*name);

  tok->bos_token_id_ = config_bos;
  if (auto it = generation.find("bos_token_id");
      it != generation.end() && it->is_number_integer()) {
    tok->bos_token_id_ = it->get<TokenId>();
  }
  if (auto it = generation.find("eos_token_id"); it != generation.end()) {
    if (it->is_number_integer()) tok->eos_token_ids_.push_back(it->get<TokenId>());
    if (it->is_array()) {
      for (const auto& id : *it) {
        if (id.is_number_integer()) tok->eos_token_ids_.push_back(id.get<TokenId>());
      }
    }
  }
  if (config_eos.has_value() && std::find(tok->eos_token_ids_.begin(), tok->eos_token_ids_.end(),
                                          *config_eos) == tok->eos_token_ids_.end()) {
    tok->eos_token_ids_.push_back(*config_eos);
  }
  if (!has_post_processor) {
    if (config.value("add_bos_token", false) && tok->bos_token_id_.has_value()) {
      tok->prefix_ids_ = {*tok->bos_token_id_};
    }
    if (config.value("add_eos_token", false) && config_eos.has_value()) {
      tok->suffix_ids_ = {*config_eos};
    }
  }
  return tok;
}

void Tokenizer::EncodePiece(std::string_view text, bool at_start, std::vector<TokenId>* ids) const {
  if (pre_tokenizer_ == nullptr) {
    model_->Tokenize(text, ids);
    return;
  }
  pre_tokenizer_->PreTokenize({std::string(text), at_start},
                              [this, ids](PreToken word) { model_->Tokenize(word.text, ids); });
}

std::vector<TokenId> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::string repaired;
  if (!IsValidUtf8(text)) {
    repaired = Utf8Lossy(text);
    text = repaired;
  }
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids.insert(ids.end(), prefix_ids_.begin(), prefix_ids_.end());
  for (const AddedVocabulary::Piece& piece : added_.Split(text, /*normalized=*/false)) {
    if (piece.id.has_value()) {
      ids.push_back(*piece.id);
      continue;
    }
    const std::string_view raw = text.substr(piece.begin, piece.end - piece.begin);
    const bool at_start = piece.begin == 0;
    if (normalizer_ == nullptr) {
      for (const auto& sub : added_.Split(raw, /*normalized=*/true)) {
        if (sub.id.has_value()) {
          ids.push_back(*sub.id);
        } else {
          EncodePiece(raw.substr(sub.begin, sub.end - sub.begin), at_start && sub.begin == 0, &ids);
        }
      }
      continue;
    }
    std::string normalized(raw);
    normalizer_->Normalize(&normalized);
    for (const auto& sub : added_.Split(normalized, /*normalized=*/true)) {
      if (sub.id.has_value()) {
        ids.push_back(*sub.id);
      } else {
        EncodePiece(std::string_view(normalized).substr(sub.begin, sub.end - sub.begin),
                    at_start && sub.begin == 0, &ids);
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

std::string Tokenizer::Decode(std::span<const TokenId> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const TokenId id : ids) {
    if (const AddedToken* t = added_.FindById(id)) {
      if (!(skip_special_tokens && t->special)) tokens.push_back(t->content);
    } else if (const std::string* s = model_->IdToToken(id)) {
      if (skip_special_tokens) {
        const AddedToken* same = added_.FindByContent(*s);
        if (same != nullptr && same->special) continue;
      }
      tokens.push_back(*s);
    }
  }
  if (decoder_ == nullptr) return absl::StrJoin(tokens, " ");
  return decoder_->Decode(std::move(tokens));
}

std::vector<std::string> Tokenizer::PreTokenize(std::string_view text) const {
  std::string repaired = Utf8Lossy(text);
  if (normalizer_ != nullptr) normalizer_->Normalize(&repaired);
  std::vector<PreToken> words;
  if (!repaired.empty()) words.push_back({std::move(repaired), true});
  if (pre_tokenizer_ != nullptr) pre_tokenizer_->PreTokenizeAll(&words);
  std::vector<std::string> out;
  out.reserve(words.size());
  for (PreToken& w : words) out.push_back(std::move(w.text));
  return out;
}

std::optional<TokenId> Tokenizer::TokenToId(std::string_view token) const {
  if (const AddedToken* t = added_.FindByContent(token)) return t->id;
  return model_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(TokenId id) const {
  if (const AddedToken* t = added_.FindById(id)) return t->content;
  if (const std::string* s = model_->IdToToken(id)) return *s;
  return std::nullopt;
}

bool Tokenizer::IsSpecialToken(TokenId id) const {
  const AddedToken* t = added_.FindById(id);
  return t != nullptr && t->special;
}

}  // namespace llm
