#include "runtime/decode_loop.h"

#include "runtime/prefill.h"

namespace kiln {

Result<std::unique_ptr<DecodeLoop>> DecodeLoop::create(Model& model, std::vector<SequenceState*> sequences,
                                                       std::span<const int32_t> first, int top_k,
                                                       std::span<const float> temperatures) {
  if (sequences.empty() || first.size() != sequences.size())
    return make_error("decode loop: one first token per sequence is needed");
  if (top_k > 0 && temperatures.size() != sequences.size())
    return make_error("decode loop: one temperature per sequence is needed");
  std::unique_ptr<DecodeLoop> loop(new DecodeLoop(model));
  std::vector<SeqChunk> chunks;
  for (size_t i = 0; i < sequences.size(); ++i) chunks.push_back({sequences[i], first.subspan(i, 1)});
  // validates the tokens and puts ids and positions on the device, in buffers the graph keeps
  KILN_ASSIGN(loop->batch_, model.prepare(chunks));
  loop->positions_host_ = host_tensor(DType::i32, Shape{int64_t(sequences.size())});
  if (loop->batch_.layout.rope_positions.defined())
    loop->rope_positions_host_ = host_tensor(DType::i32, loop->batch_.layout.rope_positions.shape());
  Backend& backend = model.backend();
  const int64_t n = int64_t(sequences.size());
  if (top_k > 0) {
    Tensor t = host_tensor(DType::f32, Shape{n});
    std::copy(temperatures.begin(), temperatures.end(), t.data_as<float>());
    loop->temperatures_ = backend.upload(t, DType::f32);
    loop->top_values_ = backend.alloc(DType::f32, Shape{n, top_k});
    loop->top_ids_ = backend.alloc(DType::i32, Shape{n, top_k});
  }
  DecodeLoop* self = loop.get();
  KILN_ASSIGN(loop->graph_, backend.capture([self, &backend, top_k]() -> Status {
    KILN_ASSIGN(self->logits_, self->model_.run(self->batch_, LogitRows::last));
    if (top_k > 0)
      backend.top_k(self->logits_, self->temperatures_, top_k, self->top_values_, self->top_ids_);
    else
      backend.argmax(self->logits_, self->batch_.ids);  // the next input, in place
    return ok_status();
  }));
  KILN_TRY(backend.status());
  return loop;
}

Status DecodeLoop::step() {
  Backend& backend = model_.backend();
  BatchLayout& layout = batch_.layout;
  for (size_t i = 0; i < layout.states.size(); ++i) {
    SequenceState* s = layout.states[i];
    if (s->length() + 1 > s->max_context())
      return make_error("context full: {} tokens fill the context of {}", s->length(), s->max_context());
    layout.seqs[i].pos_begin = s->length();  // what a host-side replay reads
    positions_host_.data_as<int32_t>()[i] = int32_t(s->length());
    // rotary positions continue from the prompt's last by the sequence's rope offset, on every axis
    const int64_t n = positions_host_.numel();
    for (int64_t a = 0; rope_positions_host_.defined() && a < rope_positions_host_.dim(0); ++a)
      rope_positions_host_.data_as<int32_t>()[a * n + int64_t(i)] = int32_t(s->length() + s->rope_offset());
  }
  backend.copy(positions_host_, layout.positions);
  if (rope_positions_host_.defined()) backend.copy(rope_positions_host_, layout.rope_positions);
  KILN_TRY(graph_->replay());
  for (SequenceState* s : layout.states) s->advance(1);
  return ok_status();
}

std::vector<int32_t> DecodeLoop::tokens() {
  Tensor host = model_.backend().to_host(batch_.ids);
  return std::vector<int32_t>(host.data_as<int32_t>(), host.data_as<int32_t>() + host.numel());
}

void DecodeLoop::set_tokens(std::span<const int32_t> tokens) {
  Tensor host = host_tensor(DType::i32, Shape{int64_t(tokens.size())});
  std::copy(tokens.begin(), tokens.end(), host.data_as<int32_t>());
  model_.backend().copy(host, batch_.ids);
}

void DecodeLoop::set_temperatures(std::span<const float> temperatures) {
  Tensor host = host_tensor(DType::f32, Shape{int64_t(temperatures.size())});
  std::copy(temperatures.begin(), temperatures.end(), host.data_as<float>());
  model_.backend().copy(host, temperatures_);
}

DecodeLoop::Candidates DecodeLoop::candidates() {
  return {model_.backend().to_host(top_values_), model_.backend().to_host(top_ids_)};
}

SequenceDecoder::SequenceDecoder(Model& model, SequenceState& state, Sampler& sampler)
    : model_(model),
      state_(state),
      sampler_(sampler),
      replays_(model.backend().device() != Device::cpu &&
               (plain_greedy(sampler.params()) || draws_from_top_k(sampler.params(), model.info().vocab_size))) {}

Status SequenceDecoder::run(int32_t token) {
  if (!loop_) {
    const SamplingParams& p = sampler_.params();
    const bool greedy = plain_greedy(p);
    const float temperature = greedy ? 1.0f : p.temperature;
    std::vector<SequenceState*> one = {&state_};
    KILN_ASSIGN(loop_, DecodeLoop::create(model_, one, std::span<const int32_t>(&token, 1), greedy ? 1 : p.top_k,
                                          std::span<const float>(&temperature, 1)));
  } else {
    loop_->set_tokens(std::span<const int32_t>(&token, 1));
  }
  return loop_->step();
}

Status SequenceDecoder::feed(int32_t token) {
  if (replays_) {
    KILN_TRY(run(token));
    return model_.backend().status();
  }
  KILN_ASSIGN(Tensor logits, run_token(model_, state_, token));
  return ok_status();
}

Result<int32_t> SequenceDecoder::next(int32_t token, std::span<const int32_t> history, bool check_finite,
                                      int64_t generated_index) {
  if (!replays_) {
    KILN_ASSIGN(Tensor logits, run_token(model_, state_, token));
    return draw_next(model_, logits, sampler_, history, check_finite, generated_index);
  }
  KILN_TRY(run(token));
  const DecodeLoop::Candidates c = loop_->candidates();
  KILN_TRY(model_.backend().status());
  return draw_from_candidates(sampler_, std::span<const float>(c.values.data_as<float>(), size_t(c.values.numel())),
                              std::span<const int32_t>(c.ids.data_as<int32_t>(), size_t(c.ids.numel())),
                              model_.info().vocab_size, check_finite, generated_index);
}

}  // namespace kiln
