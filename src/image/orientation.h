// EXIF orientation as PIL's ImageOps.exif_transpose reads and applies it.
#pragma once

#include <string_view>

#include "image/image.h"

namespace kiln {

// The orientation tag (0x0112) of IFD0 in an EXIF block (TIFF, either byte order, with or without
// the "Exif\0\0" prefix); when there is none, the first `tiff:Orientation` of the XMP packet, as
// PIL's getexif() falls back to. 1 (as stored) when neither says, or the block is malformed.
int image_orientation(std::string_view exif, std::string_view xmp);

// The image turned upright for an orientation of 1..8, as exif_transpose does it: 2 mirror,
// 3 rotate 180°, 4 flip, 5 transpose, 6 rotate 90° clockwise, 7 transverse, 8 rotate 90°
// counter-clockwise. Other values leave it as it is.
RgbImage apply_orientation(const RgbImage& image, int orientation);

}  // namespace kiln
