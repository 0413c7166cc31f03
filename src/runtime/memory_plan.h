// The memory plan of a model on a device, worked out before anything is allocated (`kiln fit`):
// the model is loaded on a backend that only counts bytes (PlanBackend), its sequence states are
// made at two context lengths to find what grows with the context, and a prefill and a decode step
// run on it to find what a step holds at its peak.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "models/model.h"

namespace kiln {

// One kind of layer state: "full attention" (grows with the context), "sliding window" (a fixed
// ring), "recurrent" (Gated DeltaNet's conv and recurrent states).
struct LayerStatePlan {
  std::string kind;
  int layers = 0;
  size_t bytes_per_token = 0;     // all such layers together, per token of context
  size_t bytes_per_sequence = 0;  // all such layers together at their largest, whatever the context
  int64_t ring = 0;               // sliding window: the ring's slots (a shorter context fills fewer)
};

struct MemoryPlan {
  size_t weights = 0;  // resident weights, as the device keeps them
  std::vector<LayerStatePlan> states;
  // The activations one step holds at its peak: a prefill chunk of `prefill_chunk` tokens beside a
  // decode row of every other sequence, for one sequence and for 64 (linear between and beyond).
  int64_t prefill_chunk = 0;
  size_t step_workspace_1 = 0;
  size_t step_workspace_64 = 0;
  size_t prompt_cache = 0;  // the prefix cache's budget
  int64_t max_positions = 0;

  size_t bytes_per_token() const;     // the context-dependent part of one sequence, per token
  size_t bytes_per_sequence() const;  // the part that does not grow with the context
  size_t sequence_bytes(int64_t context) const;
  size_t step_workspace(int64_t batch) const;
  // Peak memory of `batch` sequences of `context` tokens each.
  size_t total(int64_t context, int64_t batch) const;
  // The longest context (capped at the model's positions) `batch` sequences can each hold within
  // `budget` bytes, and the most sequences of `context` tokens; 0 when none fits.
  int64_t max_context(size_t budget, int64_t batch) const;
  int64_t max_batch(size_t budget, int64_t context) const;
};

// Plans `model`, which must be loaded on a counting backend (Backend::live_memory_bytes, whose
// ops compute nothing). `weights` is what the backend held after the load.
Result<MemoryPlan> plan_memory(Model& model, size_t weights, int64_t prefill_chunk, size_t prompt_cache_bytes);

}  // namespace kiln
