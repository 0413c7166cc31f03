// Qwen 3.5's vision encoder. Read against transformers' modeling_qwen3_5.py (Qwen3_5VisionModel and
// its modules) and vision_utils.py.
#include "models/qwen3_5/vision.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace kiln {

Result<Qwen35VisionConfig> parse_qwen3_5_vision_config(const nlohmann::json& vision_config, const std::string& where) {
  const nlohmann::json empty = nlohmann::json::object();
  const nlohmann::json& j = vision_config.is_object() ? vision_config : empty;
  if (!vision_config.is_null() && !vision_config.is_object())
    return make_error("{}: must be an object, got {}", where, vision_config.dump());
  ConfigReader r(j, where);
  Qwen35VisionConfig c;
  c.depth = r.get_int("depth", c.depth);
  c.hidden_size = r.get_int("hidden_size", c.hidden_size);
  c.hidden_act = r.get_string("hidden_act", c.hidden_act);
  c.intermediate_size = r.get_int("intermediate_size", c.intermediate_size);
  c.num_heads = r.get_int("num_heads", c.num_heads);
  c.in_channels = r.get_int("in_channels", c.in_channels);
  c.patch_size = r.get_int("patch_size", c.patch_size);
  c.spatial_merge_size = r.get_int("spatial_merge_size", c.spatial_merge_size);
  c.temporal_patch_size = r.get_int("temporal_patch_size", c.temporal_patch_size);
  c.out_hidden_size = r.get_int("out_hidden_size", c.out_hidden_size);
  c.num_position_embeddings = r.get_int("num_position_embeddings", c.num_position_embeddings);
  if (r.has("rope_parameters")) {
    if (!j["rope_parameters"].is_object()) return make_error("{}: 'rope_parameters' must be an object", where);
    ConfigReader rp(j["rope_parameters"], where + " rope_parameters");
    const std::string type = rp.get_string("rope_type", "axial");
    if (type != "axial") rp.fail("rope_type '" + type + "' is not supported (axial)");
    c.rope_theta = rp.get_float("rope_theta", c.rope_theta);
    KILN_TRY(rp.status());
  }
  KILN_TRY(r.status());
  for (auto [key, v] : {std::pair{"depth", c.depth},
                        {"hidden_size", c.hidden_size},
                        {"intermediate_size", c.intermediate_size},
                        {"num_heads", c.num_heads},
                        {"in_channels", c.in_channels},
                        {"patch_size", c.patch_size},
                        {"spatial_merge_size", c.spatial_merge_size},
                        {"temporal_patch_size", c.temporal_patch_size},
                        {"out_hidden_size", c.out_hidden_size},
                        {"num_position_embeddings", c.num_position_embeddings}})
    if (v < 1) return make_error("{}: '{}' must be at least 1, got {}", where, key, v);
  if (c.hidden_size % c.num_heads || c.head_dim() % 4)
    return make_error(
        "{}: hidden_size {} over {} heads must give a head size that is a multiple of 4 (the rotary "
        "embedding turns a quarter of each head by rows, a quarter by columns)",
        where, c.hidden_size, c.num_heads);
  if (c.hidden_act != "gelu_pytorch_tanh" && c.hidden_act != "gelu")
    return make_error("{}: hidden_act '{}' is not supported (gelu_pytorch_tanh, gelu)", where, c.hidden_act);
  if (!(c.rope_theta > 0.0) || !std::isfinite(c.rope_theta))
    return make_error("{}: rope_theta {} must be positive", where, c.rope_theta);
  return c;
}

namespace {

// The (row, column) in its frame of the patch at `index` of a frame's h × w patches, in the order
// the image processor emits them (blocks of merge × merge patches).
struct PatchAt {
  int64_t row, col;
};
PatchAt patch_at(int64_t index, int64_t w, int64_t merge) {
  const int64_t in_col = index % merge, in_row = (index / merge) % merge;
  const int64_t blocks_w = w / merge;
  const int64_t block_col = (index / (merge * merge)) % blocks_w, block_row = index / (merge * merge * blocks_w);
  return PatchAt{block_row * merge + in_row, block_col * merge + in_col};
}

// The two table rows an axis position reads and their weights (bilinear, aligned corners), in f32
// the way the reference forms them: src = index · (side - 1) / max(size - 1, 1), weights
// max(0, 1 - |src - floor(src) - tap|).
struct AxisTaps {
  int64_t tap[2];
  float weight[2];
};
AxisTaps axis_taps(int64_t index, int64_t size, int64_t side) {
  const float src = float(index) * float(side - 1) / float(std::max<int64_t>(size - 1, 1));
  const float floor = std::floor(src);
  AxisTaps a;
  for (int o = 0; o < 2; ++o) {
    a.tap[o] = std::clamp<int64_t>(int64_t(floor) + o, 0, side - 1);
    a.weight[o] = std::max(0.0f, 1.0f - std::fabs(src - floor - float(o)));
  }
  return a;
}

}  // namespace

