// The bundled model's recorded greedy continuations (tools/oracle/bundled_model_greedy.py) and a
// greedy decode of them on any backend, for the CPU and GPU tests.
#pragma once

#include <string>
#include <vector>

#include "models/model.h"
#include "runtime/decode_loop.h"
#include "runtime/prefill.h"
#include "test_util.h"

namespace kiln::test {

inline std::string bundled_model_dir() {
  return source_dir() + "/models/kiln-kjv-31m";
}

struct RecordedPrompt {
  std::string text;
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;
};

inline std::vector<RecordedPrompt> recorded_prompts() {
  const auto json = read_json(fixtures_dir() + "/bundled_model_greedy.json");
  std::vector<RecordedPrompt> out;
  for (const auto& p : json["prompts"])
    out.push_back({p["text"].get<std::string>(), p["prompt_ids"].get<std::vector<int32_t>>(),
                   p["tokens"].get<std::vector<int32_t>>()});
  return out;
}

// Prefill the prompt, then decode with the replayed decode step, as `kiln generate` does.
inline Result<std::vector<int32_t>> greedy_continuation(Model& model, const std::vector<int32_t>& prompt,
                                                        size_t n_tokens) {
  KILN_ASSIGN(auto state, model.new_sequence(int64_t(prompt.size() + n_tokens)));
  KILN_ASSIGN(Tensor logits, run_tokens(model, *state, prompt, 0, LogitRows::last));  // host f32
  const int64_t vocab = model.info().vocab_size;
  const float* row = logits.data_as<float>();
  std::vector<int32_t> got = {int32_t(std::max_element(row, row + vocab) - row)};
  std::vector<SequenceState*> seqs = {state.get()};
  KILN_ASSIGN(auto loop, DecodeLoop::create(model, seqs, std::vector<int32_t>{got[0]}));
  while (got.size() < n_tokens) {
    KILN_TRY(loop->step());
    got.push_back(loop->tokens()[0]);
  }
  return got;
}

}  // namespace kiln::test
