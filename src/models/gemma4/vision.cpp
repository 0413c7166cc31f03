// Gemma 4's image front ends (see vision.h). Read against transformers 5.17:
//   modeling_gemma4.py          Gemma4VisionModel.forward, Gemma4VisionPatchEmbedder,
//                               Gemma4VisionEncoder(Layer), Gemma4VisionAttention,
//                               apply_multidimensional_rope, Gemma4VisionRotaryEmbedding,
//                               Gemma4VisionMLP, Gemma4ClippableLinear, Gemma4VisionPooler,
//                               Gemma4MultimodalEmbedder
//   modeling_gemma4_unified.py  Gemma4UnifiedVisionEmbedder, Gemma4UnifiedMultimodalEmbedder
#include "models/gemma4/vision.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <vector>

#include "layers/attention.h"

namespace kiln {

namespace {

// ---- configs ----

Status check_positive(const std::string& where, std::initializer_list<std::pair<const char*, int64_t>> sizes) {
  for (const auto& [key, value] : sizes)
    if (value < 1) return make_error("{}: '{}' must be at least 1, got {}", where, key, value);
  return ok_status();
}

// ---- loading ----

// Fetches the weights of a front end, or, dry, only notes the first that the checkpoint lacks: the
// same listing decides whether the front end is there and then loads it.
class Fetch {
 public:
  Fetch(WeightLoader& w, bool dry) : w_(w), dry_(dry) {}

  Result<Tensor> matrix(const std::string& name, const Shape& shape) {
    if (dry_) return note(name);
    return w_.matrix(name, shape);
  }
  Result<Tensor> vector(const std::string& name, const Shape& shape) {
    if (dry_) return note(name);
    return w_.vector(name, shape);
  }
  // A host f32 copy, for load-time transforms (undefined when dry).
  Result<Tensor> host_f32(const std::string& name, const Shape& shape) {
    if (dry_) return note(name);
    return w_.host_f32(name, shape);
  }
  // A scalar buffer (a clip bound), stored as a 0-d or 1-element tensor.
  Result<float> scalar(const std::string& name) {
    if (dry_) {
      note(name);
      return 0.0f;
    }
    KILN_ASSIGN(Tensor t, w_.store().get(name));
    if (t.numel() != 1 || (t.dtype() != DType::f32 && t.dtype() != DType::bf16 && t.dtype() != DType::f16))
      return make_error("tensor {} should hold one float, it is {} {}", w_.store().describe(name),
                        dtype_name(t.dtype()), t.shape().str());
    return to_f32_host(t).data_as<float>()[0];
  }
  const std::string& missing() const { return missing_; }

