// The op interface: everything a model's forward pass asks of a device.
//
// Model code calls these ops on Tensors that live on the backend's device and never sees how they
// are computed. Each backend (CPU now; CUDA behind the same table) implements every op; the CPU
// implementation is the reference the others are tested against.
//
// Conventions: matrices multiply as y = x · Wᵀ with W stored [out, in] as checkpoints store it.
// A tensor's last dimension is contiguous; ops accept row-strided views where noted.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace kiln {

enum class Activation { silu, gelu_tanh };

// The rows of a batch that belong to one sequence, and the position of the first in it.
struct SeqRows {
  int64_t row_begin = 0;
  int64_t n_rows = 0;
  int64_t pos_begin = 0;
};

// One layer's attention cache of one sequence: a ring of `capacity` slots. A token at position p
// lives in slot p % capacity; slot_pos says which position each slot holds (-1: empty), so that
// masks follow positions, not slots.
struct KvCacheView {
  Tensor k;         // [capacity, n_kv_heads, head_dim]
  Tensor v;         // [capacity, n_kv_heads, head_dim]
  Tensor slot_pos;  // [capacity] i32
  int64_t capacity = 0;
};

struct KvWriteArgs {
  Tensor k;  // [T, n_kv_heads, head_dim]
  Tensor v;  // [T, n_kv_heads, head_dim]
  std::vector<SeqRows> seqs;
  std::vector<KvCacheView> caches;  // one per entry of seqs
};

// Causal attention of the batch's queries over their sequences' caches (already holding the
// batch's own keys). A key at position j is visible to a query at position i when j <= i and,
// with a window W > 0, i - j < W.
struct AttentionArgs {
  Tensor q;    // [T, n_heads, head_dim]
  Tensor out;  // [T, n_heads, head_dim]
  std::vector<SeqRows> seqs;
  std::vector<KvCacheView> caches;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;
  int64_t window = 0;
};

// Rotary embedding, rotate-half convention: element i (< n_pairs) of each head pairs with element
// i + pair_offset and turns by position · inv_freq[i]; other elements pass through.
struct RopeArgs {
  Tensor x;          // [T, n_heads, head_dim], rotated in place
  Tensor positions;  // [T] i32
  Tensor inv_freq;   // [n_pairs] f32
  int pair_offset = 0;
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
  std::vector<Tensor> states;  // per sequence: [n_v_heads, k_dim, v_dim] f32, updated
  int n_k_heads = 0;
  int n_v_heads = 0;
  int k_dim = 0;
  int v_dim = 0;
  DeltaRuleAlgorithm algorithm = DeltaRuleAlgorithm::chunked;
  int chunk_size = 64;
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

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  // The type activations and caches are kept in, and the type matrices are uploaded as.
  virtual DType activation_dtype() const = 0;
  virtual DType matrix_dtype() const = 0;

  // Memory.
  virtual Tensor alloc(DType dtype, Shape shape) = 0;
  // A copy of a host tensor on this device, converted to `dtype` (f32, f16 or bf16 sources).
  virtual Tensor upload(const Tensor& host, DType dtype) = 0;
  // A host copy of a device tensor, converted to f32 when it holds floats.
  virtual Tensor to_host(const Tensor& t) = 0;
  virtual void copy(const Tensor& src, Tensor& dst) = 0;  // same shape, row-strided allowed
  virtual void fill(Tensor& t, float value) = 0;
  virtual void synchronize() = 0;

  // Linear algebra and elementwise ops.
  virtual void matmul(const Tensor& x, const Tensor& w, Tensor& out) = 0;  // out = x · wᵀ
  virtual void embed(const Tensor& ids, const Tensor& table, float scale, Tensor& out) = 0;
  // out = x / rms(x) · (weight + weight_offset) over the last dim; no weight when undefined.
  // x and out may be row-strided views.
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, float weight_offset, Tensor& out) = 0;
  // out = rms_norm(x) · weight · silu(z)  (Gated DeltaNet's output norm)
  virtual void rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, float eps, Tensor& out) = 0;
  virtual void add(const Tensor& a, const Tensor& b, float scale, Tensor& out) = 0;  // (a + b) · scale
  virtual void scale(const Tensor& x, float s, Tensor& out) = 0;
  virtual void glu(const Tensor& gate, const Tensor& up, Activation act, Tensor& out) = 0;  // act(gate) ⊙ up
  virtual void sigmoid_mul(const Tensor& x, const Tensor& gate, Tensor& out) = 0;           // x ⊙ sigmoid(gate)
  // acc[r] += sigmoid(gate[r]) · x[r], gate [rows, 1]
  virtual void add_sigmoid_gated(Tensor& acc, const Tensor& x, const Tensor& gate) = 0;
  virtual void softcap(Tensor& x, float cap) = 0;         // cap · tanh(x / cap)
  virtual void argmax(const Tensor& x, Tensor& out) = 0;  // [R, C] -> [R] i32

  // Sequence ops.
  virtual void rope(const RopeArgs& args) = 0;
  virtual void kv_write(const KvWriteArgs& args) = 0;
  virtual void attention(const AttentionArgs& args) = 0;
  virtual void causal_conv1d(const CausalConvArgs& args) = 0;
  virtual void gated_delta(const GatedDeltaArgs& args) = 0;
  virtual void moe_route(const MoeRouteArgs& args) = 0;
  virtual void moe_experts(const MoeExpertsArgs& args) = 0;
};

}  // namespace kiln