std::vector<int32_t> qwen3_5_vision_patch_positions(int64_t t, int64_t h, int64_t w, int64_t merge) {
  const int64_t n = t * h * w;
  std::vector<int32_t> out(size_t(2 * n));
  for (int64_t i = 0; i < n; ++i) {
    const PatchAt p = patch_at(i % (h * w), w, merge);
    out[size_t(i)] = int32_t(p.row);
    out[size_t(n + i)] = int32_t(p.col);
  }
  return out;
}

Tensor qwen3_5_vision_position_embeddings(const Tensor& table, int64_t side, int64_t t, int64_t h, int64_t w,
                                          int64_t merge) {
  const int64_t n = t * h * w, hidden = table.cols();
  Tensor out = host_tensor(DType::f32, Shape{n, hidden});
  const float* rows = table.data_as<float>();
  for (int64_t i = 0; i < n; ++i) {
    const PatchAt p = patch_at(i % (h * w), w, merge);
    const AxisTaps ht = axis_taps(p.row, h, side), wt = axis_taps(p.col, w, side);
    float* o = out.data_as<float>() + i * hidden;
    std::fill(o, o + hidden, 0.0f);
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 2; ++b) {  // the four taps in the reference's order, each weight an f32 product
        const float weight = ht.weight[a] * wt.weight[b];
        const float* row = rows + (ht.tap[a] * side + wt.tap[b]) * hidden;
        for (int64_t c = 0; c < hidden; ++c) o[c] += row[c] * weight;
      }
  }
  return out;
}

namespace {

// The patch embedding's Conv3d weight as a [hidden, C·T·P·P] matrix in the pixels' order (channel,
// frame, row, column). transformers stores [hidden, C, T, P, P]; mlx-vlm moves the channels last,
// [hidden, T, P, P, C].
Result<Tensor> patch_embed_matrix(WeightLoader& w, const std::string& name, const Qwen35VisionConfig& c,
                                  bool mlx_names) {
  const int64_t H = c.hidden_size, C = c.in_channels, T = c.temporal_patch_size, P = c.patch_size;
  const std::string module = name.substr(0, name.size() - std::string(".weight").size());
  if (w.has(module + ".scales")) return make_error("the patch embedding {} is quantized: not supported", module);
  KILN_ASSIGN(Tensor stored, w.store().get(name));
  const Shape hf{H, C, T, P, P}, mlx{H, T, P, P, C};
  const bool is_hf = stored.shape() == hf, is_mlx = stored.shape() == mlx;
  if (!is_hf && !is_mlx)
    return make_error("tensor {} has shape {}, expected {} (transformers) or {} (mlx-vlm)", w.store().describe(name),
                      stored.shape().str(), hf.str(), mlx.str());
  Tensor host = to_f32_host(stored);
  if (is_mlx && (!is_hf || mlx_names)) {  // channels last: back to the pixels' order
    Tensor moved = host_tensor(DType::f32, Shape{H, C * T * P * P});
    const float* src = host.data_as<float>();
    float* dst = moved.data_as<float>();
    for (int64_t o = 0; o < H; ++o)
      for (int64_t ch = 0; ch < C; ++ch)
        for (int64_t f = 0; f < T; ++f)
          for (int64_t y = 0; y < P; ++y)
            for (int64_t x = 0; x < P; ++x)
              dst[(((o * C + ch) * T + f) * P + y) * P + x] = src[(((o * T + f) * P + y) * P + x) * C + ch];
    host = moved;
  }
  return w.backend().upload(host.reshape(Shape{H, C * T * P * P}), w.backend().matrix_dtype());
}

}  // namespace