 private:
  Tensor note(const std::string& name) {
    if (missing_.empty() && !w_.has(name)) missing_ = name;
    return Tensor();
  }
  WeightLoader& w_;
  bool dry_;
  std::string missing_;
};

// Gemma4ClippableLinear: y = clamp(clamp(x, input_min, input_max) · Wᵀ, output_min, output_max),
// the clamps only with use_clipped_linears (bounds from the checkpoint, ±inf at init).
struct ClippableLinear {
  Tensor weight;  // [out, in]
  float input_min = -INFINITY, input_max = INFINITY, output_min = -INFINITY, output_max = INFINITY;
};

Result<ClippableLinear> load_clippable(Fetch& f, const std::string& prefix, int64_t out, int64_t in, bool clipped) {
  ClippableLinear l;
  KILN_ASSIGN(l.weight, f.matrix(prefix + ".linear.weight", Shape{out, in}));
  if (clipped) {
    KILN_ASSIGN(l.input_min, f.scalar(prefix + ".input_min"));
    KILN_ASSIGN(l.input_max, f.scalar(prefix + ".input_max"));
    KILN_ASSIGN(l.output_min, f.scalar(prefix + ".output_min"));
    KILN_ASSIGN(l.output_max, f.scalar(prefix + ".output_max"));
  }
  return l;
}

bool clips(float lo, float hi) {
  return lo > -INFINITY || hi < INFINITY;
}

Tensor apply(Backend& b, const ClippableLinear& l, const Tensor& x) {
  Tensor in = x;
  if (clips(l.input_min, l.input_max)) {
    in = b.alloc(b.activation_dtype(), Shape{x.rows(), x.cols()});
    b.clamp(x, l.input_min, l.input_max, in);
  }
  Tensor out = b.alloc(b.activation_dtype(), Shape{x.rows(), l.weight.dim(0)});
  b.matmul(in, l.weight, out);
  if (clips(l.output_min, l.output_max)) b.clamp(out, l.output_min, l.output_max, out);
  return out;
}

Tensor host_i32(const std::vector<int32_t>& values, Shape shape) {
  Tensor t = host_tensor(DType::i32, shape);
  std::copy(values.begin(), values.end(), t.data_as<int32_t>());
  return t;
}

// The image's pixels as a host f32 [patches, values] tensor, checked against the model's patch size.
Status check_pixels(const ProcessedImage& image, int64_t values, const char* what) {
  const Tensor& p = image.pixels;
  if (!p.defined() || p.device() != Device::cpu || p.rank() != 2 || p.dtype() != DType::f32)
    return make_error("{}: an image's pixels must be a host f32 [patches, values] tensor", what);
  if (p.cols() != values)
    return make_error("{}: an image's patches hold {} values, the model's {}", what, p.cols(), values);
  if (image.grid.size() != 2 || image.grid[0] < 1 || image.grid[1] < 1)
    return make_error("{}: an image's grid must be {{patch rows, patch cols}}", what);
  return ok_status();
}

void maybe_dump(const VisionDump& dump, const std::string& name, const Tensor& t) {
  if (dump) dump(name, t);
}

// ---- gemma4: Gemma4VisionModel and Gemma4MultimodalEmbedder ----

struct VisionLayer {  // Gemma4VisionEncoderLayer
  ClippableLinear q_proj, k_proj, v_proj, o_proj;
  Tensor q_norm, k_norm;  // [head_dim] f32; v_norm has no weight
  ClippableLinear gate_proj, up_proj, down_proj;
  Tensor input_layernorm, post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm;
};

class Gemma4VisionTower final : public Gemma4ImageEncoder {
 public:
  Gemma4VisionTower(const Gemma4VisionConfig& c, Backend& backend, int64_t text_hidden)
      : c_(c), b_(backend), text_hidden_(text_hidden) {}

