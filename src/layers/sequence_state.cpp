#include "layers/sequence_state.h"

#include <cassert>

namespace kiln {

namespace {

void copy_if(Backend& backend, const Tensor& src, Tensor& dst) {
  if (src.numel()) backend.copy(src, dst);
}

Tensor alloc_like(Backend& backend, const Tensor& t) {
  return t.numel() ? backend.alloc(t.dtype(), t.shape()) : Tensor();
}

}  // namespace

size_t SequenceState::bytes() const {
  size_t total = 0;
  for (const auto& l : layers_)
    total += l.kv.k.nbytes() + l.kv.v.nbytes() + l.kv.slot_pos.nbytes() + l.conv.nbytes() + l.recurrent.nbytes();
  return total;
}

void SequenceState::reset(Backend& backend) {
  for (auto& l : layers_) {
    if (l.kv.capacity) backend.fill(l.kv.slot_pos, -1.0f);
    if (l.conv.numel()) backend.fill(l.conv, 0.0f);
    if (l.recurrent.numel()) backend.fill(l.recurrent, 0.0f);
  }
  length_ = 0;
  rope_offset_ = 0;
}

std::unique_ptr<SequenceState> SequenceState::clone(Backend& backend) const {
  std::vector<LayerState> copies;
  for (const auto& l : layers_) {
    LayerState c;
    c.kv.capacity = l.kv.capacity;
    c.kv.k = alloc_like(backend, l.kv.k);
    c.kv.v = alloc_like(backend, l.kv.v);
    c.kv.slot_pos = alloc_like(backend, l.kv.slot_pos);
    c.conv = alloc_like(backend, l.conv);
    c.recurrent = alloc_like(backend, l.recurrent);
    copies.push_back(std::move(c));
  }
  auto out = std::make_unique<SequenceState>(std::move(copies), max_context_);
  out->restore(backend, *this);
  return out;
}

void SequenceState::restore(Backend& backend, const SequenceState& snapshot) {
  assert(snapshot.layers_.size() == layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerState& s = snapshot.layers_[i];
    LayerState& d = layers_[i];
    copy_if(backend, s.kv.k, d.kv.k);
    copy_if(backend, s.kv.v, d.kv.v);
    copy_if(backend, s.kv.slot_pos, d.kv.slot_pos);
    copy_if(backend, s.conv, d.conv);
    copy_if(backend, s.recurrent, d.recurrent);
  }
  length_ = snapshot.length_;
  rope_offset_ = snapshot.rope_offset_;
}

}  // namespace kiln
