#include "layers/sequence_state.h"

#include <cassert>
#include <vector>

#include "quant/affine.h"

namespace kiln {

std::vector<Tensor> stored_pieces(const Tensor& t) {
  if (!t.quantized()) return {t};
  const Tensor codes(DType::u8, Shape{t.dim(0), int64_t(t.nbytes()) / t.dim(0)}, t.data(), t.owner(), t.device());
  return {codes, t.quant().scales, t.quant().biases};
}

namespace {

void copy_if(Backend& backend, const Tensor& src, Tensor& dst) {
  if (!src.numel()) return;
  const std::vector<Tensor> from = stored_pieces(src);
  std::vector<Tensor> to = stored_pieces(dst);
  for (size_t i = 0; i < from.size(); ++i) backend.copy(from[i], to[i]);
}

Tensor alloc_like(Backend& backend, const Tensor& t) {
  if (!t.numel()) return Tensor();
  if (!t.quantized()) return backend.alloc(t.dtype(), t.shape());
  const QuantParams& q = t.quant();
  const Tensor codes = backend.alloc(DType::u8, Shape{int64_t(t.nbytes())});
  return quant::make_quantized(codes, backend.alloc(q.scales.dtype(), q.scales.shape()),
                               backend.alloc(q.biases.dtype(), q.biases.shape()), t.shape(), q.bits, q.group_size);
}

}  // namespace

size_t SequenceState::bytes() const {
  size_t total = 0;
  for (const auto& l : layers_)
    total +=
        l.kv.k.stored_bytes() + l.kv.v.stored_bytes() + l.kv.slot_pos.nbytes() + l.conv.nbytes() + l.recurrent.nbytes();
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
