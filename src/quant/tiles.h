// The tiled layout of 4- and 8-bit affine weights on the GPU.
//
// A GPU decode product streams each weight once per step; the streamed products of
// src/backend/cuda/cuda_quant_tiles.cu move it as few large copies, one bulk copy a tile into
// shared memory. For them (a CUDA backend option, CudaBackendOptions) a [rows, cols] matrix is
// stored as tiles of 32 rows × slice columns (1 KB of codes a row, the last slice of a row possibly
// shorter), each tile one contiguous piece holding its codes, then its scales, then its biases
// (bf16):
//
//   matrix    = row block 0, row block 1, ...         (32 rows a block, the last possibly fewer)
//   row block = tile (b, 0), tile (b, 1), ...         (slices of the columns)
//   tile      = codes [r][c · bits / 32 words] · scales [r][c / group] · biases [r][c / group]
//               padded to 16 bytes                    (r rows, c columns)
//
// Codes keep MLX's packing within a row (src/quant/affine.h), so a chunk of 32 codes is the same
// `bits` words in either layout. The bytes are those of the MLX layout plus at most 15 a tile.
#pragma once

#include <cstdint>

#include "core/tensor.h"

#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif

namespace kiln::quant {

struct TileLayout {
  static constexpr int kTileRows = 32;
  int64_t rows = 0, cols = 0;
  int bits = 4, group_size = 64;
  // Columns of a full tile: 1 KB of codes a row (2,048 at 4 bits), a multiple of 32 chunks of 32
  // so that a warp's lanes take whole rounds of a tile's chunks; make_tile_layout() sets it.
  int slice = 0;

  KILN_HOST_DEVICE int slices() const { return int((cols + slice - 1) / slice); }
  KILN_HOST_DEVICE int64_t row_blocks() const { return (rows + kTileRows - 1) / kTileRows; }
  KILN_HOST_DEVICE int slice_cols(int s) const {
    const int64_t left = cols - int64_t(s) * slice;
    return int(left < slice ? left : slice);
  }
  KILN_HOST_DEVICE int block_rows(int64_t b) const {
    const int64_t left = rows - b * kTileRows;
    return int(left < kTileRows ? left : kTileRows);
  }
  // A tile of r rows × c columns: codes, scales and biases, padded to 16 bytes (bulk copies move
  // multiples of 16 from 16-byte aligned addresses).
  KILN_HOST_DEVICE int64_t codes_bytes(int r, int c) const { return int64_t(r) * c * bits / 8; }
  KILN_HOST_DEVICE int64_t tile_bytes(int r, int c) const {
    return (codes_bytes(r, c) + int64_t(r) * (c / group_size) * 4 + 15) / 16 * 16;
  }
  KILN_HOST_DEVICE int64_t block_bytes(int r) const {
    return int64_t(slices() - 1) * tile_bytes(r, slice) + tile_bytes(r, slice_cols(slices() - 1));
  }
  KILN_HOST_DEVICE int64_t tile_offset(int64_t b, int s) const {
    return b * block_bytes(kTileRows) + int64_t(s) * tile_bytes(block_rows(b), slice);
  }
  KILN_HOST_DEVICE int64_t total_bytes() const {
    return rows == 0 ? 0 : (row_blocks() - 1) * block_bytes(kTileRows) + block_bytes(block_rows(row_blocks() - 1));
  }

  // Where element data of (row, chunk of 32 columns) and (row, group) live, from the buffer start.
  KILN_HOST_DEVICE int64_t chunk_offset(int64_t row, int64_t chunk) const {
    const int per_slice = slice / 32, s = int(chunk / per_slice);
    const int64_t b = row / kTileRows;
    return tile_offset(b, s) + codes_bytes(int(row % kTileRows), slice_cols(s)) +
           (chunk - int64_t(s) * per_slice) * bits * 4;
  }
  // byte offset of the scale of (row, group); the bias is `bias_distance(row)` bytes after it
  KILN_HOST_DEVICE int64_t scale_offset(int64_t row, int64_t group) const {
    const int per_slice = slice / group_size, s = int(group / per_slice);
    const int64_t b = row / kTileRows;
    const int c = slice_cols(s), r = block_rows(b);
    return tile_offset(b, s) + codes_bytes(r, c) +
           2 * (int64_t(row % kTileRows) * (c / group_size) + group - int64_t(s) * per_slice);
  }
  KILN_HOST_DEVICE int64_t bias_distance(int64_t row, int64_t group) const {
    const int s = int(group / (slice / group_size));
    return 2 * int64_t(block_rows(row / kTileRows)) * (slice_cols(s) / group_size);
  }
};

// Whether a quantized matrix takes the tiled layout: [rows, cols] (not a stack of experts), 4 or 8
// bits (the widths whose integer products take a chunk's inputs eight to a code word).
bool tileable(const Tensor& w);

KILN_HOST_DEVICE inline TileLayout make_tile_layout(int64_t rows, int64_t cols, int bits, int group_size) {
  return TileLayout{.rows = rows, .cols = cols, .bits = bits, .group_size = group_size, .slice = 8192 / bits};
}

inline TileLayout tile_layout(const Tensor& w) {
  return make_tile_layout(w.rows(), w.cols(), w.quant().bits, w.quant().group_size);
}

// Writes the host quantized matrix w (MLX layout, scales and biases of any float type) into `out`,
// layout.total_bytes() bytes, in the tiled layout with bf16 scales and biases.
void write_tiles(const Tensor& w, uint8_t* out);

}  // namespace kiln::quant
