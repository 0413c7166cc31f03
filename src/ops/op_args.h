// The arguments of the sequence ops (attention, recurrent rules, MoE), shared by every backend.
// Kept free of heavy includes so that device-compiler sources can use them.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace kiln {

enum class Activation { silu, gelu_tanh };

// What follows a linear layer's bias (Backend::bias_act): nothing, GELU's tanh approximation
// (transformers' "gelu_pytorch_tanh"), or the exact GELU through erf (torch's nn.GELU()).
enum class BiasActivation { none, gelu_tanh, gelu_erf };

// The rows of a batch that belong to one sequence, and the position of the first in it.
struct SeqRows {
  int64_t row_begin = 0;
  int64_t n_rows = 0;
  int64_t pos_begin = 0;
};

// How an attention cache stores keys and values: in the activations' type (bits 0), or as MLX's
// affine codes of `bits` (4 or 8) per element with an f16 scale and bias per `group_size` elements
// of each head's vector (mlx-lm's QuantizedKVCache; src/quant/affine.h). A key or value is
// quantized as it is written, and attention reads the codes.
struct KvQuant {
  int bits = 0;
  int group_size = 64;
  bool quantized() const { return bits != 0; }
};

// One layer's attention cache of one sequence: a ring of `capacity` slots. A token at position p
// lives in slot p % capacity; slot_pos says which position each slot holds (-1: empty), so that
// masks follow positions, not slots. A quantized cache's k and v are quantized tensors (packed
// codes, and scales and biases [capacity, n_kv_heads, head_dim / group_size] f16 in quant()).
struct KvCacheView {
  Tensor k;         // [capacity, n_kv_heads, head_dim]
  Tensor v;         // [capacity, n_kv_heads, head_dim]
  Tensor slot_pos;  // [capacity] i32
  int64_t capacity = 0;
};

struct KvWriteArgs {
  Tensor k;          // [T, n_kv_heads, head_dim]
  Tensor v;          // [T, n_kv_heads, head_dim]
  Tensor positions;  // [T] i32: each row's position in its sequence
  std::vector<SeqRows> seqs;
  std::vector<KvCacheView> caches;  // one per entry of seqs
};

// Causal attention of the batch's queries over their sequences' caches (already holding the
// batch's own keys). A key at position j is visible to a query at position i = positions[row] when
// j <= i and, with a window W > 0, i - j < W. Queries that all take their sequence's last position
// see every key of it: bidirectional attention (a vision encoder's patches).
//
// Bidirectional blocks (the tokens of an image, which see each other): with `blocks`, query row r
// also sees the keys at positions [first, last] = blocks[r]; a row whose last < first sees no more
// than causally. With block_window, those keys still obey the window (visible when (j <= i or
// first <= j <= last) and i - j < W); without, they are visible wherever they are (visible when
// j <= i and i - j < W, or first <= j <= last). A block's keys must be in the cache: the positions
// up to the chunk's last.
struct AttentionArgs {
  Tensor q;          // [T, n_heads, head_dim]
  Tensor out;        // [T, n_heads, head_dim]
  Tensor positions;  // [T] i32
  std::vector<SeqRows> seqs;
  // A GPU may read the positions and the caches while the op before this one still runs: that op
  // may write only the slots of these rows' positions.
  std::vector<KvCacheView> caches;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;
  int64_t window = 0;
  // [T · n_heads, head_dim] (row-strided allowed) or undefined: then out = attention ⊙
  // sigmoid(output_gate), the output rounded to its type before the gate as sigmoid_mul would.
  Tensor output_gate;
  Tensor blocks;  // [T, 2] i32 or undefined: each row's bidirectional block (above)
  bool block_window = false;
};

// Rotary embedding, rotate-half convention: element i (< n_pairs) of each head pairs with element
// i + pair_offset and turns by position · inv_freq[i]; other elements pass through.
//
// With `pair_axis`, positions has several axes ([axes, T], axis-major) and pair i turns by its own
// axis's position, positions[pair_axis[i], t]: multimodal RoPE, where frequencies follow a token's
// time, row or column (Qwen 3.5's text model), or a patch's row or column (its vision encoder).
//
// With `normalize`, each head is first RMS-normalised and scaled by norm_weight + norm_offset (no
// scale when norm_weight is undefined): the per-head q/k norms folded into the rotation. `input`,
// when defined, is read instead of x (row-strided allowed) and x receives the result. An empty
// inv_freq rotates nothing.
struct RopeArgs {
  Tensor x;          // [T, n_heads, head_dim], rotated in place
  Tensor positions;  // [T] i32, or [axes, T] i32 with pair_axis
  Tensor inv_freq;   // [n_pairs] f32
  int pair_offset = 0;
  bool normalize = false;
  Tensor input;        // [T · n_heads, head_dim] or undefined
  Tensor norm_weight;  // [head_dim] f32 or undefined
  float norm_eps = 1e-6f;
  float norm_offset = 0.0f;
  Tensor pair_axis;  // [n_pairs] i32 or undefined: every pair follows positions [T]
};