  Status load(Fetch& f) {
    const int64_t H = c_.hidden_size, hd = c_.head_dim, Hq = c_.num_attention_heads, Hkv = c_.num_key_value_heads;
    const int64_t I = c_.intermediate_size, S = c_.position_embedding_size;
    const bool clip = c_.use_clipped_linears;
    const std::string v = "vision_tower.";
    KILN_ASSIGN(input_proj_,
                f.matrix(v + "patch_embedder.input_proj.weight", Shape{H, 3 * c_.patch_size * c_.patch_size}));
    // [x | y, position, hidden] as one table of 2·S rows: row x, or S + y
    KILN_ASSIGN(position_table_, f.matrix(v + "patch_embedder.position_embedding_table", Shape{2, S, H}));
    if (position_table_.quantized())
      return make_error("the vision tower's position_embedding_table is quantized; kiln reads it unquantized");
    if (position_table_.defined()) position_table_ = position_table_.reshape(Shape{2 * S, H});
    layers_.clear();
    for (int64_t i = 0; i < c_.num_hidden_layers; ++i) {
      const std::string p = v + "encoder.layers." + std::to_string(i) + ".";
      VisionLayer l;
      KILN_ASSIGN(l.q_proj, load_clippable(f, p + "self_attn.q_proj", Hq * hd, H, clip));
      KILN_ASSIGN(l.k_proj, load_clippable(f, p + "self_attn.k_proj", Hkv * hd, H, clip));
      KILN_ASSIGN(l.v_proj, load_clippable(f, p + "self_attn.v_proj", Hkv * hd, H, clip));
      KILN_ASSIGN(l.o_proj, load_clippable(f, p + "self_attn.o_proj", H, Hq * hd, clip));
      KILN_ASSIGN(l.q_norm, f.vector(p + "self_attn.q_norm.weight", Shape{hd}));
      KILN_ASSIGN(l.k_norm, f.vector(p + "self_attn.k_norm.weight", Shape{hd}));
      KILN_ASSIGN(l.gate_proj, load_clippable(f, p + "mlp.gate_proj", I, H, clip));
      KILN_ASSIGN(l.up_proj, load_clippable(f, p + "mlp.up_proj", I, H, clip));
      KILN_ASSIGN(l.down_proj, load_clippable(f, p + "mlp.down_proj", H, I, clip));
      KILN_ASSIGN(l.input_layernorm, f.vector(p + "input_layernorm.weight", Shape{H}));
      KILN_ASSIGN(l.post_attention_layernorm, f.vector(p + "post_attention_layernorm.weight", Shape{H}));
      KILN_ASSIGN(l.pre_feedforward_layernorm, f.vector(p + "pre_feedforward_layernorm.weight", Shape{H}));
      KILN_ASSIGN(l.post_feedforward_layernorm, f.vector(p + "post_feedforward_layernorm.weight", Shape{H}));
      layers_.push_back(std::move(l));
    }
    if (c_.standardize) {
      // (h − std_bias) · std_scale as (h + shift) · std_scale, shift = −std_bias (exact)
      KILN_ASSIGN(Tensor shift, f.host_f32(v + "std_bias", Shape{H}));
      if (shift.defined()) {
        for (int64_t i = 0; i < H; ++i) shift.data_as<float>()[i] = -shift.data_as<float>()[i];
        std_shift_ = b_.upload(shift, DType::f32);
      }
      KILN_ASSIGN(std_scale_, f.vector(v + "std_scale", Shape{H}));
    }
    // the embedder's input is the tower's width (getattr(vision_config, "output_proj_dims", hidden_size))
    KILN_ASSIGN(embedding_projection_, f.matrix("embed_vision.embedding_projection.weight", Shape{text_hidden_, H}));
    // 2-D RoPE: each half of a head turns by one coordinate, rotate-half within the half, with the
    // frequencies of a head_dim / 2 wide head (Gemma4VisionRotaryEmbedding)
    rope_ = make_rope(b_, int(hd / 2), c_.rope_theta);
    return ok_status();
  }

