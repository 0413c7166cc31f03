// Greedy decoding of a fixed set of sequences, one token each per step, with the step recorded
// once and replayed (a CUDA graph on the GPU): the chosen tokens stay on the device and become the
// next step's input, so a step costs one replay and no host round trip. Or, for sampling, each
// step's best candidates found on the device for the caller to draw from and feed back.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "models/model.h"
#include "runtime/sampler.h"

namespace kiln {

class DecodeLoop {
 public:
  // `first` holds each sequence's next input token. With `top_k` of at least 1 a step records each
  // row's best top_k of its logits over its temperature (Backend::top_k; `temperatures`, one a
  // sequence) instead of the greedy choice: the caller draws from candidates() and feeds the
  // drawn tokens back with set_tokens().
  static Result<std::unique_ptr<DecodeLoop>> create(Model& model, std::vector<SequenceState*> sequences,
                                                    std::span<const int32_t> first, int top_k = 0,
                                                    std::span<const float> temperatures = {});

  // One step: every sequence consumes its current token; greedy, its next token replaces it.
  Status step();
  // The tokens the last step chose (or the current inputs), copied to the host.
  std::vector<int32_t> tokens();
  // The next step's input tokens, from the host.
  void set_tokens(std::span<const int32_t> tokens);
  // The temperatures the candidates are formed over (top_k >= 1), one a sequence, from the host.
  void set_temperatures(std::span<const float> temperatures);
  // The last step's choices (greedy) and candidates (top_k >= 1), on the device.
  const Tensor& ids() const { return batch_.ids; }
  const Tensor& top_values() const { return top_values_; }
  const Tensor& top_ids() const { return top_ids_; }
  // The last step's candidates on the host: values and ids [sequences, top_k], best first.
  struct Candidates {
    Tensor values, ids;
  };
  Candidates candidates();
  // Logits [sequences, vocab] of the last step, on the device.
  const Tensor& logits() const { return logits_; }

 private:
  DecodeLoop(Model& model) : model_(model) {}

  Model& model_;
  PreparedBatch batch_;
  Tensor positions_host_;
  Tensor rope_positions_host_;  // [axes, sequences], for models that rotate by laid-out positions
  Tensor logits_;
  Tensor temperatures_, top_values_, top_ids_;  // the candidates' form (top_k >= 1)
  std::unique_ptr<Backend::Graph> graph_;
};

// One sequence decoded a token at a time, each drawn by `sampler`. On a GPU, when the draw needs
// only a step's best candidates (greedy, or top_k without penalties or biases: draws_from_top_k),
// the step is recorded at the first token and replayed (DecodeLoop) instead of launched op by op;
// otherwise each token is a forward call and draw_next.
class SequenceDecoder {
 public:
  SequenceDecoder(Model& model, SequenceState& state, Sampler& sampler);
  // Feeds `token` (the last one drawn) and draws the next. `history` (prompt and output so far)
  // is for penalties; `check_finite` and `generated_index` as for draw_next.
  Result<int32_t> next(int32_t token, std::span<const int32_t> history, bool check_finite, int64_t generated_index);
  // Feeds `token` without drawing the next (the last token of a generation).
  Status feed(int32_t token);

 private:
  Model& model_;
  SequenceState& state_;
  Sampler& sampler_;
  // Where the draw needs only candidates on a GPU: the recorded step, created at the first token.
  const bool replays_;
  Status run(int32_t token);

  std::unique_ptr<DecodeLoop> loop_;
};

}  // namespace kiln
