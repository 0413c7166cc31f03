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
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/op_args.h"

namespace kiln {

class Backend {
 public:
  virtual ~Backend() = default;

  // Device-side timing: start() and stop_ms() mark points in the op stream.
  class Timer {
   public:
    virtual ~Timer() = default;
    virtual void start() = 0;
    virtual double stop_ms() = 0;  // waits for the ops issued before it
  };
  // A recorded sequence of ops that replays without the host issuing them again (a CUDA graph).
  // Tensors allocated while recording stay valid, and are overwritten by each replay.
  class Graph {
   public:
    virtual ~Graph() = default;
    virtual Status replay() = 0;
  };

  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  // The type activations and caches are kept in, and the type matrices are uploaded as.
  virtual DType activation_dtype() const = 0;
  virtual DType matrix_dtype() const = 0;

  // Memory.
  virtual Tensor alloc(DType dtype, Shape shape) = 0;
  // Memory for a cache's keys or values. Attention kernels may multiply slots nothing was written
  // to by zero weights, so a backend whose kernels do must not hand out NaN bit patterns there.
  virtual Tensor alloc_cache(DType dtype, Shape shape) { return alloc(dtype, shape); }
  // Whether kv_write and attention take quantized caches (KvQuant).
  virtual bool quantized_kv_caches() const { return false; }
  // A copy of a host tensor on this device, converted to `dtype` (f32, f16 or bf16 sources).
  virtual Tensor upload(const Tensor& host, DType dtype) = 0;
  // A quantized host matrix (Tensor::quantized) on this device, still packed: the matrix ops read
  // its codes, scales and biases directly.
  virtual Tensor upload_quantized(const Tensor& host) = 0;
  // A host copy of a device tensor, converted to f32 when it holds floats.
  virtual Tensor to_host(const Tensor& t) = 0;
  virtual void copy(const Tensor& src, Tensor& dst) = 0;  // same shape, row-strided allowed
  virtual void fill(Tensor& t, float value) = 0;
  virtual void synchronize() = 0;
  // Measurement and replay.
  virtual std::unique_ptr<Timer> timer() = 0;
  // Device memory held now and at its peak since the last reset (0: not measured).
  virtual size_t live_memory_bytes() const { return 0; }
  virtual size_t peak_memory_bytes() const { return 0; }
  virtual void reset_peak_memory() {}
  // Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written: the
  // memory roofline a benchmark compares decode against.
  virtual double copy_bandwidth() = 0;
  virtual Result<std::unique_ptr<Graph>> capture(const std::function<Status()>& record) = 0;
  // Per-op device time while profiling is on (each op timed with device events); the report is a
  // table of time by op since profiling was switched on. Backends may leave it empty.
  virtual void set_profiling(bool on) {}
  virtual std::string profile_report() { return ""; }

  // The first device error since creation (a failed allocation or launch), which makes later
  // results meaningless; ok while none happened.
  virtual Status status() const { return ok_status(); }