  Result<Tensor> encode(const ProcessedImage& image, const VisionDump& dump) override {
    const int64_t H = c_.hidden_size, hd = c_.head_dim, Hq = c_.num_attention_heads, Hkv = c_.num_key_value_heads;
    const int64_t k = c_.pooling_kernel_size, S = c_.position_embedding_size;
    KILN_TRY(check_pixels(image, 3 * c_.patch_size * c_.patch_size, "gemma4 vision"));
    const int64_t rows = image.grid[0], cols = image.grid[1], P = image.pixels.rows();
    if (rows * cols != P) return make_error("gemma4 vision: a grid of {}x{} patches for {} patches", rows, cols, P);
    if (rows % k || cols % k)
      return make_error("gemma4 vision: a grid of {}x{} patches does not pool by {}x{}", rows, cols, k, k);
    const int64_t L = P / (k * k);
    if (image.soft_tokens != L)
      return make_error("gemma4 vision: {} patches pool to {} soft tokens, the image asks for {}", P, L,
                        image.soft_tokens);
    if (rows > S || cols > S)
      return make_error("gemma4 vision: a grid of {}x{} patches exceeds the position table's {}", rows, cols, S);
    const DType dt = b_.activation_dtype();

    // Patch embedding: input_proj(2 · (pixels − 0.5)) + table[x] + table[S + y]. Patch p of the
    // processor's row-major order sits at x = p % cols, y = p / cols.
    Tensor shifted = host_tensor(DType::f32, Shape{P, image.pixels.cols()});
    for (int64_t r = 0; r < P; ++r) {
      const float* in = image.pixels.data_as<float>() + r * image.pixels.row_stride();
      float* out = shifted.data_as<float>() + r * shifted.cols();
      for (int64_t i = 0; i < shifted.cols(); ++i) out[i] = 2.0f * (in[i] - 0.5f);
    }
    Tensor h = b_.alloc(dt, Shape{P, H});  // [patches, hidden]: the residual stream
    b_.matmul(b_.upload(shifted, dt), input_proj_, h);
    std::vector<int32_t> xy(static_cast<size_t>(2 * P));
    for (int64_t p = 0; p < P; ++p) {
      xy[size_t(2 * p)] = int32_t(p % cols);
      xy[size_t(2 * p + 1)] = int32_t(S + p / cols);
    }
    Tensor position = b_.alloc(dt, Shape{P, H});  // x and y rows summed, rounded once
    b_.gather_sum(b_.upload(host_i32(xy, Shape{P, 2}), DType::i32), position_table_, 1.0f, position);
    b_.add(h, position, 1.0f, h);
    maybe_dump(dump, "vision_tower.patch_embedder", h);

    // Every patch attends to every other (the encoder's bidirectional mask, no padding): the keys and
    // values of a layer are a cache of P slots holding positions 0..P-1, and each query's block is
    // the whole image.
    std::vector<int32_t> index(static_cast<size_t>(P)), whole(static_cast<size_t>(2 * P));
    for (int64_t p = 0; p < P; ++p) {
      index[size_t(p)] = int32_t(p);
      whole[size_t(2 * p)] = 0;
      whole[size_t(2 * p + 1)] = int32_t(P - 1);
    }
    const Tensor positions = b_.upload(host_i32(index, Shape{P}), DType::i32);
    const Tensor blocks = b_.upload(host_i32(whole, Shape{P, 2}), DType::i32);
    // the rotary position of each half head: x for the first half, y for the second
    auto half_positions = [&](int64_t heads) {
      std::vector<int32_t> pos(static_cast<size_t>(P * heads * 2));
      for (int64_t p = 0; p < P; ++p)
        for (int64_t i = 0; i < heads; ++i) {
          pos[size_t((p * heads + i) * 2)] = int32_t(p % cols);
          pos[size_t((p * heads + i) * 2 + 1)] = int32_t(p / cols);
        }
      return b_.upload(host_i32(pos, Shape{P * heads * 2}), DType::i32);
    };
    const Tensor q_rope_positions = half_positions(Hq);
    const Tensor k_rope_positions = Hkv == Hq ? q_rope_positions : half_positions(Hkv);
    const float eps = float(c_.rms_norm_eps);

    Tensor x = b_.alloc(dt, Shape{P, H});
    b_.rms_norm(h, layers_[0].input_layernorm, eps, 0.0f, x);
    for (size_t i = 0; i < layers_.size(); ++i) {
      const VisionLayer& l = layers_[i];
      // q and k: per-head RMS norm with weight, then 2-D RoPE; v: RMS norm without weight
      Tensor q = apply(b_, l.q_proj, x), key = apply(b_, l.k_proj, x), value = apply(b_, l.v_proj, x);
      Tensor q_heads = q.reshape(Shape{P * Hq, hd}), k_heads = key.reshape(Shape{P * Hkv, hd});
      Tensor v_heads = value.reshape(Shape{P * Hkv, hd});
      b_.rms_norm(q_heads, l.q_norm, eps, 0.0f, q_heads);
      b_.rms_norm(k_heads, l.k_norm, eps, 0.0f, k_heads);
      b_.rms_norm(v_heads, Tensor(), eps, 0.0f, v_heads);
      b_.rope(RopeArgs{.x = q.reshape(Shape{P * Hq * 2, 1, hd / 2}),
                       .positions = q_rope_positions,
                       .inv_freq = rope_.inv_freq,
                       .pair_offset = rope_.pair_offset});
      b_.rope(RopeArgs{.x = key.reshape(Shape{P * Hkv * 2, 1, hd / 2}),
                       .positions = k_rope_positions,
                       .inv_freq = rope_.inv_freq,
                       .pair_offset = rope_.pair_offset});
      Tensor attn = b_.alloc(dt, Shape{P, Hq, hd});
      b_.attention(AttentionArgs{.q = q.reshape(Shape{P, Hq, hd}),
                                 .out = attn,
                                 .positions = positions,
                                 .seqs = {SeqRows{.row_begin = 0, .n_rows = P, .pos_begin = 0}},
                                 .caches = {KvCacheView{.k = key.reshape(Shape{P, Hkv, hd}),
                                                        .v = value.reshape(Shape{P, Hkv, hd}),
                                                        .slot_pos = positions,
                                                        .capacity = P}},
                                 .n_heads = int(Hq),
                                 .n_kv_heads = int(Hkv),
                                 .head_dim = int(hd),
                                 .scale = 1.0f,  // q and k are normalised; no 1/sqrt(head_dim)
                                 .window = 0,
                                 .blocks = blocks});
      Tensor o = apply(b_, l.o_proj, attn.reshape(Shape{P, Hq * hd}));
      // h += post_attention_layernorm(o); the MLP reads pre_feedforward_layernorm(h)
      Tensor mlp_in = b_.alloc(dt, Shape{P, H});
      b_.residual_norm(ResidualNormArgs{.residual = h,
                                        .block_out = o,
                                        .block_norm = l.post_attention_layernorm,
                                        .next = mlp_in,
                                        .next_norm = l.pre_feedforward_layernorm,
                                        .eps = eps});
      Tensor gate = apply(b_, l.gate_proj, mlp_in), up = apply(b_, l.up_proj, mlp_in);
      b_.glu(gate, up, Activation::gelu_tanh, gate);
      Tensor down = apply(b_, l.down_proj, gate);
      // h += post_feedforward_layernorm(down); the next layer reads its input_layernorm(h)
      ResidualNormArgs update{.residual = h, .block_out = down, .block_norm = l.post_feedforward_layernorm, .eps = eps};
      if (i + 1 < layers_.size()) {
        x = b_.alloc(dt, Shape{P, H});
        update.next = x;
        update.next_norm = layers_[i + 1].input_layernorm;
      }
      b_.residual_norm(update);
      maybe_dump(dump, fmt::format("vision_tower.encoder.layers.{}", i), h);
    }

    // Pooler: the mean of each k × k block of patches (pooled row (y / k) · (cols / k) + x / k),
    // rounded to the activation type, then · sqrt(hidden) and the standardisation in f32, rounded once.
    std::vector<int32_t> members(static_cast<size_t>(P));
    const int64_t pooled_cols = cols / k;
    std::vector<int64_t> filled(size_t(L), 0);
    for (int64_t p = 0; p < P; ++p) {
      const int64_t j = (p / cols / k) * pooled_cols + (p % cols) / k;
      members[size_t(j * k * k + filled[size_t(j)]++)] = int32_t(p);
    }
    Tensor pooled = b_.alloc(dt, Shape{L, H});
    b_.gather_sum(b_.upload(host_i32(members, Shape{L, k * k}), DType::i32), h, 1.0f / float(k * k), pooled);
    b_.column_affine(pooled, float(std::sqrt(double(H))), std_shift_, std_scale_, pooled);
    maybe_dump(dump, "vision_tower", pooled);

    // Gemma4MultimodalEmbedder: an RMS norm without weight, the projection into the text width
    b_.rms_norm(pooled, Tensor(), eps, 0.0f, pooled);
    Tensor out = b_.alloc(dt, Shape{L, text_hidden_});
    b_.matmul(pooled, embedding_projection_, out);
    maybe_dump(dump, "embed_vision", out);
    return out;
  }