Result<Qwen35VisionEncoder> Qwen35VisionEncoder::load(const Qwen35VisionConfig& config, WeightLoader& w,
                                                      const std::string& prefix, int64_t text_hidden) {
  const Qwen35VisionConfig& c = config;
  if (c.out_hidden_size != text_hidden)
    return make_error("vision_config out_hidden_size {} differs from the text model's hidden_size {}",
                      c.out_hidden_size, text_hidden);
  Qwen35VisionEncoder e;
  e.config_ = c;
  e.mlp_act_ = c.hidden_act == "gelu" ? BiasActivation::gelu_erf : BiasActivation::gelu_tanh;
  const int64_t H = c.hidden_size, I = c.intermediate_size, merged = H * c.spatial_merge_size * c.spatial_merge_size;

  auto linear = [&](const std::string& name, int64_t out, int64_t in) -> Result<Linear> {
    Linear l;
    KILN_ASSIGN(l.weight, w.matrix(prefix + name + ".weight", Shape{out, in}));
    KILN_ASSIGN(l.bias, w.vector(prefix + name + ".bias", Shape{out}));
    return l;
  };
  auto layer_norm = [&](const std::string& name, int64_t dim) -> Result<LayerNorm> {
    LayerNorm n;
    KILN_ASSIGN(n.weight, w.vector(prefix + name + ".weight", Shape{dim}));
    KILN_ASSIGN(n.bias, w.vector(prefix + name + ".bias", Shape{dim}));
    return n;
  };

  KILN_ASSIGN(e.patch_embed_proj_.weight,
              patch_embed_matrix(w, prefix + "patch_embed.proj.weight", c, prefix == "vision_tower."));
  KILN_ASSIGN(e.patch_embed_proj_.bias, w.vector(prefix + "patch_embed.proj.bias", Shape{H}));
  KILN_ASSIGN(e.pos_embed_, w.host_matrix_f32(prefix + "pos_embed.weight", Shape{c.num_position_embeddings, H}));
  e.grid_side_ = int64_t(std::sqrt(double(c.num_position_embeddings)));
  while (e.grid_side_ * e.grid_side_ > c.num_position_embeddings) --e.grid_side_;
  while ((e.grid_side_ + 1) * (e.grid_side_ + 1) <= c.num_position_embeddings) ++e.grid_side_;

  // the axial rotation over whole heads: pairs (i, i + head_dim/2); the first head_dim/4 follow the
  // patch's row, the next head_dim/4 its column, with the same frequencies
  const int64_t hd = c.head_dim(), quarter = hd / 4, spatial = hd / 2;
  Tensor inv_freq = host_tensor(DType::f32, Shape{spatial});
  Tensor axis = host_tensor(DType::i32, Shape{spatial});
  for (int64_t j = 0; j < quarter; ++j) {
    const float f = 1.0f / std::pow(float(c.rope_theta), float(2 * j) / float(spatial));
    inv_freq.data_as<float>()[j] = inv_freq.data_as<float>()[quarter + j] = f;
    axis.data_as<int32_t>()[j] = 0;
    axis.data_as<int32_t>()[quarter + j] = 1;
  }
  e.rope_inv_freq_ = w.backend().upload(inv_freq, DType::f32);
  e.rope_pair_axis_ = w.backend().upload(axis, DType::i32);

  for (int64_t i = 0; i < c.depth; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    Block block;
    KILN_ASSIGN(block.norm1, layer_norm(b + "norm1", H));
    KILN_ASSIGN(block.norm2, layer_norm(b + "norm2", H));
    KILN_ASSIGN(block.attn_qkv, linear(b + "attn.qkv", 3 * H, H));
    KILN_ASSIGN(block.attn_proj, linear(b + "attn.proj", H, H));
    KILN_ASSIGN(block.mlp_linear_fc1, linear(b + "mlp.linear_fc1", I, H));
    KILN_ASSIGN(block.mlp_linear_fc2, linear(b + "mlp.linear_fc2", H, I));
    e.blocks_.push_back(std::move(block));
  }
  KILN_ASSIGN(e.merger_norm_, layer_norm("merger.norm", H));
  KILN_ASSIGN(e.merger_linear_fc1_, linear("merger.linear_fc1", merged, merged));
  KILN_ASSIGN(e.merger_linear_fc2_, linear("merger.linear_fc2", c.out_hidden_size, merged));
  return e;
}

