// What a patch encoder reads (extract --encoder): tiles of its input size at the magnification
// it was trained at, normalised by its mean and std (compute/vit_presets.json's "preprocessing",
// from each model card), and where on a slide those tiles come from.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/tiler.h"

namespace tessera {

struct EncoderInput {
  std::string name;  // the preset or model JSON
  int image_size = 224;
  double microns_per_pixel = 0.5;
  std::array<double, 3> mean{}, std{};
  // The layer before the model: uint8 images normalised into its "input".
  nlohmann::json prologue() const;
  // What feature files record of it (their extraction attribute).
  nlohmann::json describe() const;
};

// The input of a ViT preset or model JSON; throws ModelError when it is not a ViT.
EncoderInput encoder_input(const std::string& encoder);

// Where a slide's tiles are read for an encoder: squares of `read_size` pixels of `level`,
// resized to its image_size (data/resize.h). The level is the one whose pixel size is the
// encoder's within 10% of a level-0 pixel's (TRIDENT's tolerance), else the coarsest one finer
// than the encoder's, so tiles are only ever shrunk.
struct TileSource {
  int level = 0;
  int read_size = 0;
  double slide_mpp = 0;  // microns per level-0 pixel
};

// The microns per level-0 pixel of a slide: the file's (mpp_x and mpp_y), else --mpp (`flag`, 0:
// not given); UsageError (exit 2) naming --mpp when neither gives one.
double slide_microns_per_pixel(const std::string& slide, double mpp_x, double mpp_y, double flag);

// Throws BadInput naming the slide when even level 0 is coarser than the encoder reads.
TileSource tile_source(const std::string& slide, const std::vector<double>& downsamples, double slide_mpp,
                       const EncoderInput& encoder);

// --slides for an encoder: each slide opened for its levels and pixel size, and the slides
// grouped by the level and tile size they are tiled at (one tiling run each).
struct TilingGroup {
  data::TilerOptions options;
  std::vector<data::SlideJob> jobs;
};
std::vector<TilingGroup> encoder_tiling(const std::vector<data::SlideJob>& jobs, const data::TilerOptions& options,
                                        double mpp_flag, const EncoderInput& encoder);

// --tiles for an encoder: throws BadInput naming the store and slide when a tile store entry's
// tiles do not cover the encoder's field (image_size pixels at its microns per pixel).
void check_tiles_fit_encoder(const std::string& store, const nlohmann::json& entry, double mpp_flag,
                             const EncoderInput& encoder);

}  // namespace tessera
