// Gated feed-forward blocks: the dense GLU MLP (GeGLU / SwiGLU) and mixture-of-experts routing.
#pragma once

#include <string>

#include "layers/batch.h"
#include "layers/loader.h"
#include "ops/backend.h"

namespace kiln {

struct GluMlp {
  Tensor gate;  // [inter, hidden]
  Tensor up;    // [inter, hidden]
  Tensor down;  // [hidden, inter]
};

// prefix: "layers.3.mlp" -> prefix.{gate,up,down}_proj.weight
Result<GluMlp> load_glu_mlp(WeightLoader& loader, const std::string& prefix, int64_t hidden, int64_t inter);

// down(act(gate x) ⊙ up x); x [T, hidden] -> [T, hidden]. With `then`, the residual update that
// reads the output runs with the down projection (layers/batch.h).
Tensor glu_mlp(Backend& backend, const Tensor& x, const GluMlp& mlp, Activation act,
               const ResidualNormArgs* then = nullptr);

// Stacked expert weights, one slice per expert.
struct ExpertStack {
  Tensor gate;  // [E, inter, hidden]
  Tensor up;    // [E, inter, hidden]
  Tensor down;  // [E, hidden, inter]
};

// Experts stored in any of the layouts found in the wild: fused as transformers holds them
// (`experts`.gate_up_proj [E, 2I, H], gate rows first, and `experts`.down_proj [E, H, I]), one
// tensor per expert as Qwen 3.5 MoE checkpoints ship (`experts`.N.{gate,up,down}_proj.weight), or
// stacked per projection as mlx-lm writes them (`split_prefix`.{gate,up,down}_proj.weight).
Result<ExpertStack> load_experts(WeightLoader& loader, const std::string& experts_prefix,
                                 const std::string& split_prefix, int64_t n_experts, int64_t hidden, int64_t inter);

struct MoeRouting {
  int top_k = 0;
  bool renormalize = true;
  Tensor expert_scale;  // [E] f32 or undefined
};

// Softmax-top-k routing of router_logits [T, E] and the weighted sum of the chosen experts on x.
Tensor routed_experts(Backend& backend, const Tensor& router_logits, const Tensor& x, const ExpertStack& experts,
                      const MoeRouting& routing, Activation act);

}  // namespace kiln