// Qwen3_5VisionAttention: the fused q/k/v projection, the axial rotation of q and k, attention of
// every patch over every patch of its frame (the reference's cu_seqlens segments), the output
// projection. The attention op is causal by positions: each frame's keys sit at 0 … n-1 of a cache
// of its own and every query at n-1, which shows it all of them.
Tensor Qwen35VisionEncoder::attention(Backend& backend, const Block& block, const Tensor& x,
                                      const Tensor& rope_positions, const std::vector<SeqRows>& frames,
                                      const std::vector<KvCacheView>& caches, const Tensor& slot_positions,
                                      const Tensor& query_positions) const {
  const int64_t N = x.rows(), H = config_.hidden_size, heads = config_.num_heads, hd = config_.head_dim();
  const DType dt = backend.activation_dtype();
  Tensor qkv = backend.alloc(dt, Shape{N, 3 * H});  // per row: q | k | v, each [heads, head_dim]
  backend.matmul(x, block.attn_qkv.weight, qkv);
  backend.bias_act(qkv, block.attn_qkv.bias, BiasActivation::none, qkv);
  Tensor q = backend.alloc(dt, Shape{N, heads, hd}), k = backend.alloc(dt, Shape{N, heads, hd}),
         v = backend.alloc(dt, Shape{N, heads, hd});
  for (int part = 0; part < 3; ++part) {
    Tensor dst = (part == 0 ? q : part == 1 ? k : v).reshape(Shape{N, H});
    backend.copy(qkv.cols_view(part * H, H), dst);
  }
  for (Tensor* t : {&q, &k})
    backend.rope(RopeArgs{.x = *t,
                          .positions = rope_positions,
                          .inv_freq = rope_inv_freq_,
                          .pair_offset = int(hd / 2),
                          .pair_axis = rope_pair_axis_});
  backend.kv_write(KvWriteArgs{.k = k, .v = v, .positions = slot_positions, .seqs = frames, .caches = caches});
  Tensor o = backend.alloc(dt, Shape{N, heads, hd});
  backend.attention(AttentionArgs{.q = q,
                                  .out = o,
                                  .positions = query_positions,
                                  .seqs = frames,
                                  .caches = caches,
                                  .n_heads = int(heads),
                                  .n_kv_heads = int(heads),
                                  .head_dim = int(hd),
                                  .scale = float(1.0 / std::sqrt(double(hd)))});
  Tensor out = backend.alloc(dt, Shape{N, H});
  backend.matmul(o.reshape(Shape{N, H}), block.attn_proj.weight, out);
  backend.bias_act(out, block.attn_proj.bias, BiasActivation::none, out);
  return out;
}

