// The model interface the runtime, CLI and server drive, and the registry that builds a model from
// a checkpoint directory.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/config.h"
#include "io/synthetic.h"
#include "layers/batch.h"
#include "layers/sequence_state.h"
#include "ops/backend.h"

namespace kiln {

struct ModelInfo {
  std::string family;      // "gemma4" or "qwen3_5"
  std::string model_type;  // as config.json says
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t n_layers = 0;
  int64_t max_position_embeddings = 0;
  size_t weight_bytes = 0;  // bytes of the checkpoint tensors in use
};

struct ModelOptions {
  // The most tokens one forward call takes; longer prompts are split. Sliding-window caches hold
  // window - 1 + this many positions, so their size never grows with the sequence.
  int64_t max_chunk_tokens = 512;
};

// One sequence's share of a forward call.
struct SeqChunk {
  SequenceState* state = nullptr;
  std::span<const int32_t> tokens;
};

enum class LogitRows { all, last };

class Model {
 public:
  virtual ~Model() = default;

  virtual const ModelInfo& info() const = 0;
  virtual Backend& backend() const = 0;
  virtual int64_t max_chunk_tokens() const = 0;

  // A fresh sequence whose caches can hold max_context tokens.
  virtual Result<std::unique_ptr<SequenceState>> new_sequence(int64_t max_context) = 0;

  // Runs every chunk's tokens through its sequence (advancing it) and returns f32 logits on the
  // backend: a row per token (all) or the last token of each chunk (last), in batch order.
  // Device failures (out of memory, a failed launch) come back as errors too.
  Result<Tensor> forward(std::span<const SeqChunk> batch, LogitRows rows);

  // The two halves of forward, for runtimes that keep a batch on the device and replay it (decode
  // graphs): prepare checks the batch and puts ids and positions on the backend; run issues the
  // device work only (no host transfers, nothing that depends on host values that change from one
  // decode step to the next) and leaves the sequences' lengths to the caller.
  Result<PreparedBatch> prepare(std::span<const SeqChunk> batch);
  Result<Tensor> run(const PreparedBatch& batch, LogitRows rows);

  // Bytes one decode step reads from device memory: the weights it touches (for MoE, the experts
  // a batch of `batch` tokens routes to at most) and the caches of sequences `context` long.
  virtual size_t decode_bytes(int64_t context, int64_t batch) const = 0;
  // Floating-point operations of a prefill of `tokens` tokens from an empty cache: the matrix
  // products (for MoE, the routed experts) and attention's two products over the visible keys.
  virtual double prefill_flops(int64_t tokens) const = 0;

 protected:
  virtual Result<Tensor> run_impl(const PreparedBatch& batch, LogitRows rows) = 0;
};

// One tensor of a checkpoint, named and shaped as transformers saves the model (text-only form,
// "model." prefix), with how a synthetic checkpoint fills it.
using CheckpointTensor = SyntheticTensor;

// The tensors a checkpoint of this config holds (used to write synthetic models of any geometry).
Result<std::vector<CheckpointTensor>> checkpoint_tensors(const ModelConfigFile& config);

// Builds the model a directory holds, on `backend`. The architecture comes from config.json's
// model_type through an explicit table; an unknown one is an error naming it.
Result<std::unique_ptr<Model>> load_model(const std::string& model_dir, Backend& backend,
                                          const ModelOptions& options = {});

std::vector<std::string> supported_model_types();

}  // namespace kiln
