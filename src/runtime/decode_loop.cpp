#include "runtime/decode_loop.h"

namespace kiln {

Result<std::unique_ptr<DecodeLoop>> DecodeLoop::create(Model& model, std::vector<SequenceState*> sequences,
                                                       std::span<const int32_t> first) {
  if (sequences.empty() || first.size() != sequences.size())
    return make_error("decode loop: one first token per sequence is needed");
  std::unique_ptr<DecodeLoop> loop(new DecodeLoop(model));
  std::vector<SeqChunk> chunks;
  for (size_t i = 0; i < sequences.size(); ++i) chunks.push_back({sequences[i], first.subspan(i, 1)});
  // validates the tokens and puts ids and positions on the device, in buffers the graph keeps
  KILN_ASSIGN(loop->batch_, model.prepare(chunks));
  loop->positions_host_ = host_tensor(DType::i32, Shape{int64_t(sequences.size())});
  Backend& backend = model.backend();
  DecodeLoop* self = loop.get();
  KILN_ASSIGN(loop->graph_, backend.capture([self, &backend]() -> Status {
    KILN_ASSIGN(self->logits_, self->model_.run(self->batch_, LogitRows::last));
    backend.argmax(self->logits_, self->batch_.ids);  // the next input, in place
    return ok_status();
  }));
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
  }
  backend.copy(positions_host_, layout.positions);
  KILN_TRY(graph_->replay());
  for (SequenceState* s : layout.states) s->advance(1);
  return ok_status();
}

std::vector<int32_t> DecodeLoop::tokens() {
  Tensor host = model_.backend().to_host(batch_.ids);
  return std::vector<int32_t>(host.data_as<int32_t>(), host.data_as<int32_t>() + host.numel());
}

}  // namespace kiln