 private:
  Gemma4VisionConfig c_;
  Backend& b_;
  int64_t text_hidden_;
  Tensor input_proj_, position_table_;
  std::vector<VisionLayer> layers_;
  Tensor std_shift_, std_scale_;
  Tensor embedding_projection_;
  RopeTable rope_;
};

// ---- gemma4_unified: Gemma4UnifiedVisionEmbedder ----

struct LayerNormWeights {  // nn.LayerNorm (eps 1e-5, transformers' default here)
  Tensor weight, bias;
};

Result<LayerNormWeights> load_layer_norm(Fetch& f, const std::string& prefix, int64_t dim) {
  LayerNormWeights n;
  KILN_ASSIGN(n.weight, f.vector(prefix + ".weight", Shape{dim}));
  KILN_ASSIGN(n.bias, f.vector(prefix + ".bias", Shape{dim}));
  return n;
}

class Gemma4UnifiedVision final : public Gemma4ImageEncoder {
 public:
  Gemma4UnifiedVision(const Gemma4UnifiedVisionConfig& c, Backend& backend, int64_t text_hidden)
      : c_(c), b_(backend), text_hidden_(text_hidden) {}

  int64_t patch_values() const {
    const int64_t side = c_.patch_size * c_.pooling_kernel_size;  // model_patch_size
    return side * side * 3;
  }

