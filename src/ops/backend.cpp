// Default implementations of the fused ops, composed from the basic ones: what a backend without
// a fused kernel runs.
#include "ops/backend.h"

namespace kiln {

void Backend::matmul_many(const Tensor& x, std::span<const MatmulProduct> products) {
  for (const MatmulProduct& p : products) {
    Tensor out = p.out;
    matmul(x, p.weight, out);
  }
}

void Backend::glu_matmul(const Tensor& x, const Tensor& gate, const Tensor& up, Activation act, Tensor& out) {
  Tensor up_out = alloc(out.dtype(), Shape{out.rows(), out.cols()});
  matmul(x, gate, out);
  matmul(x, up, up_out);
  glu(out, up_out, act, out);
}

void Backend::matmul_residual_norm(const Tensor& x, const Tensor& w, const ResidualNormArgs& args) {
  Tensor out = args.block_out;
  matmul(x, w, out);
  residual_norm(args);
}

void Backend::attention_inputs(const AttentionInputsArgs& args) {
  rope(args.q);
  if (args.v_input.defined()) {
    Tensor v = args.v.reshape(args.v_input.shape());
    rms_norm(args.v_input, Tensor(), args.v_norm_eps, 0.0f, v);
  }
  rope(args.k);
  kv_write(args.kv);
}

}  // namespace kiln
