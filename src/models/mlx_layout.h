// Host-tensor steps that the families' mlx-lm layouts share (kiln quantize): stacking per-expert
// matrices, splitting fused gate/up stacks, and mlx-lm's norm convention (1 + w).
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/weights.h"
#include "models/family.h"

namespace kiln {

// The tensors stacked along a new first dimension.
Tensor stack_host(const std::vector<Tensor>& parts);
// Half `which` (0: first rows, 1: last rows) of every matrix of a stack [E, 2I, H].
Tensor split_half_rows(const Tensor& fused, int which);
// 1 + t, in t's dtype.
Tensor add_one(const Tensor& t);

// transformers' fused expert stacks (`...experts.gate_up_proj` [E, 2I, H] with the gate rows first,
// `...experts.down_proj` [E, H, I]) as mlx-lm's separate gate, up and down stacks, named
// prefix + (the name up to ".experts.") + stack + "gate_proj.weight" etc. False, and nothing added,
// when `name` is not such a stack.
bool fused_experts_to_mlx(const WeightStore& store, const std::string& name, const Tensor& t, const std::string& prefix,
                          const std::string& stack, std::vector<MlxTensor>& out);

inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
inline bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

}  // namespace kiln
