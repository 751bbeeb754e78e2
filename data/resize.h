// Resampling RGB tiles to a model's input size (an encoder's tiles read at its trained
// magnification: data/README.md). The box filter as Pillow's Image.resize(size, Image.BOX)
// computes it, to the byte: each output pixel the area-weighted mean of the input pixels its
// footprint covers, rows then columns, in 22-bit fixed point with a rounded 8-bit result
// between the passes. Halving is the 2x2 mean (what cv2.resize's INTER_LINEAR and INTER_AREA
// also give at exactly 2x, as TRIDENT reads a 40x slide for a 20x encoder).
#pragma once
#include <cstdint>

namespace tessera::data {

// `source` RGB [source_height, source_width, 3] into `target` RGB [target_height, target_width, 3].
void resize_rgb_box(const uint8_t* source, int source_width, int source_height, uint8_t* target, int target_width,
                    int target_height);

}  // namespace tessera::data
