#include "runtime/prompt_images.h"

#include <algorithm>
#include <cstring>

#include "models/image_processor.h"

namespace kiln {

Result<PromptImages> place_images(Model& model, const ModelFamily& family, const ModelConfigFile& config,
                                  const ImagePlaceholder& placeholder, std::span<const int32_t> ids,
                                  std::span<const ProcessedImage> images) {
  PromptImages out;
  out.prompt_tokens = int64_t(ids.size());
  const BatchNeeds needs = model.batch_needs();
  out.whole = needs.image_spans;
  KILN_ASSIGN(std::vector<int64_t> offsets, find_image_runs(ids, placeholder, images));
  for (size_t i = 0; i < images.size(); ++i) {
    KILN_ASSIGN(Tensor rows, model.encode_image(images[i]));
    if (rows.rows() != images[i].soft_tokens)
      return make_error("image {}: the encoder gave {} rows for {} soft tokens", i + 1, rows.rows(),
                        images[i].soft_tokens);
    out.images.push_back(PromptImages::Placed{.offset = offsets[i], .rows = std::move(rows)});
  }
  if (needs.rope_axes > 0 && family.rope_positions) {
    std::vector<std::vector<int64_t>> grids;
    for (const auto& image : images) grids.push_back(image.grid);
    KILN_ASSIGN(out.positions, family.rope_positions(config, ids, grids));
    if (out.positions.size() != size_t(needs.rope_axes) * ids.size())
      return make_error("the laid-out positions hold {} values for {} tokens of {} axes", out.positions.size(),
                        ids.size(), needs.rope_axes);
    out.rope_axes = needs.rope_axes;
  }
  return out;
}

ChunkInputs chunk_inputs(const PromptImages& images, int64_t begin, int64_t end) {
  ChunkInputs in;
  for (const auto& image : images.images) {
    const int64_t first = std::max(begin, image.offset);
    const int64_t last = std::min(end, image.offset + image.rows.rows());
    if (first >= last) continue;
    in.soft.push_back(SoftTokens{.offset = first - begin,
                                 .rows = image.rows.rows_view(first - image.offset, last - first),
                                 .first = first - image.offset,
                                 .image_rows = image.rows.rows()});
  }
  if (!images.positions.empty()) {
    const int64_t n = end - begin;
    in.positions.resize(size_t(images.rope_axes * n));
    for (int64_t a = 0; a < images.rope_axes; ++a)
      std::memcpy(in.positions.data() + a * n, images.positions.data() + a * images.prompt_tokens + begin,
                  size_t(n) * sizeof(int32_t));
  }
  return in;
}

Result<int64_t> chunk_end(const PromptImages& images, int64_t begin, int64_t end, int64_t max_tokens) {
  int64_t stop = std::min(end, begin + max_tokens);
  if (!images.whole) return stop;
  for (const auto& image : images.images) {
    const int64_t image_end = image.offset + image.rows.rows();
    if (image.offset >= stop || image_end <= stop || image_end <= begin) continue;
    // the chunk would split this image
    if (image.offset > begin) return image.offset;
    return make_error("an image of {} soft tokens does not fit a chunk of {} tokens; raise the prefill chunk",
                      image.rows.rows(), max_tokens);
  }
  return stop;
}

Result<Tensor> run_prompt(Model& model, SequenceState& state, std::span<const int32_t> ids, const PromptImages& images,
                          int64_t chunk, LogitRows rows) {
  if (ids.empty()) return make_error("no tokens to run");
  const int64_t n = int64_t(ids.size());
  const int64_t vocab = model.info().vocab_size;
  chunk = chunk <= 0 ? model.max_chunk_tokens() : std::min(chunk, model.max_chunk_tokens());
  Tensor out = host_tensor(DType::f32, Shape{rows == LogitRows::all ? n : 1, vocab});
  for (int64_t begin = 0; begin < n;) {
    KILN_ASSIGN(const int64_t end, chunk_end(images, begin, n, chunk));
    const ChunkInputs in = chunk_inputs(images, begin, end);
    SeqChunk c{.state = &state,
               .tokens = ids.subspan(size_t(begin), size_t(end - begin)),
               .soft = in.soft,
               .positions = in.positions};
    const LogitRows want = rows == LogitRows::all ? LogitRows::all : LogitRows::last;
    KILN_ASSIGN(Tensor logits, model.forward(std::span<const SeqChunk>(&c, 1), want));
    if (rows == LogitRows::all) {
      Tensor host = model.backend().to_host(logits);
      std::memcpy(out.data_as<float>() + begin * vocab, host.data(), size_t((end - begin) * vocab) * 4);
    } else if (end == n) {
      Tensor host = model.backend().to_host(logits);
      std::memcpy(out.data_as<float>(), host.data(), size_t(vocab) * 4);
    }
    begin = end;
  }
  return out;
}

}  // namespace kiln
