// Tissue detection on a low-resolution image of the slide, after CLAM (Lu et al. 2021): HSV
// saturation of each mask pixel's mean colour, 5x5 median, a fixed threshold (8 of 255 by
// default), a morphological close, and holes enclosed by tissue filled when smaller than 16 tiles.
// A fixed threshold keeps pale stroma and fat whatever share of the slide the tissue covers
// (Otsu's threshold splits stained from pale tissue when tissue dominates).
#pragma once
#include <cstdint>
#include <vector>

#include "data/slide.h"

namespace tessera::data {

// Saturation (0-255) from which a mask pixel is tissue: CLAM's default.
constexpr int default_tissue_threshold = 8;

class TissueMask {
 public:
  // Detects tissue on the lowest-resolution level where a tile of `tile_extent` level-0 pixels
  // spans at least 8 pixels, averaged down to about 16 mask pixels per tile side (and at most
  // 4096 mask pixels a side). Throws BadInput naming the slide when most of it is dark (a
  // fluorescence image: tissue on a dark background, which saturation cannot separate).
  TissueMask(const Slide& slide, double tile_extent, int threshold = default_tissue_threshold);

  // Fraction of mask pixels in the level-0 rectangle [x0, x1) x [y0, y1) that are tissue.
  double tissue_fraction(double x0, double y0, double x1, double y1) const;

  int threshold() const { return threshold_; }
  int level() const { return level_; }
  int width() const { return width_; }
  int height() const { return height_; }
  // Level-0 pixels per mask pixel.
  double scale_x() const { return scale_x_; }
  double scale_y() const { return scale_y_; }

 private:
  int level_ = 0, width_ = 0, height_ = 0, threshold_ = 0;
  double scale_x_ = 1, scale_y_ = 1;
  std::vector<uint8_t> tissue_;  // 1 tissue, 0 glass
};

}  // namespace tessera::data
