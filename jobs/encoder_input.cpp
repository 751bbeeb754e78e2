#include "jobs/encoder_input.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/json_input.h"
#include "compute/network.h"
#include "compute/ops/input_normalize.h"
#include "compute/ops/registry.h"
#include "compute/vit.h"

namespace tessera {

namespace {

std::string microns(double mpp) {
  std::ostringstream text;
  text << mpp << " um/px";
  return text.str();
}

nlohmann::json read_description(const std::string& encoder) {
  if (is_vit_description({{"preset", encoder}})) return {{"preset", encoder}};
  return read_model_description(encoder, "--encoder");
}

}  // namespace

EncoderInput encoder_input(const std::string& encoder) {
  nlohmann::json description = read_description(encoder);
  if (!is_vit_description(description))
    throw ModelError("--encoder " + encoder + ": not a ViT (a preset: " + vit_preset_list() +
                     "; or a model JSON with \"family\": \"vit\")");
  nlohmann::json settings = vit_settings(description);
  nlohmann::json preprocessing = settings.value("preprocessing", nlohmann::json::object());
  if (!preprocessing.is_object())
    throw ModelError(encoder + ": field 'preprocessing' must be an object, got " + json_excerpt(preprocessing));
  preprocessing.update({{"name", "preprocessing"}, {"type", "preprocessing"}});
  EncoderInput input;
  input.name = encoder;
  // vit_graph has checked the description's own fields (resolve_model builds it first).
  const int learned_size = settings.value("image_size", 224);
  try {
    LayerConfig fields(preprocessing);
    // The tiles read: the size the position embedding was learned at, unless the publisher's
    // transform reads others (kaiko-vitl14: 224 pixels, its embedding resampled from 518's grid).
    input.image_size = static_cast<int>(fields.integer("input_size", learned_size, 1, 4096));
    const int64_t patch = settings.value("patch_size", 1);
    if (input.image_size % patch != 0) fields.fail("input_size", "must be a multiple of patch_size " + std::to_string(patch));
    Normalisation normalisation = read_normalisation(fields);
    std::copy(normalisation.mean.begin(), normalisation.mean.end(), input.mean.begin());
    std::copy(normalisation.std.begin(), normalisation.std.end(), input.std.begin());
    input.microns_per_pixel = fields.number("microns_per_pixel", 0.5);
    // Encoders read at 0.25 to 2 um/px (40x to 5x); 100 is a 0.1x objective, past any scanner.
    if (!(input.microns_per_pixel > 0 && input.microns_per_pixel <= 100))
      fields.fail("microns_per_pixel", "must be above 0 and at most 100");
    fields.refuse_unread();
  } catch (const ModelError& e) {
    // "model: layer 'preprocessing': field 'std' ...": here the file says whose.
    std::string problem = e.what();
    throw ModelError(encoder + ": preprocessing: " + problem.substr(std::min(problem.size(), problem.find("field"))));
  }
  return input;
}

nlohmann::json EncoderInput::prologue() const {
  return nlohmann::json::array(
      {{{"name", "input"}, {"type", "input_normalize"}, {"inputs", {"images"}}, {"mean", mean}, {"std", std}}});
}

nlohmann::json EncoderInput::describe() const {
  return {{"encoder", name},
          {"image_size", image_size},
          {"microns_per_pixel", microns_per_pixel},
          {"mean", mean},
          {"std", std},
          {"resize", "box"}};
}

double slide_microns_per_pixel(const std::string& slide, double mpp_x, double mpp_y, double flag) {
  if (mpp_x > 0 && mpp_y > 0) return (mpp_x + mpp_y) / 2;
  if (mpp_x > 0 || mpp_y > 0) return std::max(mpp_x, mpp_y);
  if (flag > 0) return flag;
  throw UsageError(slide + ": the file does not give its microns per pixel, which an encoder needs to read tiles at "
                   "its magnification: give it with --mpp (e.g. --mpp 0.25 for a 40x scan)");
}

void check_tiles_fit_encoder(const std::string& store, const data::SlideRecord& record, double mpp_flag,
                             const EncoderInput& encoder) {
  const std::string slide = record.path.empty() ? store : record.path;
  double mpp = slide_microns_per_pixel(slide, record.mpp_x, record.mpp_y, mpp_flag);
  const double downsample = record.downsample;
  const double field = record.tile_size * downsample * mpp;
  const double wanted = encoder.image_size * encoder.microns_per_pixel;
  // Tiles are whole pixels of their level: within one of them of the encoder's field.
  if (std::abs(field - wanted) > downsample * mpp || downsample * mpp > encoder.microns_per_pixel * 1.1)
    throw BadInput(store + ": slide " + slide + " is tiled in " + std::to_string(record.tile_size) +
                   "-pixel tiles at " + microns(downsample * mpp) + " (level " + std::to_string(record.level) +
                   "), " + std::to_string(field) + " um across; encoder " + encoder.name + " reads " +
                   std::to_string(encoder.image_size) + "-pixel tiles at " + microns(encoder.microns_per_pixel) +
                   ": extract --slides with --encoder reads them so");
}

}  // namespace tessera
