#include "layers/mlp.h"

#include <cstring>

namespace kiln {

Result<GluMlp> load_glu_mlp(WeightLoader& loader, const std::string& prefix, int64_t hidden, int64_t inter) {
  GluMlp m;
  KILN_ASSIGN(m.gate, loader.matrix(prefix + ".gate_proj.weight", Shape{inter, hidden}));
  KILN_ASSIGN(m.up, loader.matrix(prefix + ".up_proj.weight", Shape{inter, hidden}));
  KILN_ASSIGN(m.down, loader.matrix(prefix + ".down_proj.weight", Shape{hidden, inter}));
  return m;
}

Tensor glu_mlp(Backend& backend, const Tensor& x, const GluMlp& mlp, Activation act, const ResidualNormArgs* then) {
  const int64_t t = x.rows(), inter = mlp.gate.dim(0), hidden = mlp.down.dim(0);
  const DType dt = backend.activation_dtype();
  Tensor gated = backend.alloc(dt, Shape{t, inter});
  backend.glu_matmul(x, mlp.gate, mlp.up, act, gated);
  Tensor out = backend.alloc(dt, Shape{t, hidden});
  output_projection(backend, gated, mlp.down, out, then);
  return out;
}

namespace {

// Host memory for a stack the loader assembles from checkpoint tensors; on the meta device, where a
// checkpoint is only checked, a shape without memory, and nothing is copied into it.
Tensor host_stack(const Backend& backend, DType dtype, Shape shape) {
  if (backend.device() == Device::meta) return Tensor(dtype, shape, nullptr, nullptr, Device::meta);
  return host_tensor(dtype, shape);
}

}  // namespace

Result<ExpertStack> load_experts(WeightLoader& loader, const std::string& experts_prefix,
                                 const std::string& split_prefix, int64_t n_experts, int64_t hidden, int64_t inter) {
  ExpertStack e;
  Backend& backend = loader.backend();
  if (loader.has(experts_prefix + ".gate_up_proj")) {
    KILN_ASSIGN(Tensor fused, loader.host(experts_prefix + ".gate_up_proj", Shape{n_experts, 2 * inter, hidden}));
    // split each expert's [2I, H] block into its gate rows and its up rows
    Tensor gate = host_stack(backend, fused.dtype(), Shape{n_experts, inter, hidden});
    Tensor up = host_stack(backend, fused.dtype(), Shape{n_experts, inter, hidden});
    const size_t half = size_t(inter * hidden) * dtype_size(fused.dtype());
    const char* src = static_cast<const char*>(fused.data());
    for (int64_t x = 0; gate.defined() && x < n_experts; ++x) {
      std::memcpy(static_cast<char*>(gate.data()) + x * half, src + 2 * x * half, half);
      std::memcpy(static_cast<char*>(up.data()) + x * half, src + (2 * x + 1) * half, half);
    }
    e.gate = backend.upload(gate, backend.matrix_dtype());
    e.up = backend.upload(up, backend.matrix_dtype());
    KILN_ASSIGN(e.down, loader.matrix(experts_prefix + ".down_proj", Shape{n_experts, hidden, inter}));
    return e;
  }
  if (loader.has(experts_prefix + ".0.gate_proj.weight")) {
    // one tensor per expert, as transformers saves Qwen 3.5 MoE: stack them
    auto stack = [&](const char* proj, int64_t rows, int64_t cols) -> Result<Tensor> {
      Tensor stacked;
      size_t slice = 0;
      for (int64_t x = 0; x < n_experts; ++x) {
        const std::string name = experts_prefix + "." + std::to_string(x) + "." + proj + ".weight";
        KILN_ASSIGN(Tensor one, loader.host(name, Shape{rows, cols}));
        if (x == 0) {
          stacked = host_stack(backend, one.dtype(), Shape{n_experts, rows, cols});
          slice = one.nbytes();
        } else if (one.dtype() != stacked.dtype()) {
          return make_error("tensor {} has dtype {}, unlike expert 0", loader.store().describe(name),
                            dtype_name(one.dtype()));
        }
        if (stacked.defined()) std::memcpy(static_cast<char*>(stacked.data()) + size_t(x) * slice, one.data(), slice);
      }
      return backend.upload(stacked, backend.matrix_dtype());
    };
    KILN_ASSIGN(e.gate, stack("gate_proj", inter, hidden));
    KILN_ASSIGN(e.up, stack("up_proj", inter, hidden));
    KILN_ASSIGN(e.down, stack("down_proj", hidden, inter));
    return e;
  }
  KILN_ASSIGN(e.gate, loader.matrix(split_prefix + ".gate_proj.weight", Shape{n_experts, inter, hidden}));
  KILN_ASSIGN(e.up, loader.matrix(split_prefix + ".up_proj.weight", Shape{n_experts, inter, hidden}));
  KILN_ASSIGN(e.down, loader.matrix(split_prefix + ".down_proj.weight", Shape{n_experts, hidden, inter}));
  return e;
}

Tensor routed_experts(Backend& backend, const Tensor& router_logits, const Tensor& x, const ExpertStack& experts,
                      const MoeRouting& routing, Activation act) {
  const int64_t t = x.rows();
  Tensor ids = backend.alloc(DType::i32, Shape{t, routing.top_k});
  Tensor weights = backend.alloc(DType::f32, Shape{t, routing.top_k});
  backend.moe_route(MoeRouteArgs{.logits = router_logits,
                                 .expert_scale = routing.expert_scale,
                                 .ids = ids,
                                 .weights = weights,
                                 .top_k = routing.top_k,
                                 .renormalize = routing.renormalize});
  Tensor out = backend.alloc(backend.activation_dtype(), Shape{t, x.cols()});
  backend.moe_experts(MoeExpertsArgs{.x = x,
                                     .ids = ids,
                                     .weights = weights,
                                     .gate = experts.gate,
                                     .up = experts.up,
                                     .down = experts.down,
                                     .out = out,
                                     .act = act});
  return out;
}

}  // namespace kiln