// The keys and values a step adds to the caches, and its queries, in one op: q and k normalised
// per head and rotated (their RopeArgs, normalize set), v normalised per head without a weight when
// v_input is defined (v = rms_norm(v_input); v_input may be the keys' projection itself, which is
// read before k changes), then k and v written into the caches as kv_write does (kv.k is k.x,
// kv.v is v).
struct AttentionInputsArgs {
  RopeArgs q;
  RopeArgs k;
  Tensor v;        // [T, n_kv_heads, head_dim]
  Tensor v_input;  // [T · n_kv_heads, head_dim] or undefined: v as it is
  float v_norm_eps = 1e-6f;
  KvWriteArgs kv;
};

// The residual update between two blocks and the norm the next block reads:
//   residual = (residual + b) · scale,  b = rms_norm(block_out) · (block_norm + norm_offset) when
//   block_norm is defined, else block_out;
//   next = rms_norm(residual) · (next_norm + norm_offset)  (plain norm when next_norm is undefined),
//   computed only when next is defined.
struct ResidualNormArgs {
  Tensor residual;    // [T, hidden], updated
  Tensor block_out;   // [T, hidden]
  Tensor block_norm;  // [hidden] f32 or undefined
  Tensor next;        // [T, hidden] or undefined
  Tensor next_norm;   // [hidden] f32 or undefined
  // Further norms of the same updated residual under other weights (a MoE layer's router and
  // expert inputs), each computed when its output is defined.
  std::array<Tensor, 2> more_next;
  std::array<Tensor, 2> more_next_norm;
  float eps = 1e-6f;
  float norm_offset = 0.0f;
  float scale = 1.0f;
};

// One of several products of the same input: out = x · weightᵀ.
struct MatmulProduct {
  Tensor weight;  // [n, k]
  Tensor out;     // [T, n]
};

// Depthwise causal conv1d over time whose last kernel-1 inputs carry over between calls.
struct CausalConvArgs {
  Tensor x;       // [T, channels]
  Tensor weight;  // [channels, kernel]
  Tensor out;     // [T, channels]
  std::vector<SeqRows> seqs;
  std::vector<Tensor> states;  // per sequence: [kernel - 1, channels], updated
  bool silu = true;
};

enum class DeltaRuleAlgorithm { chunked, recurrent };

// The gated delta rule of Gated DeltaNet (Qwen 3.5 linear attention), per value head h with
// state S [k_dim, v_dim] (f32):
//   q, k = l2norm(q), l2norm(k); q *= k_dim^-1/2; beta = sigmoid(b); g = -exp(A_log) softplus(a + dt_bias)
//   S = exp(g) S;  S += k (beta (v - Sᵀk))ᵀ;  o = Sᵀ q
// Value head h reads query/key head h / (n_v_heads / n_k_heads).
struct GatedDeltaArgs {
  Tensor qkv;      // [T, 2 n_k_heads k_dim + n_v_heads v_dim]: q | k | v, after the conv
  Tensor a;        // [T, n_v_heads]
  Tensor b;        // [T, n_v_heads]
  Tensor a_log;    // [n_v_heads] f32
  Tensor dt_bias;  // [n_v_heads] f32
  Tensor out;      // [T, n_v_heads v_dim]
  std::vector<SeqRows> seqs;
  // per sequence: [n_v_heads, k_dim, v_dim] f32, updated. A GPU may read them while the op before
  // this one still runs, so that op must not write them.
  std::vector<Tensor> states;
  int n_k_heads = 0;
  int n_v_heads = 0;
  int k_dim = 0;
  int v_dim = 0;
  DeltaRuleAlgorithm algorithm = DeltaRuleAlgorithm::chunked;
  int chunk_size = 64;
  // When norm_weight is defined, out then takes the DeltaNet's output norm per value head,
  // out = rms_norm(out) · norm_weight · silu(norm_z) (rms_norm_gated on the stored out).
  Tensor norm_z;       // [T, n_v_heads v_dim], contiguous
  Tensor norm_weight;  // [v_dim] f32
  float norm_eps = 1e-6f;
};

// Router: softmax over experts, top-k, optional renormalisation to sum 1, optional per-expert scale.
struct MoeRouteArgs {
  Tensor logits;        // [T, n_experts]
  Tensor expert_scale;  // [n_experts] f32, or undefined
  Tensor ids;           // out: [T, top_k] i32
  Tensor weights;       // out: [T, top_k] f32
  int top_k = 0;
  bool renormalize = true;
};

// out = Σ_k weights[t,k] · down_e(act(gate_e x) ⊙ up_e x), e = ids[t,k].
struct MoeExpertsArgs {
  Tensor x;        // [T, hidden]
  Tensor ids;      // [T, top_k] i32
  Tensor weights;  // [T, top_k] f32
  Tensor gate;     // [n_experts, inter, hidden]
  Tensor up;       // [n_experts, inter, hidden]
  Tensor down;     // [n_experts, hidden, inter]
  Tensor out;      // [T, hidden]
  Activation act = Activation::silu;
};

}  // namespace kiln
