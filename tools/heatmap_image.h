// The picture `tessera heatmap` writes: a slide thumbnail, per-tile scores painted over it in
// viridis, and a legend band below that names the score, the colour map and the scale.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "compute/feature_file.h"
#include "data/slide.h"

namespace tessera::cli {

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

// The colour map's name, as the legend and the summary say it.
constexpr const char* kColourMap = "viridis";

// The level whose longer side is nearest `max_size`.
int thumbnail_level(const data::Slide& slide, int max_size);

// `level` read whole (its first three channels) and, when its longer side exceeds `max_size`,
// shrunk to it by averaging the source pixels under each thumbnail pixel.
Image read_thumbnail(const data::Slide& slide, int level, int max_size);

// Where scores sit on the colour map: [low, high] maps to its two ends.
struct ScoreScale {
  float low = 0, high = 1;
  bool fixed = true;  // the head's probability, 0 to 1; else stretched over this slide's scores
};

// Each thumbnail pixel takes the highest score of the tiles over it, placed on `scale`, and is
// blended once with `alpha` of the colour.
void paint_scores(Image& image, const FeatureFileTiles& tiles, const std::vector<float>& scores,
                  const data::SlideLevel& base, double alpha, const ScoreScale& scale);

// Adds the legend band below the image (widening it to fit the text when the thumbnail is
// narrow): "<score>, VIRIDIS, FIXED SCALE" or "..., STRETCHED TO THIS SLIDE", the colour bar,
// and the score at its ticks. Returns the band's height.
int add_legend(Image& image, const std::string& score_name, const ScoreScale& scale);

}  // namespace tessera::cli
