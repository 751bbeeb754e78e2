// Synthetic H&E-like whole-slide images with known tumour regions (or none), written in bounded memory.
//
// Tissue and tumour regions are star-shaped polygons drawn from the seed; every pixel of every
// pyramid level is computed from them and from hashed cell grids (stroma texture, nuclei), so
// no level is ever held in memory and the GeoJSON polygons are the exact tumour boundaries.
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
};

struct SyntheticSlidePaths {
  std::string slide;    // pyramidal JPEG-compressed tiled BigTIFF
  std::string mask;     // uint8 TIFF at low resolution: 1 tumour, 0 elsewhere
  std::string geojson;  // FeatureCollection of the tumour polygons, level-0 pixels
};

// Writes the three files and returns a summary: levels, mask downsample, tissue and tumour
// area fractions, tile counts, seconds.
nlohmann::json write_synthetic_slide(const SyntheticSlideOptions& options, const SyntheticSlidePaths& paths);

}  // namespace tessera::data
