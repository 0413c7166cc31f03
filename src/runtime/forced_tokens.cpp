#include "runtime/forced_tokens.h"

#include <utility>

namespace kiln {

ForcedContinuation::ForcedContinuation(ForcedTokens forced)
    : forced_(std::move(forced)), triggered_(forced_.after.empty()) {}

int32_t ForcedContinuation::choose(int32_t sampled) {
  if (next_ >= forced_.tokens.size()) return sampled;
  if (triggered_) return forced_.tokens[next_++];
  tail_.push_back(sampled);
  if (tail_.size() > forced_.after.size()) tail_.erase(tail_.begin());
  triggered_ = tail_ == forced_.after;
  return sampled;
}

}  // namespace kiln
