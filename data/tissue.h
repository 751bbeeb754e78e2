// Tissue detection on a low-resolution image of the slide. Bright-field after CLAM (Lu et al.
// 2021): HSV saturation of each mask pixel's mean colour, 5x5 median, a fixed threshold (8 of
// 255 by default), a morphological close, and holes enclosed by tissue filled when smaller than
// 16 tiles. A fixed threshold keeps pale stroma and fat whatever share of the slide the tissue
// covers (Otsu's threshold splits stained from pale tissue when tissue dominates). Fluorescence
// (a dark background): the sum of the channels' means, 5x5 median, tissue where it is the
// threshold above the background's level (the commonest signal among the darker half of the
// slide), then the same close and hole filling.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/slide.h"

namespace tessera::data {

// Saturation (0-255) from which a mask pixel is tissue: CLAM's default. For fluorescence the
// same number is the signal above the background's level from which a mask pixel is tissue.
constexpr int default_tissue_threshold = 8;

// How tissue is told from background (`tile --tissue`).
enum class Stain {
  automatic,     // fluorescence for a dark slide (or one of other than 3 channels), else bright-field
  brightfield,   // stained tissue on bright glass: saturation
  fluorescence,  // signal on a dark background: the sum of the channels above the background's level
  none,          // no detection: every tile is kept (the tiler makes no mask)
};

// "automatic", "brightfield", "fluorescence", "none"; parse_stain throws UsageError naming --tissue.
const char* stain_name(Stain stain);
Stain parse_stain(const std::string& text);

// Throws UsageError naming --tissue when `stain` cannot apply to the slide (bright-field
// detection on a slide of other than 3 channels).
void check_stain_fits(Stain stain, const Slide& slide);

class TissueMask {
 public:
  // Detects tissue on the lowest-resolution level where a tile of `tile_extent` level-0 pixels
  // spans at least 8 pixels, averaged down to about 16 mask pixels per tile side (and at most
  // 4096 mask pixels a side), by `stain` (automatic: from the slide's brightness and channels).
  // Throws UsageError for Stain::none, and for brightfield on a slide of other than 3 channels.
  TissueMask(const Slide& slide, double tile_extent, int threshold = default_tissue_threshold,
             Stain stain = Stain::automatic);

  // Fraction of mask pixels in the level-0 rectangle [x0, x1) x [y0, y1) that are tissue.
  double tissue_fraction(double x0, double y0, double x1, double y1) const;

  int threshold() const { return threshold_; }
  int level() const { return level_; }
  int width() const { return width_; }
  int height() const { return height_; }
  // Level-0 pixels per mask pixel.
  double scale_x() const { return scale_x_; }
  double scale_y() const { return scale_y_; }
  // The stain detection used (never automatic), and what decided it and its threshold, for the
  // store's slide entry: {"stain", "chosen" (automatic or given), "median_brightness",
  // "background" and "signal_threshold" (fluorescence)}.
  Stain stain() const { return stain_; }
  const nlohmann::json& report() const { return report_; }

 private:
  void detect_brightfield(const std::vector<uint8_t>& saturation);
  void detect_fluorescence(const std::vector<uint16_t>& signal);

  int level_ = 0, width_ = 0, height_ = 0, threshold_ = 0, channels_ = 3;
  bool rgb_ = true;
  double scale_x_ = 1, scale_y_ = 1;
  double tile_area_ = 0;  // in mask pixels
  Stain stain_ = Stain::brightfield;
  nlohmann::json report_;
  std::vector<uint8_t> tissue_;  // 1 tissue, 0 background
};

}  // namespace tessera::data