  Status load(Fetch& f) {
    const int64_t D = c_.mm_embed_dim, S = c_.mm_posemb_size;
    // the released checkpoint's names, which transformers' save_pretrained writes too (it renames
    // its modules' embed_vision.{patch_ln1, ...} and embed_vision.multimodal_embedder back on save)
    const std::string e = "vision_embedder.";
    KILN_ASSIGN(patch_ln1_, load_layer_norm(f, e + "patch_ln1", patch_values()));
    KILN_ASSIGN(patch_dense_, f.matrix(e + "patch_dense.weight", Shape{D, patch_values()}));
    KILN_ASSIGN(patch_dense_bias_, f.vector(e + "patch_dense.bias", Shape{D}));
    KILN_ASSIGN(patch_ln2_, load_layer_norm(f, e + "patch_ln2", D));
    // [position, x | y, width] as one table of 2·S rows: row 2·x, or 2·y + 1
    KILN_ASSIGN(pos_embedding_, f.matrix(e + "pos_embedding", Shape{S, 2, D}));
    if (pos_embedding_.quantized())
      return make_error("the unified vision embedder's pos_embedding is quantized; kiln reads it unquantized");
    if (pos_embedding_.defined()) pos_embedding_ = pos_embedding_.reshape(Shape{2 * S, D});
    KILN_ASSIGN(pos_norm_, load_layer_norm(f, e + "pos_norm", D));
    KILN_ASSIGN(embedding_projection_, f.matrix("embed_vision.embedding_projection.weight",
                                                Shape{text_hidden_, c_.output_proj_dims}));
    return ok_status();
  }

  Result<Tensor> encode(const ProcessedImage& image, const VisionDump& dump) override {
    const int64_t D = c_.mm_embed_dim, S = c_.mm_posemb_size, k = c_.pooling_kernel_size;
    KILN_TRY(check_pixels(image, patch_values(), "gemma4_unified vision"));
    const int64_t P = image.pixels.rows();
    // the grid of model patches, or of the processor's small patches that they merge k × k
    int64_t rows = image.grid[0], cols = image.grid[1];
    if (rows * cols == P * k * k && rows % k == 0 && cols % k == 0) rows /= k, cols /= k;
    if (rows * cols != P)
      return make_error("gemma4_unified vision: a grid of {}x{} patches for {} model patches", image.grid[0],
                        image.grid[1], P);
    if (image.soft_tokens != P)
      return make_error("gemma4_unified vision: {} model patches make {} soft tokens, the image asks for {}", P, P,
                        image.soft_tokens);
    if (rows > S || cols > S)
      return make_error("gemma4_unified vision: a grid of {}x{} patches exceeds the position table's {}", rows, cols,
                        S);
    const DType dt = b_.activation_dtype();
    constexpr float kLayerNormEps = 1e-5f;

    // patch_ln1 → patch_dense (bias added to the f32 product, rounded once) → patch_ln2
    // [P, patch values] (the upload may be the caller's own pixels: normalised into another tensor)
    const Tensor pixels = b_.upload(image.pixels, dt);
    Tensor x = b_.alloc(dt, Shape{P, patch_values()});
    b_.layer_norm(pixels, patch_ln1_.weight, patch_ln1_.bias, kLayerNormEps, x);
    Tensor product = b_.alloc(DType::f32, Shape{P, D});
    b_.matmul(x, patch_dense_, product);
    Tensor h = b_.alloc(dt, Shape{P, D});
    b_.column_affine(product, 1.0f, patch_dense_bias_, Tensor(), h);
    b_.layer_norm(h, patch_ln2_.weight, patch_ln2_.bias, kLayerNormEps, h);
    maybe_dump(dump, "embed_vision.patch_ln2", h);
    // + pos_embedding[x, 0] + pos_embedding[y, 1] (the two summed first), then pos_norm; model
    // patch p of the processor's row-major order sits at x = p % cols, y = p / cols
    std::vector<int32_t> xy(static_cast<size_t>(2 * P));
    for (int64_t p = 0; p < P; ++p) {
      xy[size_t(2 * p)] = int32_t(2 * (p % cols));
      xy[size_t(2 * p + 1)] = int32_t(2 * (p / cols) + 1);
    }
    Tensor position = b_.alloc(dt, Shape{P, D});
    b_.gather_sum(b_.upload(host_i32(xy, Shape{P, 2}), DType::i32), pos_embedding_, 1.0f, position);
    b_.add(h, position, 1.0f, h);
    b_.layer_norm(h, pos_norm_.weight, pos_norm_.bias, kLayerNormEps, h);
    maybe_dump(dump, "embed_vision.pos_norm", h);
    // Gemma4UnifiedMultimodalEmbedder: an RMS norm without weight, the projection into the text width
    b_.rms_norm(h, Tensor(), float(c_.rms_norm_eps), 0.0f, h);
    Tensor out = b_.alloc(dt, Shape{P, text_hidden_});
    b_.matmul(h, embedding_projection_, out);
    maybe_dump(dump, "embed_vision", out);
    return out;
  }

