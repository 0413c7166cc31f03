// What the scheduler tests (CPU and GPU) share: deterministic prompts, greedy requests, and a
// generation drained to its end.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/scheduler.h"

namespace kiln::test {

struct Outcome {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::running;
  int64_t cached = 0;
  double prompt_seconds = 0;
};

inline Outcome drain(const std::shared_ptr<Generation>& g) {
  Outcome out;
  for (;;) {
    auto u = g->wait(std::chrono::milliseconds(100));
    out.tokens.insert(out.tokens.end(), u.tokens.begin(), u.tokens.end());
    if (u.finish != FinishReason::running) {
      out.finish = u.finish;
      break;
    }
  }
  out.cached = g->cached_tokens();
  out.prompt_seconds = g->prompt_seconds();
  return out;
}

// Request i's prompt: `length` ids below `vocab` from a fixed generator.
inline std::vector<int32_t> prompt_for(int i, int64_t vocab, int length) {
  std::vector<int32_t> p;
  uint32_t x = 12345u + uint32_t(i) * 7919u;
  for (int k = 0; k < length; ++k) {
    x = x * 1664525u + 1013904223u;
    p.push_back(int32_t((x >> 8) % uint32_t(vocab)));
  }
  return p;
}

inline GenerationParams greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
  return GenerationParams{.prompt = std::move(prompt), .sampling = {.temperature = 0}, .max_tokens = max_tokens};
}

}  // namespace kiln::test
