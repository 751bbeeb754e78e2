// Tissue detection on a low-resolution level: HSV saturation, 5x5 median blur, Otsu threshold.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "data/slide.h"

namespace tessera::data {

class TissueMask {
 public:
  // Detects tissue at the lowest-resolution level where a tile of `tile_extent` level-0 pixels
  // still spans at least 8 pixels (reduced further so the mask stays within 4096 pixels a side).
  // `fixed_threshold` (saturation 0-255) replaces Otsu's threshold when given.
  TissueMask(const Slide& slide, double tile_extent, std::optional<int> fixed_threshold);

  // Fraction of mask pixels in the level-0 rectangle [x0, x1) x [y0, y1) that are tissue.
  double tissue_fraction(double x0, double y0, double x1, double y1) const;

  int threshold() const { return threshold_; }
  int level() const { return level_; }
  int width() const { return width_; }
  int height() const { return height_; }

 private:
  int level_ = 0, width_ = 0, height_ = 0, threshold_ = 0;
  double scale_x_ = 1, scale_y_ = 1;  // level-0 pixels per mask pixel
  std::vector<uint8_t> saturation_;
};

// Otsu's threshold of a 256-bin histogram: the value that maximises the between-class variance
// of the classes below it and at or above it.
int otsu_threshold(const std::vector<uint64_t>& histogram);

}  // namespace tessera::data
