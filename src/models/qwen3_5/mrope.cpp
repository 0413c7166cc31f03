// Qwen 3.5's multimodal RoPE: the pairs' axes and a prompt's positions (see mrope.h).
#include "models/qwen3_5/mrope.h"

#include <algorithm>

namespace kiln {

std::vector<int32_t> qwen3_5_mrope_pair_axes(int64_t n_pairs, std::span<const int64_t> mrope_section) {
  std::vector<int32_t> axes(size_t(std::max<int64_t>(n_pairs, 0)), 0);  // time, unless overwritten
  for (int32_t axis = 1; axis <= 2 && axis < int32_t(mrope_section.size()); ++axis) {
    const int64_t end = std::min<int64_t>(n_pairs, 3 * mrope_section[size_t(axis)]);
    for (int64_t i = axis; i < end; i += 3) axes[size_t(i)] = axis;
  }
  return axes;
}

Result<std::vector<int32_t>> qwen3_5_rope_positions(std::span<const int32_t> ids,
                                                    std::span<const std::vector<int64_t>> image_grids,
                                                    const Qwen35PromptTokens& tokens) {
  const int64_t n = int64_t(ids.size()), m = tokens.spatial_merge_size;
  if (m < 1) return make_error("spatial_merge_size {} must be positive", m);
  std::vector<int32_t> out(size_t(3 * n));
  auto set = [&](int64_t token, int64_t t, int64_t h, int64_t w) {
    out[size_t(token)] = int32_t(t);
    out[size_t(n + token)] = int32_t(h);
    out[size_t(2 * n + token)] = int32_t(w);
  };
  int64_t p = 0;  // the next text position (current_pos)
  size_t image = 0;
  for (int64_t i = 0; i < n;) {
    if (ids[size_t(i)] != tokens.image_token_id) {
      set(i, p, p, p);
      ++p, ++i;
      continue;
    }
    if (image == image_grids.size())
      return make_error("the prompt holds image placeholders at token {} beyond its {} image(s)", i,
                        image_grids.size());
    const std::vector<int64_t>& grid = image_grids[image];
    if (grid.size() != 3 || grid[0] < 1 || grid[1] < 1 || grid[2] < 1 || grid[1] % m || grid[2] % m)
      return make_error("image {}: the patch grid must be {{t, h, w}} with h and w multiples of {}", image, m);
    const int64_t frames = grid[0], rows = grid[1] / m, cols = grid[2] / m;
    const int64_t count = frames * rows * cols;
    int64_t run = 0;
    while (run < count && i + run < n && ids[size_t(i + run)] == tokens.image_token_id) ++run;
    if (run < count)
      return make_error("image {} has {} soft tokens, but the prompt holds {} placeholder(s) for it at token {}", image,
                        count, run, i);
    for (int64_t f = 0; f < frames; ++f)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) set(i + (f * rows + r) * cols + c, p + f, p + r, p + c);
    p += std::max(grid[1], grid[2]) / m;
    i += count;
    ++image;
  }
  if (image != image_grids.size())
    return make_error("{} image(s) given, but the prompt holds placeholders for {}", image_grids.size(), image);
  return out;
}

}  // namespace kiln
