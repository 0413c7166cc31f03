#include "runtime/prefill.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kiln {

Result<Tensor> run_tokens(Model& model, SequenceState& state, std::span<const int32_t> tokens, int64_t chunk,
                          LogitRows rows) {
  if (tokens.empty()) return make_error("no tokens to run");
  const int64_t n = int64_t(tokens.size());
  const int64_t vocab = model.info().vocab_size;
  chunk = chunk <= 0 ? model.max_chunk_tokens() : std::min(chunk, model.max_chunk_tokens());
  Tensor out = host_tensor(DType::f32, Shape{rows == LogitRows::all ? n : 1, vocab});
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t count = std::min(chunk, n - begin);
    const bool last_chunk = begin + count == n;
    SeqChunk c{.state = &state, .tokens = tokens.subspan(size_t(begin), size_t(count))};
    // intermediate chunks only need logits when every row is wanted
    const LogitRows want = rows == LogitRows::all ? LogitRows::all : LogitRows::last;
    KILN_ASSIGN(Tensor logits, model.forward(std::span<const SeqChunk>(&c, 1), want));
    if (rows == LogitRows::all) {
      Tensor host = model.backend().to_host(logits);
      std::memcpy(out.data_as<float>() + begin * vocab, host.data(), size_t(count * vocab) * 4);
    } else if (last_chunk) {
      Tensor host = model.backend().to_host(logits);
      std::memcpy(out.data_as<float>(), host.data(), size_t(vocab) * 4);
    }
  }
  return out;
}

Result<Tensor> run_token(Model& model, SequenceState& state, int32_t token) {
  SeqChunk c{.state = &state, .tokens = std::span<const int32_t>(&token, 1)};
  return model.forward(std::span<const SeqChunk>(&c, 1), LogitRows::last);
}

namespace {

Error non_finite(int64_t generated_index) {
  return make_error(
      "the model produced non-finite logits for generated token {}: its weights or config.json hold values it "
      "cannot compute with",
      generated_index);
}

}  // namespace

Result<int32_t> draw_next(Model& model, const Tensor& logits, Sampler& sampler, std::span<const int32_t> history,
                          bool check_finite, int64_t generated_index) {
  Backend& backend = model.backend();
  const int64_t vocab = model.info().vocab_size;
  const SamplingParams& p = sampler.params();
  const Tensor last = logits.rows() > 1 ? logits.rows_view(logits.rows() - 1, 1) : logits;
  const bool greedy = plain_greedy(p);
  if (last.device() != Device::cpu && (greedy || draws_from_top_k(p, vocab))) {
    const int k = greedy ? 1 : p.top_k;
    Tensor temperature = host_tensor(DType::f32, Shape{1});
    temperature.data_as<float>()[0] = greedy ? 1.0f : p.temperature;
    Tensor values = backend.alloc(DType::f32, Shape{1, k}), ids = backend.alloc(DType::i32, Shape{1, k});
    backend.top_k(last, backend.upload(temperature, DType::f32), k, values, ids);
    const Tensor host_values = backend.to_host(values), host_ids = backend.to_host(ids);
    KILN_TRY(backend.status());
    return draw_from_candidates(sampler, std::span<const float>(host_values.data_as<float>(), size_t(k)),
                                std::span<const int32_t>(host_ids.data_as<int32_t>(), size_t(k)), vocab, check_finite,
                                generated_index);
  }
  const Tensor host = last.device() == Device::cpu ? last : backend.to_host(last);
  KILN_TRY(backend.status());
  const std::span<const float> row(host.data_as<float>(), size_t(vocab));
  if (check_finite && !std::all_of(row.begin(), row.end(), [](float v) { return std::isfinite(v); }))
    return non_finite(generated_index);
  return sampler.sample(row, history);
}

Result<int32_t> draw_from_candidates(Sampler& sampler, std::span<const float> values, std::span<const int32_t> ids,
                                     int64_t vocab, bool check_finite, int64_t generated_index) {
  if (values.empty() || values.size() != ids.size()) return make_error("no candidates to draw from");
  if (check_finite && !std::isfinite(values[0])) return non_finite(generated_index);
  return plain_greedy(sampler.params()) ? ids[0] : sampler.sample_top_k(values, ids, vocab);
}

}  // namespace kiln
