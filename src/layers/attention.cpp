#include "layers/attention.h"

#include <cmath>
#include <vector>

#include "quant/affine.h"

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

namespace {

// A quantized [capacity, n_kv_heads, head_dim] cache tensor: packed codes, f16 scales and biases.
Tensor new_quantized_cache(Backend& backend, int64_t capacity, int n_kv_heads, int head_dim, KvQuant quant) {
  const Tensor codes = backend.alloc_cache(DType::u8, Shape{capacity, n_kv_heads, int64_t(head_dim) * quant.bits / 8});
  const Shape groups{capacity, n_kv_heads, head_dim / quant.group_size};
  return quant::make_quantized(codes, backend.alloc_cache(DType::f16, groups), backend.alloc_cache(DType::f16, groups),
                               Shape{capacity, n_kv_heads, head_dim}, quant.bits, quant.group_size);
}

}  // namespace

KvCacheView new_kv_cache(Backend& backend, int64_t capacity, int n_kv_heads, int head_dim, KvQuant quant) {
  KvCacheView c;
  c.capacity = capacity;
  if (quant.quantized()) {
    c.k = new_quantized_cache(backend, capacity, n_kv_heads, head_dim, quant);
    c.v = new_quantized_cache(backend, capacity, n_kv_heads, head_dim, quant);
  } else {
    c.k = backend.alloc_cache(backend.activation_dtype(), Shape{capacity, n_kv_heads, head_dim});
    c.v = backend.alloc_cache(backend.activation_dtype(), Shape{capacity, n_kv_heads, head_dim});
  }
  c.slot_pos = backend.alloc(DType::i32, Shape{capacity});
  backend.fill(c.slot_pos, -1.0f);
  return c;
}

Status check_kv_quant(const KvQuant& quant, int head_dim, int layer) {
  if (!quant.quantized()) return ok_status();
  if (quant.bits != 4 && quant.bits != 8)
    return make_error("layer {}: a KV cache of {} bits is not supported (4 or 8)", layer, quant.bits);
  if (!quant::supported_group_size(quant.group_size))
    return make_error("layer {}: a KV cache group size of {} is not supported (32, 64 or 128)", layer,
                      quant.group_size);
  if (head_dim % quant.group_size)
    return make_error("layer {}: its head size {} is not a multiple of the KV cache group size {}", layer, head_dim,
                      quant.group_size);
  return ok_status();
}

size_t kv_bytes_per_token(int n_kv_heads, int head_dim, KvQuant quant, DType activation_dtype) {
  const size_t elems = size_t(n_kv_heads) * size_t(head_dim);
  const size_t one = quant.quantized()
                         ? elems * size_t(quant.bits) / 8 + 2 * 2 * elems / size_t(quant.group_size)  // f16 scale, bias
                         : elems * dtype_size(activation_dtype);
  return 2 * one + sizeof(int32_t);  // keys and values, and the slot's position
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
