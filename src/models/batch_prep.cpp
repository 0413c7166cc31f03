#include "models/batch_prep.h"

namespace kiln {

Result<PreparedBatch> prepare_batch(Backend& backend, std::span<const SeqChunk> batch, int64_t vocab_size,
                                    int64_t max_chunk) {
  PreparedBatch out;
  BatchLayout& layout = out.layout;
  if (batch.empty()) return make_error("forward: empty batch");
  for (const SeqChunk& c : batch) {
    if (!c.state) return make_error("forward: chunk without a sequence");
    if (c.tokens.empty()) return make_error("forward: a sequence was given no tokens");
    if (int64_t(c.tokens.size()) > max_chunk)
      return make_error("forward: {} tokens in one chunk, more than the {} this model was set up for", c.tokens.size(),
                        max_chunk);
    if (c.state->length() + int64_t(c.tokens.size()) > c.state->max_context())
      return make_error("context full: {} tokens plus {} new exceed the context of {}", c.state->length(),
                        c.tokens.size(), c.state->max_context());
    for (int32_t id : c.tokens)
      if (id < 0 || id >= vocab_size)
        return make_error("token id {} is outside the vocabulary [0, {})", id, vocab_size);
    layout.seqs.push_back(
        SeqRows{.row_begin = layout.n_tokens, .n_rows = int64_t(c.tokens.size()), .pos_begin = c.state->length()});
    layout.states.push_back(c.state);
    layout.n_tokens += int64_t(c.tokens.size());
  }
  for (size_t i = 0; i < layout.states.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (layout.states[i] == layout.states[j]) return make_error("forward: a sequence appears twice in one batch");

  Tensor ids = host_tensor(DType::i32, Shape{layout.n_tokens});
  Tensor pos = host_tensor(DType::i32, Shape{layout.n_tokens});
  int64_t r = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    for (size_t i = 0; i < batch[s].tokens.size(); ++i, ++r) {
      ids.data_as<int32_t>()[r] = batch[s].tokens[i];
      pos.data_as<int32_t>()[r] = int32_t(layout.seqs[s].pos_begin + int64_t(i));
    }
  }
  out.ids = backend.upload(ids, DType::i32);
  layout.positions = backend.upload(pos, DType::i32);
  return out;
}

bool selects_every_row(const BatchLayout& layout, LogitRows rows) {
  if (rows == LogitRows::all) return true;
  for (size_t s = 0; s < layout.seqs.size(); ++s)
    if (layout.seqs[s].n_rows != 1 || layout.seqs[s].row_begin != int64_t(s)) return false;
  return int64_t(layout.seqs.size()) == layout.n_tokens;
}

Tensor select_rows(Backend& backend, const Tensor& h, const BatchLayout& layout, LogitRows rows) {
  if (selects_every_row(layout, rows)) return h;
  Tensor out = backend.alloc(h.dtype(), Shape{int64_t(layout.seqs.size()), h.cols()});
  for (size_t s = 0; s < layout.seqs.size(); ++s) {
    Tensor dst = out.rows_view(int64_t(s), 1);
    backend.copy(h.rows_view(layout.seqs[s].row_begin + layout.seqs[s].n_rows - 1, 1), dst);
  }
  return out;
}

void advance_sequences(const BatchLayout& layout) {
  for (size_t s = 0; s < layout.states.size(); ++s) layout.states[s]->advance(layout.seqs[s].n_rows);
}

}  // namespace kiln
