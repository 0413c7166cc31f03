// Qwen 3.5's multimodal rotary embedding (MRoPE): every token has three rotary positions (time,
// row, column), and each frequency of the text model's rotation follows one of them. Text tokens
// have all three equal, which makes the rotation plain 1-D RoPE; an image's soft tokens take its
// patch grid's rows and columns. Read against transformers' modeling_qwen3_5.py
// (Qwen3_5TextRotaryEmbedding, Qwen3_5Model.get_rope_index / get_vision_position_ids).
//
// Leaves out: videos (their frames' timestamps and time_interval); a prompt's images are still
// pictures, whose grids have t = 1 as the image processor makes them (a larger t is laid out as the
// reference lays out a grid of several frames).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace kiln {

// Which position axis (0 time, 1 row, 2 column) each of the text model's `n_pairs` rotary pairs
// follows, for config.json's rope_parameters.mrope_section (transformers'
// apply_interleaved_mrope): pair i takes the row when i % 3 == 1 and i < 3 · section[1], the column
// when i % 3 == 2 and i < 3 · section[2], the time otherwise. [11, 11, 10] over 32 pairs gives
// t h w t h w … t h w t h.
std::vector<int32_t> qwen3_5_mrope_pair_axes(int64_t n_pairs, std::span<const int64_t> mrope_section);

// What laying out a prompt's positions needs to know of the model.
struct Qwen35PromptTokens {
  int32_t image_token_id = 248056;  // <|image_pad|>: one per soft token of an image
  int64_t spatial_merge_size = 2;   // vision_config: patches merged into one soft token per side
};

// The rotary positions of a whole prompt, [3 × n] axis-major (all of time, then row, then column),
// as transformers' get_rope_index lays them out from the ids and each image's patch grid {t, h, w}
// (in the order the images appear). Walking the prompt with a running position p (from 0):
//   - a text token takes p on all three axes; p += 1;
//   - an image's t·(h/m)·(w/m) placeholder tokens (m = spatial_merge_size), in the merged grid's
//     order (frame, row, column), take (p + frame, p + row, p + column); then p += max(h, w) / m.
// Decoding continues from the largest position + 1 (the rope delta, which the runtime keeps per
// sequence). An error when the placeholders and the grids disagree: an image whose run of
// placeholder tokens is shorter than its soft tokens, placeholders left over, or images left over.
// (transformers finds an image as a run of consecutive placeholders; two images with no token
// between them, which the chat templates never write, are laid out here one after the other.)
Result<std::vector<int32_t>> qwen3_5_rope_positions(std::span<const int32_t> ids,
                                                    std::span<const std::vector<int64_t>> image_grids,
                                                    const Qwen35PromptTokens& tokens);

}  // namespace kiln
