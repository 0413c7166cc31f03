#include "runtime/forced_tokens.h"

#include <algorithm>
#include <utility>

namespace kiln {

ForcedContinuation::ForcedContinuation(ForcedTokens forced, std::vector<int32_t> stop_ids)
    : forced_(std::move(forced)), stop_ids_(std::move(stop_ids)) {
  if (forced_.tokens.empty()) return;
  deciding_ = !forced_.after.empty() && forced_.opener >= 0 && !forced_.at_once.empty();
  awaiting_ = !forced_.after.empty() && !deciding_;
  if (!awaiting_ && !deciding_) queue_ = forced_.tokens;
}

int32_t ForcedContinuation::choose(int32_t sampled) {
  if (next_ < queue_.size()) return queue_[next_++];
  if (deciding_) {
    deciding_ = false;
    awaiting_ = sampled == forced_.opener;
    if (!awaiting_) {  // no opener: `at_once` in its place
      queue_ = forced_.at_once;
      return queue_[next_++];
    }
  }
  if (!awaiting_) return sampled;
  if (std::find(stop_ids_.begin(), stop_ids_.end(), sampled) != stop_ids_.end()) {
    // the generation would end before `after`: it gets `after`, then the forced tokens
    awaiting_ = false;
    queue_ = forced_.after;
    queue_.insert(queue_.end(), forced_.tokens.begin(), forced_.tokens.end());
    return queue_[next_++];
  }
  tail_.push_back(sampled);
  if (tail_.size() > forced_.after.size()) tail_.erase(tail_.begin());
  if (tail_ == forced_.after) {
    awaiting_ = false;
    queue_ = forced_.tokens;
  }
  return sampled;
}

}  // namespace kiln
