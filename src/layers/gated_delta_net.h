// Gated DeltaNet (Qwen 3.5's linear-attention mixer): projections, the causal conv whose last
// inputs carry over between calls, the gated delta rule over a per-sequence f32 state, the gated
// RMSNorm with silu(z), and the output projection.
#pragma once

#include <string>

#include "layers/batch.h"
#include "layers/loader.h"
#include "ops/backend.h"

namespace kiln {

struct GatedDeltaNetShape {
  int n_k_heads = 0;    // linear_num_key_heads
  int n_v_heads = 0;    // linear_num_value_heads
  int k_dim = 0;        // linear_key_head_dim
  int v_dim = 0;        // linear_value_head_dim
  int conv_kernel = 4;  // linear_conv_kernel_dim
  float eps = 1e-6f;

  int64_t key_dim() const { return int64_t(n_k_heads) * k_dim; }
  int64_t value_dim() const { return int64_t(n_v_heads) * v_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

struct GatedDeltaNet {
  Tensor in_proj_qkv;  // [conv_dim, hidden]
  Tensor in_proj_z;    // [value_dim, hidden]
  Tensor in_proj_b;    // [n_v_heads, hidden]
  Tensor in_proj_a;    // [n_v_heads, hidden]
  Tensor conv1d;       // [conv_dim, kernel] f32 (stored [C, 1, K] by transformers, [C, K, 1] by mlx-lm)
  Tensor a_log;        // [n_v_heads] f32
  Tensor dt_bias;      // [n_v_heads] f32
  Tensor norm;         // [v_dim] f32
  Tensor out_proj;     // [hidden, value_dim]
};

// prefix: "layers.0.linear_attn"
Result<GatedDeltaNet> load_gated_delta_net(WeightLoader& loader, const std::string& prefix, int64_t hidden,
                                           const GatedDeltaNetShape& shape);

// x [T, hidden] (normed) -> [T, hidden]. State lives in layer `layer` of each sequence. With `then`,
// the residual update that reads the output runs with the output projection (layers/batch.h).
Tensor gated_delta_net(Backend& backend, const BatchLayout& batch, int layer, const Tensor& x, const GatedDeltaNet& w,
                       const GatedDeltaNetShape& shape, const ResidualNormArgs* then = nullptr);

// Fresh (zero) conv and recurrent states for one sequence.
void init_gated_delta_state(Backend& backend, LayerState& state, const GatedDeltaNetShape& shape);

}  // namespace kiln
