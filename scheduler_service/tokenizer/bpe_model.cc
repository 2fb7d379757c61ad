#include "scheduler_service/tokenizer/bpe_model.h"

#include <cstdio>
#include <queue>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"
#include "scheduler_service/tokenizer/json_util.h"
#include "scheduler_service/tokenizer/string_view_compat.h"

namespace llm {
namespace {

absl::StatusOr<std::pair<std::string, std::string>> ParseMergeEntry(const nlohmann::json& m,
                                                                    size_t index) {
  if (m.is_string()) {
    const std::string line = m.get<std::string>();
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("BPE merge ", index, " '", line, "' is not two tokens"));
    }
    return std::make_pair(line.substr(0, space), line.substr(space + 1));
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    return std::make_pair(m[0].get<std::string>(), m[1].get<std::string>());
  }
  return absl::InvalidArgumentError(absl::StrCat("BPE merge ", index, " is malformed"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const nlohmann::json& spec) {
  if (!spec.is_object()) return absl::InvalidArgumentError("tokenizer.json has no 'model'");
  const std::string type = json_util::TypeOf(spec);
  if (type != "BPE" && !(type == "<none>" && spec.contains("merges"))) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported model type '", type, "' (supported: BPE)"));
  }
  // "" is what transformers writes when there is none (its GPT-2-style converters); HF
  // tokenizers reads it as none too.
  for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (auto it = spec.find(field); it != spec.end() && !it->is_null() &&
                                    !(it->is_string() && it->get<std::string>().empty())) {
      return absl::InvalidArgumentError(
          absl::StrCat("BPE model: ", field, " is not supported (got ", it->dump(), ")"));
    }
  }
  if (auto it = spec.find("dropout");
      it != spec.end() && !it->is_null() && !(it->is_number() && it->get<double>() == 0.0)) {
    return absl::InvalidArgumentError("BPE model: dropout is not supported");
  }
  std::unique_ptr<BpeModel> model(new BpeModel());
  auto vocab = spec.find("vocab");
  if (vocab == spec.end() || !vocab->is_object()) {
    return absl::InvalidArgumentError("BPE model: missing 'vocab'");
  }
  model->vocab_.reserve(vocab->size());
  for (const auto& [token, id_json] : vocab->items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() > (1 << 30)) {
      return absl::InvalidArgumentError(absl::StrCat("BPE vocab: bad id for '", token, "'"));
    }
    const auto id = id_json.get<TokenId>();
    model->vocab_[token] = id;
    if (static_cast<size_t>(id) >= model->id_to_token_.size()) {
      model->id_to_token_.resize(id + 1);
      model->has_id_.resize(id + 1, false);
    }
    model->id_to_token_[id] = token;
    model->has_id_[id] = true;
  }
  auto merges = spec.find("merges");
  if (merges != spec.end() && merges->is_array()) {
    model->merges_.reserve(merges->size());
    for (size_t i = 0; i < merges->size(); ++i) {
      ASSIGN_OR_RETURN(auto pair, ParseMergeEntry((*merges)[i], i));
      auto a = model->vocab_.find(pair.first);
      auto b = model->vocab_.find(pair.second);
      auto merged = model->vocab_.find(pair.first + pair.second);
      if (a == model->vocab_.end() || b == model->vocab_.end() || merged == model->vocab_.end()) {
        return absl::InvalidArgumentError(absl::StrCat("BPE merge ", i, " ('", pair.first, "', '",
                                                       pair.second, "') is out of the vocab"));
      }
      // A repeated pair keeps its last rank, as the Hugging Face library's map does.
      model->merges_.insert_or_assign(PairKey(a->second, b->second),
                                      Merge{static_cast<int32_t>(i), merged->second});
    }
  }
  model->byte_fallback_ = json_util::GetBool(spec, "byte_fallback", false);
  model->fuse_unk_ = json_util::GetBool(spec, "fuse_unk", false);
  model->ignore_merges_ = json_util::GetBool(spec, "ignore_merges", false);
  ASSIGN_OR_RETURN(std::string unk, json_util::GetString(spec, "unk_token", "BPE model"));
  if (!unk.empty()) {
    auto it = model->vocab_.find(unk);
    if (it == model->vocab_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("BPE model: unk_token '", unk, "' is not in the vocab"));
    }
    model->unk_id_ = it->second;
  }
  // Safe to cut before "▁" when no token has "▁" right after a character other than "▁".
  constexpr std::string_view kMetaspace = "\xE2\x96\x81";
  model->cut_before_metaspace_ = model->vocab_.contains(ToAbsl(kMetaspace));
  for (const auto& [token, id] : model->vocab_) {
    for (size_t pos = token.find(kMetaspace, 1); pos != std::string::npos;
         pos = token.find(kMetaspace, pos + 1)) {
      if (pos < kMetaspace.size() ||
          token.compare(pos - kMetaspace.size(), kMetaspace.size(), kMetaspace) != 0) {
        model->cut_before_metaspace_ = false;
      }
    }
    if (!model->cut_before_metaspace_) break;
  }
  model->all_bytes_present_ = true;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = model->vocab_.find(name);
    model->byte_ids_[b] = it == model->vocab_.end() ? -1 : it->second;
    if (it == model->vocab_.end()) model->all_bytes_present_ = false;
  }
  return model;
}

