// Pieces of softmax attention shared by the model families: RoPE tables and attention over the
// per-sequence KV rings.
#pragma once

#include <string>

#include "layers/batch.h"
#include "ops/backend.h"

namespace kiln {

// A layer type's rotary embedding: inv_freq [n_pairs] f32 on the backend; element i of a head
// pairs with element i + pair_offset. With pair_axis ([n_pairs] i32 on the backend), pair i turns
// by axis pair_axis[i] of the batch's rope_positions (multimodal RoPE); without, by the tokens'
// positions.
struct RopeTable {
  Tensor inv_freq;
  int pair_offset = 0;
  Tensor pair_axis;
};

// Standard RoPE over the first `rotary_dim` elements of each head (rotate-half within them):
// inv_freq_i = theta^(-2i / rotary_dim) / factor.
RopeTable make_rope(Backend& backend, int rotary_dim, double theta, double factor = 1.0);
// Gemma 4's "proportional" RoPE: angles keep the full head's exponent base
// (inv_freq_i = theta^(-2i / head_dim) / factor) but only the first int(partial · head_dim / 2)
// pairs rotate; a pair is (i, i + head_dim / 2).
RopeTable make_proportional_rope(Backend& backend, int head_dim, double theta, double partial_factor,
                                 double factor = 1.0);

void apply_rope(Backend& backend, const BatchLayout& batch, const RopeTable& rope, Tensor& x);

// The per-head RMS norm of q or k (weight + offset; no scale when weight is undefined) followed by
// RoPE, in one op; `input` (row-strided allowed) is read instead of x when given.
struct HeadNorm {
  Tensor weight;
  float eps = 1e-6f;
  float offset = 0.0f;
};
void norm_and_rope(Backend& backend, const BatchLayout& batch, const RopeTable& rope, const HeadNorm& norm, Tensor& x,
                   const Tensor& input = Tensor());

// A step's attention inputs in one op (Backend::attention_inputs): q and k normalised per head and
// rotated (q read from q_input when given), v normalised without a weight when v_input is given
// (which may be k's own projection), and k and v written into layer `cache_layer`'s cache of every
// sequence; cached_attention then needs no k and v.
struct AttentionInputs {
  HeadNorm q_norm, k_norm;
  Tensor q_input;  // row-strided allowed, or undefined
  Tensor v_input;  // [T · n_kv_heads, head_dim] or undefined
  float v_norm_eps = 1e-6f;
};
void write_attention_inputs(Backend& backend, const BatchLayout& batch, int cache_layer, const RopeTable& rope,
                            const AttentionInputs& in, Tensor& q, Tensor& k, Tensor& v);

struct AttentionShape {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;
  int64_t window = 0;  // 0: full causal
  // bidirectional blocks ([T, 2] i32 or undefined) and whether they obey the window (AttentionArgs)
  Tensor blocks;
  bool block_window = false;
};

// Writes k and v (when given) into layer `cache_layer`'s cache of every sequence, then attends q
// over that cache. q [T, n_heads, head_dim]; returns [T, n_heads · head_dim], multiplied by
// sigmoid(output_gate) when that is given ([T · n_heads, head_dim], row-strided allowed).
Tensor cached_attention(Backend& backend, const BatchLayout& batch, int cache_layer, const Tensor& q, const Tensor* k,
                        const Tensor* v, const AttentionShape& shape, const Tensor& output_gate = Tensor());

// A cache for one attention layer of one sequence, in the activations' type or quantized.
KvCacheView new_kv_cache(Backend& backend, int64_t capacity, int n_kv_heads, int head_dim, KvQuant quant = {});

// Whether a layer's cache can take `quant`: bits 4 or 8, a group size of 32, 64 or 128 that divides
// the head; the error names the layer.
Status check_kv_quant(const KvQuant& quant, int head_dim, int layer);

// Bytes one cached token takes in one attention layer (keys, values, their scales and biases, and
// the slot's position).
size_t kv_bytes_per_token(int n_kv_heads, int head_dim, KvQuant quant, DType activation_dtype);

}  // namespace kiln
