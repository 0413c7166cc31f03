// Everything one sequence carries between forward calls: the attention KV rings and, for Gated
// DeltaNet layers, the conv and recurrent states. One object, so a sequence can be snapshotted,
// restored and dropped as a whole.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ops/backend.h"

namespace kiln {

struct LayerState {
  KvCacheView kv;    // attention layers that own a cache (capacity 0 otherwise)
  Tensor conv;       // Gated DeltaNet: [kernel - 1, channels]
  Tensor recurrent;  // Gated DeltaNet: [n_v_heads, k_dim, v_dim] f32
};

// The plain tensors a cache tensor is stored in: itself, or a quantized one's codes (as u8 rows of
// its first dimension), scales and biases.
std::vector<Tensor> stored_pieces(const Tensor& t);

class SequenceState {
 public:
  SequenceState(std::vector<LayerState> layers, int64_t max_context)
      : layers_(std::move(layers)), max_context_(max_context) {}

  int64_t length() const { return length_; }  // tokens processed so far
  int64_t max_context() const { return max_context_; }
  void advance(int64_t n) { length_ += n; }
  // For a state filled from elsewhere (a stored snapshot): the tokens its caches now hold.
  void set_length(int64_t length) { length_ = length; }
  // Where the next token's rotary position stands relative to its index: 0 unless a prompt laid
  // out its positions itself (Qwen's multimodal RoPE, where an image's tokens share positions).
  int64_t rope_offset() const { return rope_offset_; }
  void set_rope_offset(int64_t offset) { rope_offset_ = offset; }

  std::vector<LayerState>& layers() { return layers_; }
  const std::vector<LayerState>& layers() const { return layers_; }
  size_t bytes() const;

  // Empties every cache and zeroes every state (the sequence starts over).
  void reset(Backend& backend);
  // A deep copy on the same backend (a snapshot).
  std::unique_ptr<SequenceState> clone(Backend& backend) const;
  // Restores a snapshot taken from a sequence of the same model.
  void restore(Backend& backend, const SequenceState& snapshot);

 private:
  std::vector<LayerState> layers_;
  int64_t max_context_ = 0;
  int64_t length_ = 0;
  int64_t rope_offset_ = 0;
};

}  // namespace kiln