  // Linear algebra and elementwise ops. A weight w (and an embedding table, and the expert stacks
  // of moe_experts) may be quantized: the backend then computes on the packed codes.
  virtual void matmul(const Tensor& x, const Tensor& w, Tensor& out) = 0;  // out = x · wᵀ
  // Several products of one input (a layer's q/k/v projections); a backend may run them as one
  // launch. The default runs them one by one.
  virtual void matmul_many(const Tensor& x, std::span<const MatmulProduct> products);
  // out = act(x · gateᵀ) ⊙ (x · upᵀ): the first half of a GLU MLP. The default is two products and
  // glu() through a scratch tensor.
  virtual void glu_matmul(const Tensor& x, const Tensor& gate, const Tensor& up, Activation act, Tensor& out);
  virtual void embed(const Tensor& ids, const Tensor& table, float scale, Tensor& out) = 0;
  // out = x / rms(x) · (weight + weight_offset) over the last dim; no weight when undefined.
  // x and out may be row-strided views.
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, float weight_offset, Tensor& out) = 0;
  // out = rms_norm(x) · weight · silu(z)  (Gated DeltaNet's output norm)
  virtual void rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, float eps, Tensor& out) = 0;
  virtual void add(const Tensor& a, const Tensor& b, float scale, Tensor& out) = 0;  // (a + b) · scale
  // LayerNorm over the last dim: out = (x - mean) / sqrt(var + eps) · weight + bias, the mean and the
  // (biased) variance in f32 or wider; no scale or shift where weight or bias (f32 [cols]) is
  // undefined. x and out may be row-strided views.
  virtual void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out) = 0;
  // out = act(x + bias): a linear layer's bias (f32 [cols], added to every row), then its activation.
  // out may be x.
  virtual void bias_act(const Tensor& x, const Tensor& bias, BiasActivation act, Tensor& out) = 0;
  // The residual update between blocks fused with the next block's input norm (see the args).
  virtual void residual_norm(const ResidualNormArgs& args) = 0;
  // args.block_out = x · wᵀ, then residual_norm(args): a block's output projection and the residual
  // update that reads it; a backend may run both as one launch. The default runs them in turn.
  virtual void matmul_residual_norm(const Tensor& x, const Tensor& w, const ResidualNormArgs& args);
  virtual void scale(const Tensor& x, float s, Tensor& out) = 0;
  virtual void glu(const Tensor& gate, const Tensor& up, Activation act, Tensor& out) = 0;  // act(gate) ⊙ up
  virtual void sigmoid_mul(const Tensor& x, const Tensor& gate, Tensor& out) = 0;           // x ⊙ sigmoid(gate)
  // acc[r] += sigmoid(gate[r]) · x[r], gate [rows, 1]
  virtual void add_sigmoid_gated(Tensor& acc, const Tensor& x, const Tensor& gate) = 0;
  virtual void softcap(Tensor& x, float cap) = 0;                            // cap · tanh(x / cap)
  virtual void clamp(const Tensor& x, float lo, float hi, Tensor& out) = 0;  // min(max(x, lo), hi)
  // out = (x · scale + shift) ⊙ mul, with shift and mul per column ([cols] f32, either undefined),
  // computed in f32 and rounded once (a bias, an affine standardisation).
  virtual void column_affine(const Tensor& x, float scale, const Tensor& shift, const Tensor& mul, Tensor& out) = 0;
  // out[r] = scale · Σ_j table[ids[r, j]] (an embedding bag: rows of ids [R, n] i32 each select n
  // rows of table [V, cols], which are summed in f32 and rounded once). Ids are in range.
  virtual void gather_sum(const Tensor& ids, const Tensor& table, float scale, Tensor& out) = 0;
  virtual void argmax(const Tensor& x, Tensor& out) = 0;  // [R, C] -> [R] i32
  // The k most likely tokens of each row of logits [R, V] (f32) once row r is divided by
  // temperatures[r] (f32 [R], > 0): values [R, k] f32 (the divided logits) and ids [R, k] i32, most
  // likely first, ties to the lower id, a NaN ranked as -inf. What a sampler with top_k = k draws
  // from, without the rows leaving the device. 1 <= k <= min(V, kMaxTopK).
  virtual void top_k(const Tensor& logits, const Tensor& temperatures, int k, Tensor& values, Tensor& ids) = 0;
  static constexpr int kMaxTopK = 256;

  // Sequence ops.
  virtual void rope(const RopeArgs& args) = 0;
  virtual void kv_write(const KvWriteArgs& args) = 0;
  // rope(q), the value norm, rope(k), kv_write (see the args); a backend may run them as one launch.
  virtual void attention_inputs(const AttentionInputsArgs& args);
  virtual void attention(const AttentionArgs& args) = 0;
  virtual void causal_conv1d(const CausalConvArgs& args) = 0;
  virtual void gated_delta(const GatedDeltaArgs& args) = 0;
  virtual void moe_route(const MoeRouteArgs& args) = 0;
  virtual void moe_experts(const MoeExpertsArgs& args) = 0;
};

}  // namespace kiln
