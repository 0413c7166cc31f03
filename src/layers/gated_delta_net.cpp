#include "layers/gated_delta_net.h"

namespace kiln {

Result<GatedDeltaNet> load_gated_delta_net(WeightLoader& loader, const std::string& prefix, int64_t hidden,
                                           const GatedDeltaNetShape& s) {
  GatedDeltaNet w;
  KILN_ASSIGN(w.in_proj_qkv, loader.matrix(prefix + ".in_proj_qkv.weight", Shape{s.conv_dim(), hidden}));
  KILN_ASSIGN(w.in_proj_z, loader.matrix(prefix + ".in_proj_z.weight", Shape{s.value_dim(), hidden}));
  KILN_ASSIGN(w.in_proj_b, loader.matrix(prefix + ".in_proj_b.weight", Shape{s.n_v_heads, hidden}));
  KILN_ASSIGN(w.in_proj_a, loader.matrix(prefix + ".in_proj_a.weight", Shape{s.n_v_heads, hidden}));
  const std::string conv_name = prefix + ".conv1d.weight";
  KILN_ASSIGN(Tensor conv, loader.store().get(conv_name));
  const Shape hf{s.conv_dim(), 1, s.conv_kernel}, mlx{s.conv_dim(), s.conv_kernel, 1},
      flat{s.conv_dim(), s.conv_kernel};
  if (conv.shape() != hf && conv.shape() != mlx && conv.shape() != flat)
    return make_error("tensor {} has shape {}, but config.json implies {} (or {})", loader.store().describe(conv_name),
                      conv.shape().str(), hf.str(), mlx.str());
  // both layouts hold the kernel taps of a channel contiguously
  w.conv1d = loader.backend().upload(to_f32_host(conv.reshape(flat)), DType::f32);
  KILN_ASSIGN(w.a_log, loader.vector(prefix + ".A_log", Shape{s.n_v_heads}));
  KILN_ASSIGN(w.dt_bias, loader.vector(prefix + ".dt_bias", Shape{s.n_v_heads}));
  KILN_ASSIGN(w.norm, loader.vector(prefix + ".norm.weight", Shape{s.v_dim}));
  KILN_ASSIGN(w.out_proj, loader.matrix(prefix + ".out_proj.weight", Shape{hidden, s.value_dim()}));
  return w;
}

void init_gated_delta_state(Backend& backend, LayerState& state, const GatedDeltaNetShape& s) {
  state.conv = backend.alloc(backend.activation_dtype(), Shape{s.conv_kernel - 1, s.conv_dim()});
  state.recurrent = backend.alloc(DType::f32, Shape{s.n_v_heads, s.k_dim, s.v_dim});
  backend.fill(state.conv, 0.0f);
  backend.fill(state.recurrent, 0.0f);
}

Tensor gated_delta_net(Backend& backend, const BatchLayout& batch, int layer, const Tensor& x, const GatedDeltaNet& w,
                       const GatedDeltaNetShape& s, const ResidualNormArgs* then) {
  const int64_t t = batch.n_tokens;
  const DType dt = backend.activation_dtype();
  Tensor qkv = backend.alloc(dt, Shape{t, s.conv_dim()});
  Tensor z = backend.alloc(dt, Shape{t, s.value_dim()});
  Tensor b = backend.alloc(dt, Shape{t, s.n_v_heads});
  Tensor a = backend.alloc(dt, Shape{t, s.n_v_heads});
  backend.matmul_many(
      x, std::vector<MatmulProduct>{{w.in_proj_qkv, qkv}, {w.in_proj_z, z}, {w.in_proj_b, b}, {w.in_proj_a, a}});

  std::vector<Tensor> conv_states, rec_states;
  bool all_single = true;
  for (size_t i = 0; i < batch.states.size(); ++i) {
    LayerState& ls = batch.states[i]->layers()[size_t(layer)];
    conv_states.push_back(ls.conv);
    rec_states.push_back(ls.recurrent);
    all_single = all_single && batch.seqs[i].n_rows == 1;
  }
  Tensor conv_out = backend.alloc(dt, Shape{t, s.conv_dim()});
  backend.causal_conv1d(CausalConvArgs{
      .x = qkv, .weight = w.conv1d, .out = conv_out, .seqs = batch.seqs, .states = conv_states, .silu = true});

  Tensor core = backend.alloc(dt, Shape{t, s.value_dim()});
  // the reference decodes single tokens with the recurrent form and prefills in chunks of 64
  backend.gated_delta(GatedDeltaArgs{
      .qkv = conv_out,
      .a = a,
      .b = b,
      .a_log = w.a_log,
      .dt_bias = w.dt_bias,
      .out = core,
      .seqs = batch.seqs,
      .states = rec_states,
      .n_k_heads = s.n_k_heads,
      .n_v_heads = s.n_v_heads,
      .k_dim = s.k_dim,
      .v_dim = s.v_dim,
      .algorithm = all_single ? DeltaRuleAlgorithm::recurrent : DeltaRuleAlgorithm::chunked,
      // then per value head: rms_norm(core) · norm.weight · silu(z)
      .norm_z = z,
      .norm_weight = w.norm,
      .norm_eps = s.eps,
  });
  Tensor out = backend.alloc(dt, Shape{t, x.cols()});
  output_projection(backend, core, w.out_proj, out, then);
  return out;
}

}  // namespace kiln
