// Scalar activations shared by the CPU kernels.
#pragma once

#include <cmath>

namespace kiln::cpu {

inline float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}
inline float gelu_erf(float x) {
  return float(0.5 * double(x) * (1.0 + std::erf(double(x) * 0.7071067811865476)));  // x · Φ(x)
}
inline float silu(float x) {
  return x / (1.0f + std::exp(-x));
}
inline float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

}  // namespace kiln::cpu