 private:
  Gemma4UnifiedVisionConfig c_;
  Backend& b_;
  int64_t text_hidden_;
  LayerNormWeights patch_ln1_, patch_ln2_, pos_norm_;
  Tensor patch_dense_, patch_dense_bias_, pos_embedding_, embedding_projection_;
};

// Loads `front` when the checkpoint holds every weight it lists; else names the first it lacks.
template <typename Front>
Result<std::unique_ptr<Gemma4ImageEncoder>> load_front(std::unique_ptr<Front> front, WeightLoader& w,
                                                       std::string& missing) {
  Fetch dry(w, true);
  KILN_TRY(front->load(dry));
  if (!dry.missing().empty()) {
    missing = "the checkpoint has no tensor '" + dry.missing() + "'";
    return std::unique_ptr<Gemma4ImageEncoder>();
  }
  Fetch fetch(w, false);
  KILN_TRY(front->load(fetch));
  return std::unique_ptr<Gemma4ImageEncoder>(std::move(front));
}

}  // namespace

Result<Gemma4VisionConfig> parse_gemma4_vision_config(const nlohmann::json& j, const std::string& where) {
  ConfigReader r(j, where);
  Gemma4VisionConfig c;
  const Gemma4VisionConfig d;
  c.hidden_size = r.get_int("hidden_size", d.hidden_size);
  c.intermediate_size = r.get_int("intermediate_size", d.intermediate_size);
  c.num_hidden_layers = r.get_int("num_hidden_layers", d.num_hidden_layers);
  c.num_attention_heads = r.get_int("num_attention_heads", d.num_attention_heads);
  c.num_key_value_heads = r.get_int("num_key_value_heads", d.num_key_value_heads);
  c.head_dim = r.get_int("head_dim", d.head_dim);
  c.rms_norm_eps = r.get_float("rms_norm_eps", d.rms_norm_eps);
  c.pooling_kernel_size = r.get_int("pooling_kernel_size", d.pooling_kernel_size);
  c.patch_size = r.get_int("patch_size", d.patch_size);
  c.position_embedding_size = r.get_int("position_embedding_size", d.position_embedding_size);
  c.use_clipped_linears = r.get_bool("use_clipped_linears", d.use_clipped_linears);
  c.standardize = r.get_bool("standardize", d.standardize);
  const std::string act = r.get_string("hidden_activation", "gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh" && act != "gelu_tanh")
    r.fail("hidden_activation '" + act + "' is not supported (gelu_pytorch_tanh)");
  if (r.get_bool("attention_bias", false)) r.fail("attention_bias = true is not supported");
  if (r.has("rope_parameters")) {
    if (!j["rope_parameters"].is_object()) return make_error("{}: 'rope_parameters' must be an object", where);
    ConfigReader rope(j["rope_parameters"], where + " rope_parameters");
    // transformers 5.17 writes "axial" for the tower's 2-D rotation, which "default" also means here
    const std::string type = rope.get_string("rope_type", "default");
    if (type != "default" && type != "axial") rope.fail("rope_type '" + type + "' is not supported (axial)");
    c.rope_theta = rope.get_float("rope_theta", d.rope_theta);
    KILN_TRY(rope.status());
  }
  KILN_TRY(r.status());
  KILN_TRY(check_positive(where, {{"hidden_size", c.hidden_size},
                                  {"intermediate_size", c.intermediate_size},
                                  {"num_hidden_layers", c.num_hidden_layers},
                                  {"num_attention_heads", c.num_attention_heads},
                                  {"num_key_value_heads", c.num_key_value_heads},
                                  {"head_dim", c.head_dim},
                                  {"pooling_kernel_size", c.pooling_kernel_size},
                                  {"patch_size", c.patch_size},
                                  {"position_embedding_size", c.position_embedding_size}}));
  // two coordinates, each turning a rotate-half pair of channels in its half of the head
  if (c.head_dim % 4) return make_error("{}: head_dim {} must be a multiple of 4 (2-D RoPE)", where, c.head_dim);
  if (c.num_attention_heads % c.num_key_value_heads)
    return make_error("{}: {} attention heads for {} key-value heads", where, c.num_attention_heads,
                      c.num_key_value_heads);
  if (!(c.rms_norm_eps > 0.0) || !(c.rope_theta > 0.0))
    return make_error("{}: rms_norm_eps and rope_theta must be positive", where);
  return c;
}

Result<Gemma4UnifiedVisionConfig> parse_gemma4_unified_vision_config(const nlohmann::json& j,
                                                                     const std::string& where) {
  ConfigReader r(j, where);
  Gemma4UnifiedVisionConfig c;
  const Gemma4UnifiedVisionConfig d;
  c.patch_size = r.get_int("patch_size", d.patch_size);
  c.pooling_kernel_size = r.get_int("pooling_kernel_size", d.pooling_kernel_size);
  c.mm_embed_dim = r.get_int("mm_embed_dim", d.mm_embed_dim);
  c.mm_posemb_size = r.get_int("mm_posemb_size", d.mm_posemb_size);
  c.rms_norm_eps = r.get_float("rms_norm_eps", d.rms_norm_eps);
  c.output_proj_dims = r.get_int("output_proj_dims", d.output_proj_dims);
  KILN_TRY(r.status());
  KILN_TRY(check_positive(where, {{"patch_size", c.patch_size},
                                  {"pooling_kernel_size", c.pooling_kernel_size},
                                  {"mm_embed_dim", c.mm_embed_dim},
                                  {"mm_posemb_size", c.mm_posemb_size},
                                  {"output_proj_dims", c.output_proj_dims}}));
  // the multimodal embedder normalises and projects the embedder's mm_embed_dim-wide output
  if (c.output_proj_dims != c.mm_embed_dim)
    return make_error("{}: output_proj_dims {} must equal mm_embed_dim {}", where, c.output_proj_dims, c.mm_embed_dim);
  if (!(c.rms_norm_eps > 0.0)) return make_error("{}: rms_norm_eps must be positive", where);
  return c;
}

Result<std::unique_ptr<Gemma4ImageEncoder>> load_gemma4_image_encoder(const ModelConfigFile& file, WeightLoader& w,
                                                                      int64_t text_hidden, std::string& missing) {
  if (!file.root.contains("vision_config") || !file.root["vision_config"].is_object()) {
    missing = "its config.json describes no vision_config";
    return std::unique_ptr<Gemma4ImageEncoder>();
  }
  const std::string where = file.path + " vision_config";
  // a vision_config kiln cannot run leaves the text model running: images are refused, saying why
  if (file.outer_model_type == "gemma4_unified") {
    auto c = parse_gemma4_unified_vision_config(file.root["vision_config"], where);
    if (!c.ok()) {
      missing = c.error().message;
      return std::unique_ptr<Gemma4ImageEncoder>();
    }
    return load_front(std::make_unique<Gemma4UnifiedVision>(*c, w.backend(), text_hidden), w, missing);
  }
  auto c = parse_gemma4_vision_config(file.root["vision_config"], where);
  if (!c.ok()) {
    missing = c.error().message;
    return std::unique_ptr<Gemma4ImageEncoder>();
  }
  return load_front(std::make_unique<Gemma4VisionTower>(*c, w.backend(), text_hidden), w, missing);
}

}  // namespace kiln
