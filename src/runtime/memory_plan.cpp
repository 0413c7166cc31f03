#include "runtime/memory_plan.h"

#include <algorithm>
#include <map>

namespace kiln {

namespace {

size_t layer_bytes(const LayerState& l) {
  return l.kv.k.stored_bytes() + l.kv.v.stored_bytes() + l.kv.slot_pos.nbytes() + l.conv.nbytes() +
         l.recurrent.nbytes();
}

// The activations a step holds at its peak beyond what was live before it: one sequence's prefill
// chunk beside one decode row of each of batch - 1 others.
Result<size_t> step_workspace(Model& model, int64_t chunk, int64_t batch) {
  Backend& backend = model.backend();
  std::vector<std::unique_ptr<SequenceState>> states;
  for (int64_t b = 0; b < batch; ++b) {
    KILN_ASSIGN(auto state, model.new_sequence(chunk + 1));
    states.push_back(std::move(state));
  }
  const std::vector<int32_t> ids(size_t(chunk), 0);
  std::vector<SeqChunk> chunks;
  for (int64_t b = 0; b < batch; ++b)
    chunks.push_back(SeqChunk{.state = states[size_t(b)].get(),
                              .tokens = std::span<const int32_t>(ids.data(), b == 0 ? size_t(chunk) : 1)});
  const size_t before = backend.live_memory_bytes();
  backend.reset_peak_memory();
  KILN_ASSIGN(Tensor logits, model.forward(chunks, LogitRows::last));
  return backend.peak_memory_bytes() - before;
}

}  // namespace

size_t MemoryPlan::bytes_per_token() const {
  size_t total = 0;
  for (const auto& s : states) total += s.bytes_per_token;
  return total;
}

size_t MemoryPlan::bytes_per_sequence() const {
  size_t total = 0;
  for (const auto& s : states) total += s.bytes_per_sequence;
  return total;
}

size_t MemoryPlan::sequence_bytes(int64_t context) const {
  size_t total = 0;
  for (const auto& s : states) {
    // a ring no longer than the context: a short sequence's sliding ring has only its slots
    const size_t fixed =
        s.ring > context ? s.bytes_per_sequence / size_t(s.ring) * size_t(context) : s.bytes_per_sequence;
    total += fixed + size_t(context) * s.bytes_per_token;
  }
  return total;
}

size_t MemoryPlan::step_workspace(int64_t batch) const {
  const double slope = double(step_workspace_64) - double(step_workspace_1);
  return size_t(std::max(0.0, double(step_workspace_1) + slope * double(batch - 1) / 63.0));
}

size_t MemoryPlan::total(int64_t context, int64_t batch) const {
  return weights + prompt_cache + step_workspace(batch) + size_t(batch) * sequence_bytes(context);
}

namespace {

// The largest n in [0, limit] with fits(n), for fits true up to some n and false after.
template <typename Fits>
int64_t largest(int64_t limit, Fits fits) {
  int64_t lo = 0, hi = limit;
  if (fits(hi)) return hi;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace

int64_t MemoryPlan::max_context(size_t budget, int64_t batch) const {
  if (batch <= 0 || total(1, batch) > budget) return 0;
  return largest(max_positions > 0 ? max_positions : int64_t(1) << 30,
                 [&](int64_t context) { return total(context, batch) <= budget; });
}

int64_t MemoryPlan::max_batch(size_t budget, int64_t context) const {
  if (total(context, 1) > budget) return 0;
  return largest(int64_t(1) << 20, [&](int64_t batch) { return total(context, batch) <= budget; });
}

Result<MemoryPlan> plan_memory(Model& model, size_t weights, int64_t prefill_chunk, size_t prompt_cache_bytes) {
  MemoryPlan plan;
  plan.weights = weights;
  plan.prompt_cache = prompt_cache_bytes;
  plan.max_positions = model.info().max_position_embeddings;
  plan.prefill_chunk = std::max<int64_t>(1, std::min(prefill_chunk, model.max_chunk_tokens()));

  // states at two lengths past every fixed ring: what differs grows with the context
  const int64_t c1 = int64_t(1) << 22, c2 = int64_t(1) << 23;
  KILN_ASSIGN(auto s1, model.new_sequence(c1));
  KILN_ASSIGN(auto s2, model.new_sequence(c2));
  std::map<std::string, LayerStatePlan> kinds;
  for (size_t i = 0; i < s1->layers().size(); ++i) {
    const LayerState& a = s1->layers()[i];
    const LayerState& b = s2->layers()[i];
    const size_t b1 = layer_bytes(a), b2 = layer_bytes(b);
    if (b1 == 0) continue;  // a layer reading another's cache
    const std::string kind = a.kv.capacity == 0 ? "recurrent" : b2 != b1 ? "full attention" : "sliding window";
    LayerStatePlan& k = kinds[kind];
    k.kind = kind;
    ++k.layers;
    const size_t per_token = (b2 - b1) / size_t(c2 - c1);
    k.bytes_per_token += per_token;
    k.bytes_per_sequence += b1 - per_token * size_t(c1);
    if (kind == "sliding window") k.ring = std::max(k.ring, a.kv.capacity);
  }
  for (const char* kind : {"full attention", "sliding window", "recurrent"})
    if (kinds.count(kind)) plan.states.push_back(kinds[kind]);
  s1.reset();
  s2.reset();

  KILN_ASSIGN(plan.step_workspace_1, step_workspace(model, plan.prefill_chunk, 1));
  KILN_ASSIGN(plan.step_workspace_64, step_workspace(model, plan.prefill_chunk, 64));
  return plan;
}

}  // namespace kiln
