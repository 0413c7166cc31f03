#include "runtime/prefix_cache.h"

#include <algorithm>

namespace kiln {

namespace {

bool is_prefix(std::span<const int32_t> prefix, std::span<const int32_t> tokens) {
  return prefix.size() <= tokens.size() && std::equal(prefix.begin(), prefix.end(), tokens.begin());
}

}  // namespace

PrefixCache::Hit PrefixCache::lookup(std::span<const int32_t> tokens, const std::function<bool(int64_t)>& usable) {
  auto best = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->tokens.size() >= tokens.size() || !is_prefix(it->tokens, tokens)) continue;
    if (usable && !usable(int64_t(it->tokens.size()))) continue;
    if (best == entries_.end() || it->tokens.size() > best->tokens.size()) best = it;
  }
  if (best == entries_.end()) return {};
  entries_.splice(entries_.begin(), entries_, best);
  return Hit{.tokens = int64_t(entries_.front().tokens.size()), .state = entries_.front().state.get()};
}

void PrefixCache::insert(std::span<const int32_t> tokens, const SequenceState& state, Backend& backend) {
  if (tokens.empty() || state.length() != int64_t(tokens.size())) return;
  const size_t size = state.bytes();
  if (size > budget_bytes_) return;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->tokens.size() == tokens.size() && std::equal(tokens.begin(), tokens.end(), it->tokens.begin())) {
      entries_.splice(entries_.begin(), entries_, it);
      return;
    }
  }
  while (bytes_ + size > budget_bytes_ && !entries_.empty()) {
    bytes_ -= entries_.back().bytes;
    entries_.pop_back();
  }
  entries_.push_front(Entry{.tokens = {tokens.begin(), tokens.end()}, .state = state.clone(backend), .bytes = size});
  bytes_ += size;
}

}  // namespace kiln
