#include "layers/attention.h"

#include <cmath>
#include <vector>

namespace kiln {

namespace {

RopeTable upload_table(Backend& backend, const std::vector<float>& freqs, int pair_offset) {
  Tensor host = host_tensor(DType::f32, Shape{int64_t(freqs.size())});
  std::copy(freqs.begin(), freqs.end(), host.data_as<float>());
  return RopeTable{backend.upload(host, DType::f32), pair_offset};
}

// base^(-e) the way the reference computes it: the exponent and the power in f32.
float inverse_power(double base, float exponent) {
  return 1.0f / std::pow(float(base), exponent);
}

}  // namespace

RopeTable make_rope(Backend& backend, int rotary_dim, double theta, double factor) {
  std::vector<float> freqs(static_cast<size_t>(rotary_dim / 2));
  for (int i = 0; i < rotary_dim / 2; ++i)
    freqs[size_t(i)] = inverse_power(theta, float(2 * i) / float(rotary_dim)) / float(factor);
  return upload_table(backend, freqs, rotary_dim / 2);
}

RopeTable make_proportional_rope(Backend& backend, int head_dim, double theta, double partial_factor, double factor) {
  const int rotated = int(std::floor(partial_factor * head_dim / 2.0));
  std::vector<float> freqs(static_cast<size_t>(rotated));
  for (int i = 0; i < rotated; ++i)
    freqs[size_t(i)] = inverse_power(theta, float(2 * i) / float(head_dim)) / float(factor);
  return upload_table(backend, freqs, head_dim / 2);
}

namespace {

// The positions a table's pairs read: the batch's rotary axes for a multimodal table.
const Tensor& rope_positions(const BatchLayout& batch, const RopeTable& rope) {
  return rope.pair_axis.defined() ? batch.rope_positions : batch.positions;
}

}  // namespace

void apply_rope(Backend& backend, const BatchLayout& batch, const RopeTable& rope, Tensor& x) {
  if (rope.inv_freq.numel() == 0) return;
  backend.rope(RopeArgs{.x = x,
                        .positions = rope_positions(batch, rope),
                        .inv_freq = rope.inv_freq,
                        .pair_offset = rope.pair_offset,
                        .pair_axis = rope.pair_axis});
}

namespace {

RopeArgs norm_rope_args(const BatchLayout& batch, const RopeTable& rope, const HeadNorm& norm, const Tensor& x,
                        const Tensor& input) {
  return RopeArgs{.x = x,
                  .positions = rope_positions(batch, rope),
                  .inv_freq = rope.inv_freq,
                  .pair_offset = rope.pair_offset,
                  .normalize = true,
                  .input = input,
                  .norm_weight = norm.weight,
                  .norm_eps = norm.eps,
                  .norm_offset = norm.offset,
                  .pair_axis = rope.pair_axis};
}

}  // namespace

void norm_and_rope(Backend& backend, const BatchLayout& batch, const RopeTable& rope, const HeadNorm& norm, Tensor& x,
                   const Tensor& input) {
  backend.rope(norm_rope_args(batch, rope, norm, x, input));
}

void write_attention_inputs(Backend& backend, const BatchLayout& batch, int cache_layer, const RopeTable& rope,
                            const AttentionInputs& in, Tensor& q, Tensor& k, Tensor& v) {
  std::vector<KvCacheView> caches;
  for (SequenceState* s : batch.states) caches.push_back(s->layers()[size_t(cache_layer)].kv);
  backend.attention_inputs(AttentionInputsArgs{
      .q = norm_rope_args(batch, rope, in.q_norm, q, in.q_input),
      .k = norm_rope_args(batch, rope, in.k_norm, k, Tensor()),
      .v = v,
      .v_input = in.v_input,
      .v_norm_eps = in.v_norm_eps,
      .kv = KvWriteArgs{.k = k, .v = v, .positions = batch.positions, .seqs = batch.seqs, .caches = caches}});
}

KvCacheView new_kv_cache(Backend& backend, int64_t capacity, int n_kv_heads, int head_dim) {
  KvCacheView c;
  c.capacity = capacity;
  c.k = backend.alloc_cache(backend.activation_dtype(), Shape{capacity, n_kv_heads, head_dim});
  c.v = backend.alloc_cache(backend.activation_dtype(), Shape{capacity, n_kv_heads, head_dim});
  c.slot_pos = backend.alloc(DType::i32, Shape{capacity});
  backend.fill(c.slot_pos, -1.0f);
  return c;
}

Tensor cached_attention(Backend& backend, const BatchLayout& batch, int cache_layer, const Tensor& q, const Tensor* k,
                        const Tensor* v, const AttentionShape& shape, const Tensor& output_gate) {
  std::vector<KvCacheView> caches;
  for (SequenceState* s : batch.states) caches.push_back(s->layers()[size_t(cache_layer)].kv);
  if (k && v)
    backend.kv_write(KvWriteArgs{.k = *k, .v = *v, .positions = batch.positions, .seqs = batch.seqs, .caches = caches});
  Tensor out = backend.alloc(backend.activation_dtype(), Shape{batch.n_tokens, shape.n_heads, shape.head_dim});
  backend.attention(AttentionArgs{.q = q,
                                  .out = out,
                                  .positions = batch.positions,
                                  .seqs = batch.seqs,
                                  .caches = caches,
                                  .n_heads = shape.n_heads,
                                  .n_kv_heads = shape.n_kv_heads,
                                  .head_dim = shape.head_dim,
                                  .scale = shape.scale,
                                  .window = shape.window,
                                  .output_gate = output_gate,
                                  .blocks = shape.blocks,
                                  .block_window = shape.block_window});
  return out.reshape(Shape{batch.n_tokens, int64_t(shape.n_heads) * shape.head_dim});
}

}  // namespace kiln
