#include "models/batch_prep.h"

#include <algorithm>

namespace kiln {

Result<PreparedBatch> prepare_batch(Backend& backend, std::span<const SeqChunk> batch, int64_t vocab_size,
                                    int64_t max_chunk, const BatchNeeds& needs) {
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
    if (!c.soft.empty() && needs.hidden == 0) return make_error("forward: this model takes no images");
    int64_t soft_end = 0;
    for (const SoftTokens& t : c.soft) {
      if (t.offset < soft_end || t.offset + t.rows.rows() > int64_t(c.tokens.size()))
        return make_error("forward: soft tokens at {} (+{}) overlap or leave the chunk of {} tokens", t.offset,
                          t.rows.rows(), c.tokens.size());
      if (t.rows.cols() != needs.hidden)
        return make_error("forward: soft tokens of width {}, the model's is {}", t.rows.cols(), needs.hidden);
      if (needs.image_spans && (t.first != 0 || t.rows.rows() != t.image_rows))
        return make_error(
            "forward: a chunk holds soft tokens [{}, {}) of an image of {}; this model attends over each image "
            "bidirectionally, so an image's tokens must come in one chunk",
            t.first, t.first + t.rows.rows(), t.image_rows);
      soft_end = t.offset + t.rows.rows();
      layout.soft.push_back(SoftRows{.row = layout.n_tokens + t.offset, .rows = t.rows});
    }
    if (!c.positions.empty() &&
        (needs.rope_axes == 0 || c.positions.size() != size_t(needs.rope_axes) * c.tokens.size()))
      return make_error("forward: {} laid-out positions for {} tokens; the model rotates by {} axes",
                        c.positions.size(), c.tokens.size(), needs.rope_axes);
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
  const int64_t axes = needs.rope_axes;
  Tensor rope = axes > 0 ? host_tensor(DType::i32, Shape{axes, layout.n_tokens}) : Tensor();
  int64_t r = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const SeqChunk& c = batch[s];
    const int64_t n = int64_t(c.tokens.size());
    const int64_t begin = layout.seqs[s].pos_begin;
    const int64_t offset = c.state->rope_offset();
    int64_t next = begin + n + offset;  // the rotary position of the token after the chunk
    if (!c.positions.empty()) {
      int64_t last = -1;
      for (int32_t p : c.positions) last = std::max<int64_t>(last, p);
      next = last + 1;
    }
    layout.next_rope_offsets.push_back(next - (begin + n));
    for (int64_t i = 0; i < n; ++i) {
      ids.data_as<int32_t>()[r + i] = c.tokens[size_t(i)];
      pos.data_as<int32_t>()[r + i] = int32_t(begin + i);
      for (int64_t a = 0; a < axes; ++a)
        rope.data_as<int32_t>()[a * layout.n_tokens + r + i] =
            c.positions.empty() ? int32_t(begin + i + offset) : c.positions[size_t(a * n + i)];
    }
    r += n;
  }
  out.ids = backend.upload(ids, DType::i32);
  layout.positions = backend.upload(pos, DType::i32);
  if (axes > 0) layout.rope_positions = backend.upload(rope, DType::i32);
  if (needs.image_spans && !layout.soft.empty()) {
    // each row's run of soft tokens as positions [first, last]; text rows an empty range
    Tensor spans = host_tensor(DType::i32, Shape{layout.n_tokens, 2});
    int32_t* s = spans.data_as<int32_t>();
    for (int64_t i = 0; i < layout.n_tokens; ++i) s[2 * i] = 1, s[2 * i + 1] = 0;
    for (size_t q = 0; q < batch.size(); ++q) {
      const SeqRows& rows = layout.seqs[q];
      const auto& soft = batch[q].soft;
      for (size_t a = 0; a < soft.size();) {
        size_t b = a;  // soft[a..b] adjacent: one run
        while (b + 1 < soft.size() && soft[b + 1].offset == soft[b].offset + soft[b].rows.rows()) ++b;
        const int64_t begin = soft[a].offset, end = soft[b].offset + soft[b].rows.rows();
        for (int64_t i = begin; i < end; ++i) {
          s[2 * (rows.row_begin + i)] = int32_t(rows.pos_begin + begin);
          s[2 * (rows.row_begin + i) + 1] = int32_t(rows.pos_begin + end - 1);
        }
        a = b + 1;
      }
    }
    layout.soft_spans = backend.upload(spans, DType::i32);
  }
  return out;
}

void place_soft_tokens(Backend& backend, const BatchLayout& layout, Tensor& embeddings) {
  for (const SoftRows& s : layout.soft) {
    Tensor dst = embeddings.rows_view(s.row, s.rows.rows());
    backend.copy(s.rows, dst);
  }
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
  for (size_t s = 0; s < layout.states.size(); ++s) {
    layout.states[s]->advance(layout.seqs[s].n_rows);
    if (s < layout.next_rope_offsets.size()) layout.states[s]->set_rope_offset(layout.next_rope_offsets[s]);
  }
}

}  // namespace kiln