Result<Tensor> Qwen35VisionEncoder::encode(Backend& backend, const ProcessedImage& image,
                                           const VisionDump& dump) const {
  const Qwen35VisionConfig& c = config_;
  const int64_t m = c.spatial_merge_size, H = c.hidden_size;
  if (image.grid.size() != 3)
    return make_error("a Qwen 3.5 image's patch grid is {{t, h, w}}, got {} values", image.grid.size());
  const int64_t t = image.grid[0], h = image.grid[1], w = image.grid[2];
  if (t < 1 || h < 1 || w < 1 || h % m || w % m)
    return make_error("patch grid {}x{}x{}: h and w must be positive multiples of spatial_merge_size {}", t, h, w, m);
  const int64_t N = t * h * w, frame = h * w;
  if (!image.pixels.defined() || image.pixels.device() != Device::cpu || image.pixels.dtype() != DType::f32 ||
      image.pixels.shape() != Shape{N, c.patch_values()})
    return make_error("image pixels must be host f32 [{}, {}] for a {}x{}x{} grid of {}-channel {}x{}x{} patches", N,
                      c.patch_values(), t, h, w, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size);
  if (image.soft_tokens != N / (m * m))
    return make_error("the image's {} soft tokens do not match its {}x{}x{} grid merged {}x{} ({})", image.soft_tokens,
                      t, h, w, m, m, N / (m * m));
  auto record = [&](const std::string& name, const Tensor& value) {
    if (dump) dump(name, value);
  };
  const DType dt = backend.activation_dtype();

  // Qwen3_5VisionPatchEmbed (the Conv3d over whole patches: a product) and the resampled position table
  Tensor hidden = backend.alloc(dt, Shape{N, H});  // [patches, hidden]
  backend.matmul(backend.upload(image.pixels, dt), patch_embed_proj_.weight, hidden);
  backend.bias_act(hidden, patch_embed_proj_.bias, BiasActivation::none, hidden);
  record("visual.patch_embed", hidden);
  const Tensor pos = backend.upload(qwen3_5_vision_position_embeddings(pos_embed_, grid_side_, t, h, w, m), dt);
  backend.add(hidden, pos, 1.0f, hidden);

  // the rotary positions, and each frame's attention: its own cache, keys at 0 … frame-1
  const std::vector<int32_t> patch_positions = qwen3_5_vision_patch_positions(t, h, w, m);
  Tensor rope_host = host_tensor(DType::i32, Shape{2, N});
  std::copy(patch_positions.begin(), patch_positions.end(), rope_host.data_as<int32_t>());
  const Tensor rope_positions = backend.upload(rope_host, DType::i32);
  Tensor slots = host_tensor(DType::i32, Shape{N}), queries = host_tensor(DType::i32, Shape{N});
  for (int64_t i = 0; i < N; ++i) {
    slots.data_as<int32_t>()[i] = int32_t(i % frame);
    queries.data_as<int32_t>()[i] = int32_t(frame - 1);
  }
  const Tensor slot_positions = backend.upload(slots, DType::i32),
               query_positions = backend.upload(queries, DType::i32);
  std::vector<SeqRows> frames;
  std::vector<KvCacheView> caches;
  for (int64_t f = 0; f < t; ++f) {
    frames.push_back(SeqRows{.row_begin = f * frame, .n_rows = frame, .pos_begin = 0});
    KvCacheView cache;
    cache.capacity = frame;
    cache.k = backend.alloc_cache(dt, Shape{frame, c.num_heads, c.head_dim()});
    cache.v = backend.alloc_cache(dt, Shape{frame, c.num_heads, c.head_dim()});
    cache.slot_pos = backend.alloc(DType::i32, Shape{frame});
    backend.fill(cache.slot_pos, -1.0f);
    caches.push_back(cache);
  }

  // Qwen3_5VisionBlock: pre-norm attention and MLP, each added to the residual stream
  const float eps = 1e-6f;
  Tensor normed = backend.alloc(dt, Shape{N, H});
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const Block& b = blocks_[i];
    backend.layer_norm(hidden, b.norm1.weight, b.norm1.bias, eps, normed);
    const Tensor attn = attention(backend, b, normed, rope_positions, frames, caches, slot_positions, query_positions);
    backend.add(hidden, attn, 1.0f, hidden);
    backend.layer_norm(hidden, b.norm2.weight, b.norm2.bias, eps, normed);
    Tensor up = backend.alloc(dt, Shape{N, c.intermediate_size});
    backend.matmul(normed, b.mlp_linear_fc1.weight, up);
    backend.bias_act(up, b.mlp_linear_fc1.bias, mlp_act_, up);
    Tensor down = backend.alloc(dt, Shape{N, H});
    backend.matmul(up, b.mlp_linear_fc2.weight, down);
    backend.bias_act(down, b.mlp_linear_fc2.bias, BiasActivation::none, down);
    backend.add(hidden, down, 1.0f, hidden);
    record(fmt::format("visual.blocks.{}", i), hidden);
  }

  // Qwen3_5VisionPatchMerger: norm each patch, then each merge × merge block of consecutive patches
  // as one row (the processor's order keeps a block's patches together), GELU (erf) MLP
  const int64_t tokens = N / (m * m), merged = H * m * m;
  backend.layer_norm(hidden, merger_norm_.weight, merger_norm_.bias, eps, normed);
  Tensor mid = backend.alloc(dt, Shape{tokens, merged});
  backend.matmul(normed.reshape(Shape{tokens, merged}), merger_linear_fc1_.weight, mid);
  backend.bias_act(mid, merger_linear_fc1_.bias, BiasActivation::gelu_erf, mid);
  Tensor out = backend.alloc(dt, Shape{tokens, c.out_hidden_size});  // [soft tokens, text hidden]
  backend.matmul(mid, merger_linear_fc2_.weight, out);
  backend.bias_act(out, merger_linear_fc2_.bias, BiasActivation::none, out);
  record("visual.merger", out);
  return out;
}

}  // namespace kiln
