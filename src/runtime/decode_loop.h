// Greedy decoding of a fixed set of sequences, one token each per step, with the step recorded
// once and replayed (a CUDA graph on the GPU): the chosen tokens stay on the device and become the
// next step's input, so a step costs one replay and no host round trip.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "models/model.h"

namespace kiln {

class DecodeLoop {
 public:
  // `first` holds each sequence's next input token.
  static Result<std::unique_ptr<DecodeLoop>> create(Model& model, std::vector<SequenceState*> sequences,
                                                    std::span<const int32_t> first);

  // One step: every sequence consumes its current token and its greedy next token replaces it.
  Status step();
  // The tokens the last step chose (or the first tokens, before any step), copied to the host.
  std::vector<int32_t> tokens();
  // Logits [sequences, vocab] of the last step, on the device.
  const Tensor& logits() const { return logits_; }

 private:
  DecodeLoop(Model& model) : model_(model) {}

  Model& model_;
  PreparedBatch batch_;
  Tensor positions_host_;
  Tensor logits_;
  std::unique_ptr<Backend::Graph> graph_;
};

}  // namespace kiln
