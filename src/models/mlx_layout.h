// Host-tensor steps that the families' mlx-lm layouts share (kiln quantize): stacking per-expert
// matrices, splitting fused gate/up stacks, and mlx-lm's norm convention (1 + w).
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln {

// The tensors stacked along a new first dimension.
Tensor stack_host(const std::vector<Tensor>& parts);
// Half `which` (0: first rows, 1: last rows) of every matrix of a stack [E, 2I, H].
Tensor split_half_rows(const Tensor& fused, int which);
// 1 + t, in t's dtype.
Tensor add_one(const Tensor& t);

inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
inline bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

}  // namespace kiln
