// The model interface the runtime, CLI and server drive, and the registry that builds a model from
// a checkpoint directory.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/config.h"
#include "io/synthetic.h"
#include "layers/batch.h"
#include "layers/mlp.h"
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
  // Every attention layer's cache format (KvQuant), over the checkpoint's kv_config.json; unset:
  // that file's per-layer formats where the backend supports them, else the activations' type.
  std::optional<KvQuant> kv_quant;
  // The format of each layer's cache by layer index, as load_model resolves it from the above; a
  // layer beyond the list keeps the activations' type.
  std::vector<KvQuant> kv_layers;
  KvQuant kv_for(int64_t layer) const {
    return size_t(layer) < kv_layers.size() ? kv_layers[size_t(layer)] : KvQuant{};
  }
};

// Checks the format of layer `layer`'s cache against its head size (check_kv_quant): one that
// kv_quant asked for must fit, or the load fails; one that only the checkpoint's kv_config.json
// asked for is dropped with a warning and the layer's cache stays unquantized.
Status settle_kv_format(ModelOptions& options, int64_t layer, int head_dim);

// An image as its family's processor leaves it (the Hugging Face image processor's output): what
// the model's vision encoder reads.
struct ProcessedImage {
  Tensor pixels;              // host f32 [patches, values per patch], after rescaling and normalising
  std::vector<int64_t> grid;  // the patch grid: Gemma 4 {rows, cols}; Qwen 3.5 {t, h, w}
  int64_t soft_tokens = 0;    // the placeholder tokens its encoding fills in the prompt
};

// Encoded image rows that take the place of a chunk's placeholder tokens: tokens [offset, offset +
// rows.rows()) of the chunk embed as these rows instead of their ids. A span may hold part of an
// image (a prompt split over chunks): `first` is the row of the image's encoding it starts at.
// Models whose image tokens attend to each other bidirectionally (BatchNeeds::image_spans: Gemma 4's
// larger models) refuse such a part: whoever chunks a prompt keeps each image within one chunk.
struct SoftTokens {
  int64_t offset = 0;
  Tensor rows;  // [n, hidden] on the backend: a view of the image's encoding
  int64_t first = 0;
  int64_t image_rows = 0;  // the whole image's soft tokens
};

// One sequence's share of a forward call.
struct SeqChunk {
  SequenceState* state = nullptr;
  std::span<const int32_t> tokens;
  std::span<const SoftTokens> soft;  // images in these tokens, by increasing offset (none: text)
  // Rotary positions of these tokens when they do not simply follow the sequence's (Qwen's
  // multimodal RoPE: [axes × tokens], axis-major); empty: the state's next positions.
  std::span<const int32_t> positions;
};

enum class LogitRows { all, last };

// Receives a model's named intermediate activations while it is set on the model (host f32
// copies, [tokens, ...]). The names follow the reference's module names, so that a dump can be
// compared layer by layer with the oracle's: "embed_tokens", "layers.N.self_attn" (Qwen's
// DeltaNet layers: "layers.N.linear_attn"), "layers.N.mlp" (the feed-forward block's output
// before any post-norm), "layers.N.router_logits" (MoE routers), "layers.N" (the hidden state
// after layer N), "norm" (the final norm's output), "logits".
class ActivationDump {
 public:
  virtual ~ActivationDump() = default;
  virtual void record(const std::string& name, const Tensor& host_f32) = 0;
};

// A part of the checkpoint that the model does not run (a tower, an MTP head), found at load.
struct SetAsideFinding {
  std::string part;     // "vision tower"
  std::string not_yet;  // "images not supported yet"
  size_t tensors = 0;   // its tensors in the files (0: only its config.json section)
};

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

  // The image's soft tokens, [image.soft_tokens, hidden] on the backend, in the text model's
  // embedding space (the vision encoder and the multimodal embedder). An error for a model that
  // runs no images.
  virtual Result<Tensor> encode_image(const ProcessedImage& image);

  // What the model's batches carry beyond token ids (images, laid-out rotary positions); none by
  // default, and prepare refuses a batch that carries them.
  virtual BatchNeeds batch_needs() const { return {}; }

  // What load_model set aside of the checkpoint, in one entry per part.
  const std::vector<SetAsideFinding>& set_aside() const { return set_aside_; }
  void set_set_aside(std::vector<SetAsideFinding> parts) { set_aside_ = std::move(parts); }

  // Records intermediate activations into `dump` on every forward while set (null: off). Slow: each
  // activation is copied to the host. For parity hunts, not for serving.
  void set_activation_dump(ActivationDump* dump) { dump_ = dump; }

 protected:
  virtual Result<Tensor> run_impl(const PreparedBatch& batch, LogitRows rows) = 0;

  // Hands `t` (on the backend) to the activation dump under `name`; nothing when none is set.
  void dump(const std::string& name, const Tensor& t) const;
  // A block's output projection (out = x · wᵀ) and the residual update `then` that reads it: one
  // fused op, or while dumping the two apart, `out` recorded as "layers.<layer>.<block>" between them
  // (the fused op may not store `out`).
  void project_to_residual(int64_t layer, const char* block, const Tensor& x, const Tensor& w, Tensor& out,
                           const ResidualNormArgs& then);
  // The dense GLU MLP block ("layers.<layer>.mlp") and the residual update that reads it, likewise.
  void mlp_to_residual(int64_t layer, const Tensor& x, const GluMlp& mlp, Activation act, const ResidualNormArgs& then);
  bool dumping() const { return dump_ != nullptr; }

 private:
  std::vector<SetAsideFinding> set_aside_;
  ActivationDump* dump_ = nullptr;
};

// One tensor of a checkpoint, named and shaped as transformers saves the model (text-only form,
// "model." prefix), with how a synthetic checkpoint fills it.
using CheckpointTensor = SyntheticTensor;

// The text-model tensors a checkpoint of this config holds (used to write synthetic models of any
// geometry), and those of the parts a release-form config describes beside it (towers, MTP).
Result<std::vector<CheckpointTensor>> checkpoint_tensors(const ModelConfigFile& config);
Result<std::vector<CheckpointTensor>> checkpoint_part_tensors(const ModelConfigFile& config);

// Builds the model a directory holds, on `backend`. The architecture comes from config.json's
// model_type through an explicit table; an unknown one is an error naming it.
Result<std::unique_ptr<Model>> load_model(const std::string& model_dir, Backend& backend,
                                          const ModelOptions& options = {});

std::vector<std::string> supported_model_types();

}  // namespace kiln