std::optional<TokenId> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(ToAbsl(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::set_cache_capacity(size_t capacity) {
  absl::MutexLock lock(&cache_mu_);
  cache_capacity_ = capacity;
  cache_.clear();
}

const BpeModel::Merge* BpeModel::FindMerge(TokenId a, TokenId b) const {
  auto it = merges_.find(PairKey(a, b));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::Tokenize(std::string_view word, std::vector<TokenId>* ids) const {
  if (!cut_before_metaspace_) {
    TokenizeWord(word, ids);
    return;
  }
  constexpr std::string_view kMetaspace = "\xE2\x96\x81";
  size_t begin = 0;
  size_t pos = word.find(kMetaspace, 1);
  while (pos != std::string_view::npos) {
    const bool after_metaspace =
        pos >= kMetaspace.size() &&
        word.substr(pos - kMetaspace.size(), kMetaspace.size()) == kMetaspace;
    if (!after_metaspace) {
      TokenizeWord(word.substr(begin, pos - begin), ids);
      begin = pos;
    }
    pos = word.find(kMetaspace, pos + kMetaspace.size());
  }
  TokenizeWord(word.substr(begin), ids);
}

void BpeModel::TokenizeWord(std::string_view word, std::vector<TokenId>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(ToAbsl(word)); it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    absl::ReaderMutexLock lock(&cache_mu_);
    if (auto it = cache_.find(ToAbsl(word)); it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids->size();
  MergeWord(word, ids);
  if (cacheable) {
    absl::MutexLock lock(&cache_mu_);
    if (cache_capacity_ == 0) return;
    if (cache_.size() >= cache_capacity_) cache_.clear();
    cache_.try_emplace(std::string(word), ids->begin() + first, ids->end());
  }
}

void BpeModel::MergeWord(std::string_view word, std::vector<TokenId>* ids) const {
  // The initial symbols: one per character, or per byte with byte fallback; unknown
  // characters become unk (consecutive ones fused with fuse_unk) or are dropped.
  struct Symbol {
    TokenId id;
    int32_t prev;
    int32_t next;
    bool removed;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&symbols](TokenId id) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, false});
  };
  bool pending_unk = false;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t len =
        std::min(Utf8CharLength(static_cast<unsigned char>(word[pos])), word.size() - pos);
    const std::string_view ch = word.substr(pos, len);
    pos += len;
    if (auto it = vocab_.find(ToAbsl(ch)); it != vocab_.end()) {
      if (pending_unk) add(*unk_id_);
      pending_unk = false;
      add(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (const char c : ch) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (const char c : ch) add(byte_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (!unk_id_.has_value()) continue;
    if (pending_unk && !fuse_unk_) add(*unk_id_);
    pending_unk = true;
  }
  if (pending_unk) add(*unk_id_);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Candidate {
    int32_t rank;
    int32_t pos;
    TokenId new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* m = FindMerge(symbols[i].id, symbols[i + 1].id)) {
      queue.push({m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.removed || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const Merge* m = FindMerge(left.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;  // stale entry
    left.id = top.new_id;
    right.removed = true;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const Merge* pm = FindMerge(symbols[left.prev].id, left.id)) {
        queue.push({pm->rank, left.prev, pm->new_id});
      }
    }
    if (left.next >= 0) {
      if (const Merge* nm = FindMerge(left.id, symbols[left.next].id)) {
        queue.push({nm->rank, top.pos, nm->new_id});
      }
    }
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

}  // namespace llm
