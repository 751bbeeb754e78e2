// Synthetic whole-slide images with known tumour regions (or none), written in bounded memory:
// H&E-like bright-field, or fluorescence on a dark background (synthetic_tissue.h) as an RGB
// composite or as a multiplex OME-TIFF of one grey plane a channel.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace tessera::data {

struct SyntheticSlideOptions {
  int64_t width = 0, height = 0;
  uint64_t seed = 0;
  int tile_size = 256;
  int quality = 85;
  double mpp = 0.25;  // microns per level-0 pixel
  int workers = 1;
  // false: no tumour regions (an empty mask and GeoJSON); tissue and stain are those the seed
  // gives with tumour, so two such slides differ only in the tumour.
  bool tumour = true;
  bool fluorescence = false;
  // 3: an RGB JPEG BigTIFF pyramid; any other count (fluorescence only): an OME-TIFF of one
  // deflate-compressed 8-bit plane a channel, each with its pyramid in SubIFDs.
  int channels = 3;
};

struct SyntheticSlidePaths {
  std::string slide;    // pyramidal tiled BigTIFF (JPEG RGB, or OME-TIFF planes)
  std::string mask;     // uint8 TIFF at low resolution: 1 tumour, 0 elsewhere
  std::string geojson;  // FeatureCollection of the tumour polygons, level-0 pixels
};

// Writes the three files and returns a summary: levels, mask downsample, tissue and tumour
// area fractions, tile counts, seconds.
nlohmann::json write_synthetic_slide(const SyntheticSlideOptions& options, const SyntheticSlidePaths& paths);

}  // namespace tessera::data
