// A cache of sequence states keyed by the tokens they hold, so that a request whose prompt starts
// with tokens seen before (a chat's earlier turns, a shared system prompt) prefills only the rest.
//
// Entries are whole-state snapshots (SequenceState::clone): that serves attention caches and the
// Gated DeltaNet recurrent state alike, since a recurrent state cannot be truncated to a shorter
// prefix. The runtime therefore snapshots at block boundaries of a prompt as well as at its end.
// Least recently used entries are evicted to stay within a byte budget. Not thread-safe: one
// runtime thread owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <span>
#include <vector>

#include "layers/sequence_state.h"

namespace kiln {

class PrefixCache {
 public:
  explicit PrefixCache(size_t budget_bytes) : budget_bytes_(budget_bytes) {}

  struct Hit {
    int64_t tokens = 0;                    // how many leading tokens the snapshot holds
    const SequenceState* state = nullptr;  // valid until the next insert
  };
  // The longest entry whose tokens are a proper prefix of `tokens` (at least one token is left to
  // run, so the caller gets logits) and, when given, whose length `usable` accepts. tokens == 0
  // when nothing matches.
  Hit lookup(std::span<const int32_t> tokens, const std::function<bool(int64_t)>& usable = {});

  // Stores a snapshot of `state`, which holds exactly `tokens`. Does nothing when an entry for
  // these tokens exists or one snapshot alone exceeds the budget.
  void insert(std::span<const int32_t> tokens, const SequenceState& state, Backend& backend);

  size_t bytes() const { return bytes_; }
  size_t entries() const { return entries_.size(); }
  size_t budget_bytes() const { return budget_bytes_; }

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    std::unique_ptr<SequenceState> state;
    size_t bytes = 0;
  };
  size_t budget_bytes_;
  size_t bytes_ = 0;
  std::list<Entry> entries_;  // most recently used first
};

}  // namespace kiln
