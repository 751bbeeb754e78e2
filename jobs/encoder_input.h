// What a patch encoder reads (extract --encoder): tiles of its input size at the magnification
// it was trained at (data::read_at_magnification finds where on a slide), normalised by its mean
// and std (compute/vit_presets.json's "preprocessing", from each model card).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/slide_record.h"

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

// The microns per level-0 pixel of a slide: the file's (mpp_x and mpp_y), else --mpp (`flag`, 0:
// not given); UsageError (exit 2) naming --mpp when neither gives one.
double slide_microns_per_pixel(const std::string& slide, double mpp_x, double mpp_y, double flag);

// --tiles for an encoder: throws BadInput naming the store and slide when a tile store entry's
// tiles do not cover the encoder's field (image_size pixels at its microns per pixel).
void check_tiles_fit_encoder(const std::string& store, const data::SlideRecord& record, double mpp_flag,
                             const EncoderInput& encoder);

}  // namespace tessera
