#include "structured/pushdown_parser.h"

namespace llm::structured {

void StackPool::Truncate(int32_t size) {
  while (static_cast<int32_t>(nodes_.size()) > size) {
    const Node& n = nodes_.back();
    index_.erase((static_cast<uint64_t>(static_cast<uint32_t>(n.pos)) << 32) |
                 static_cast<uint32_t>(n.parent));
    nodes_.pop_back();
  }
}

void PushdownParser::BeginStep(ParseState* out) {
  out->tops.clear();
  out->can_end = false;
  if (++step_ == 0) {  // wrapped: forget every mark
    seen_.assign(seen_.size(), 0);
    step_ = 1;
  }
}

void PushdownParser::Start(int32_t pos, int32_t parent, ParseState* out) {
  BeginStep(out);
  Close(pool_->Intern(pos, parent), out);
}

void PushdownParser::Advance(const ParseState& from, uint8_t byte, ParseState* out) {
  BeginStep(out);
  for (int32_t top : from.tops) {
    const StackPool::Node n = pool_->node(top);
    for (const auto& e : automaton_->byte_edges(n.pos)) {
      if (e.bytes.Contains(byte)) Close(pool_->Intern(e.target, n.parent), out);
    }
  }
}

void PushdownParser::Close(int32_t node, ParseState* out) {
  work_.push_back(node);
  while (!work_.empty()) {
    const int32_t id = work_.back();
    work_.pop_back();
    if (static_cast<size_t>(id) >= seen_.size()) seen_.resize(pool_->size() * 2 + 64, 0);
    if (seen_[id] == step_) continue;
    seen_[id] = step_;
    const StackPool::Node n = pool_->node(id);
    if (!automaton_->byte_edges(n.pos).empty()) out->tops.push_back(id);
    for (const auto& e : automaton_->rule_edges(n.pos)) {
      const int32_t ret = pool_->Intern(e.target, n.parent);
      work_.push_back(pool_->Intern(automaton_->rule_start(e.rule), ret));
    }
    if (automaton_->accepting(n.pos)) {
      if (n.parent == StackPool::kBottom) {
        out->can_end = true;
      } else {
        work_.push_back(n.parent);
      }
    }
  }
}

}  // namespace llm::structured
