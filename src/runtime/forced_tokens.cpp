#include "runtime/forced_tokens.h"

#include <algorithm>
#include <utility>

namespace kiln {

namespace {

// Appends `token` to `tail`, kept as long as `marker`; true when the tail is then the marker.
bool ends_with(std::vector<int32_t>& tail, int32_t token, const std::vector<int32_t>& marker) {
  tail.push_back(token);
  if (tail.size() > marker.size()) tail.erase(tail.begin());
  return tail == marker;
}

}  // namespace

ForcedContinuation::ForcedContinuation(ForcedTokens forced, std::vector<int32_t> stop_ids)
    : forced_(std::move(forced)), stop_ids_(std::move(stop_ids)) {
  capped_ = forced_.reasoning_budget >= 0 && !forced_.reasoning_close.empty();
  reasoning_ = capped_ && forced_.reasoning_opener < 0;
  if (forced_.tokens.empty()) return;
  deciding_ = !forced_.after.empty() && forced_.opener >= 0 && !forced_.at_once.empty();
  awaiting_ = !forced_.after.empty() && !deciding_;
  if (!awaiting_ && !deciding_) queue_ = forced_.tokens;
}

int32_t ForcedContinuation::choose(int32_t sampled) {
  const int32_t token = pick(sampled);
  watch(token);
  return token;
}

int32_t ForcedContinuation::pick(int32_t sampled) {
  if (next_ < queue_.size()) return queue_[next_++];
  if (reasoning_ && reasoning_tokens_ >= forced_.reasoning_budget) {  // the budget is spent
    force(forced_.reasoning_close);
    return queue_[next_++];
  }
  if (deciding_) {
    deciding_ = false;
    awaiting_ = sampled == forced_.opener;
    if (!awaiting_) {  // no opener: `at_once` in its place
      force(forced_.at_once);
      return queue_[next_++];
    }
  }
  if (awaiting_ && std::find(stop_ids_.begin(), stop_ids_.end(), sampled) != stop_ids_.end()) {
    // the generation would end before `after`: it gets `after`, then the forced tokens
    awaiting_ = false;
    force(forced_.after);
    force(forced_.tokens);
    return queue_[next_++];
  }
  return sampled;
}

void ForcedContinuation::watch(int32_t token) {
  if (awaiting_ && ends_with(tail_, token, forced_.after)) {
    awaiting_ = false;
    force(forced_.tokens);
  }
  if (!capped_) return;
  if (!reasoning_) {
    if (token == forced_.reasoning_opener) {
      reasoning_ = true;
      reasoning_tail_.clear();
    }
    return;
  }
  ++reasoning_tokens_;
  if (ends_with(reasoning_tail_, token, forced_.reasoning_close)) reasoning_ = false;
}

void ForcedContinuation::force(const std::vector<int32_t>& tokens) {
  queue_.erase(queue_.begin(), queue_.begin() + long(next_));
  next_ = 0;
  queue_.insert(queue_.end(), tokens.begin(), tokens.end());
}

}  // namespace kiln
