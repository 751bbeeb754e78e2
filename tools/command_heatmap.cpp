// tessera heatmap: a slide thumbnail with the per-tile scores of a trained slide-level head
// (tessera train --features) painted over it in viridis, with a legend (heatmap_image.h).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/checked.h"
#include "common/error.h"
#include "common/output.h"
#include "common/progress.h"
#include "common/run_summary.h"
#include "compute/checkpoint.h"
#include "compute/feature_file.h"
#include "compute/vk/context.h"
#include "data/png.h"
#include "data/slide.h"
#include "jobs/mil.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"
#include "tools/heatmap_image.h"

namespace tessera::cli {

namespace {

struct HeatmapFlags {
  std::string features, model, slide, out, scale = "fixed";
  int max_size = 1024;
  double alpha = 0.5;
  int device = -1;
  bool overwrite = false;
};

// The feature file must be this slide's: the slide it records (name and size of its tile level)
// and its tiles, each starting on the slide (tiles on the right and bottom edges may run past).
void check_same_slide(const FeatureFileTiles& tiles, const data::Slide& slide, const std::string& features_path) {
  namespace fs = std::filesystem;
  const auto& levels = slide.levels();
  std::string file = fs::path(slide.path()).filename().string(), stem = fs::path(slide.path()).stem().string();
  if (!tiles.name.empty() && tiles.name != stem && tiles.name != file)
    throw BadInput(features_path + ": holds the features of slide '" + tiles.name + "', not of " + slide.path() +
                   " ('" + stem + "'): give the feature file of this slide, or --slide the slide it names");
  if (tiles.level_width > 0) {
    auto level = static_cast<size_t>(tiles.patch_level);
    std::string recorded = std::to_string(tiles.level_width) + "x" + std::to_string(tiles.level_height) +
                           " at level " + std::to_string(tiles.patch_level);
    if (level >= levels.size() || levels[level].width != tiles.level_width || levels[level].height != tiles.level_height)
      throw BadInput(features_path + ": was extracted from a slide of " + recorded + "; " + slide.path() + " is " +
                     (level < levels.size() ? std::to_string(levels[level].width) + "x" +
                                                  std::to_string(levels[level].height) + " there"
                                            : "without that level") +
                     ": the features of another slide");
  }
  const auto& base = levels[0];
  for (size_t n = 0; n < tiles.coords.size() / 2; ++n) {
    int64_t x = tiles.coords[2 * n], y = tiles.coords[2 * n + 1];
    if (x < 0 || y < 0 || x >= base.width || y >= base.height)
      throw BadInput(features_path + ": tile " + std::to_string(n) + " at (" + std::to_string(x) + ", " +
                     std::to_string(y) + ") lies outside the slide " + slide.path() + " (" +
                     std::to_string(base.width) + "x" + std::to_string(base.height) + " at level 0)");
  }
}

void run_heatmap(const HeatmapFlags& flags) {
  within(flags.max_size, 1, 16384, Field::flag("--max-size"), "the thumbnail's longer side, pixels");
  if (!(flags.alpha >= 0 && flags.alpha <= 1)) throw UsageError("--alpha must be in [0, 1]");
  if (flags.scale != "fixed" && flags.scale != "slide")
    throw UsageError("--scale: fixed (the probability, 0 to 1) or slide (stretched), not '" + flags.scale + "'");
  // The writer discipline (common/output.h): no input replaced, the PNG locked for the run, an
  // existing one replaced only with --overwrite, and written to a new temporary renamed over it.
  refuse_output_over_inputs("--out", flags.out,
                            {{"--features", flags.features}, {"--model", flags.model}, {"--slide", flags.slide}});
  OutputLock lock(flags.out);
  check_replaceable(flags.out, "--out", flags.overwrite ? Existing::overwrite : Existing::refuse);
  FeatureFileTiles tiles = read_feature_tiles(flags.features);
  auto slide = data::open_slide(flags.slide);
  check_same_slide(tiles, *slide, flags.features);

  // Three steps: the tiles' scores, the thumbnail, the painted PNG.
  Progress progress("heatmap", 3, "heatmap " + flags.slide);
  vk::ContextOptions options = vk::options_from_environment();
  options.device_index = flags.device;
  vk::Context context(options);
  std::vector<float> scores = tile_scores(context, flags.features, flags.model);
  if (scores.size() * 2 != tiles.coords.size())
    throw BadInput(flags.features + ": features has " + std::to_string(scores.size()) + " rows but coords " +
                   std::to_string(tiles.coords.size() / 2));
  nlohmann::json model = read_checkpoint(flags.model).model;
  std::string positive = model["classes"].back().get<std::string>();
  // A clam or transmil head's tiles are scored by their attention's percentile in the slide
  // (jobs/mil.h tile_scores; transmil's from the class token).
  std::string head = model.value("head", std::string());
  std::string score = head == "clam-sb"    ? "attention percentile"
                      : head == "clam-mb"  ? "attention percentile of class '" + positive + "'"
                      : head == "transmil" ? "class-token attention percentile"
                                           : "probability of class '" + positive + "'";
  std::string legend_title = head == "clam-sb"    ? "attention percentile by tile"
                             : head == "clam-mb"  ? "attention to " + positive + " (percentile) by tile"
                             : head == "transmil" ? "class-token attention percentile by tile"
                                                  : "P(" + positive + ") by tile";
  progress.update(1);

  auto [low, high] = std::minmax_element(scores.begin(), scores.end());
  ScoreScale scale;
  if (flags.scale == "slide" && !scores.empty()) scale = {*low, *high, false};
  int level = thumbnail_level(*slide, flags.max_size);
  Image image = read_thumbnail(*slide, level, flags.max_size);
  progress.update(2);
  int thumbnail_width = image.width, thumbnail_height = image.height;
  paint_scores(image, tiles, scores, slide->levels()[0], flags.alpha, scale);
  int legend = add_legend(image, legend_title, scale);
  data::write_png_rgb(flags.out, image.width, image.height, image.rgb.data());

  nlohmann::json summary{{"event", "heatmap"},
                         {"out", flags.out},
                         {"width", image.width},
                         {"height", image.height},
                         {"thumbnail", {thumbnail_width, thumbnail_height}},
                         {"legend_height", legend},
                         {"level", level},
                         {"tiles", scores.size()},
                         {"score", score},
                         {"colour_map", kColourMap},
                         {"scale", flags.scale},
                         {"scale_range", {scale.low, scale.high}},
                         {"score_min", scores.empty() ? 0.0f : *low},
                         {"score_max", scores.empty() ? 0.0f : *high}};
  progress.update(3);
  auto range = [](float value) { return format_number(static_cast<double>(value)); };
  std::string line = flags.slide + "  " + std::to_string(scores.size()) + " tiles, P(" + positive + ") " +
                     (scores.empty() ? "-" : range(*low) + " to " + range(*high));
  progress.finish({{"event", "slide"}, {"slide", flags.slide}, {"tiles", scores.size()}}, line);
  print_result(summary, "heatmap: " + flags.out + " (" + std::to_string(image.width) + "x" +
                            std::to_string(image.height) + ", thumbnail of level " + std::to_string(level) +
                            ", colours " + (flags.scale == "fixed" ? "0 to 1" : range(scale.low) + " to " +
                                                                               range(scale.high)) + ")\n");
}

}  // namespace

void add_heatmap_command(CLI::App& app) {
  auto* command = app.add_subcommand(
      "heatmap", "A slide thumbnail with a trained MIL head's tile probabilities overlaid, and a legend");
  auto flags = std::make_shared<HeatmapFlags>();
  command->add_option("--features", flags->features, "The slide's feature file (tessera extract)")->required();
  command->add_option("--model", flags->model, "A head's checkpoint (tessera train --features)")->required();
  command->add_option("--slide", flags->slide, "The slide the feature file was extracted from")->required();
  command->add_option("--out", flags->out, "PNG to write")->required();
  command->add_flag("--overwrite", flags->overwrite, "Replace an existing --out (otherwise refused)");
  command
      ->add_option("--scale", flags->scale,
                   "fixed: colours mean the same probability on every slide (0 to 1); slide: stretched over "
                   "this slide's lowest to highest score")
      ->capture_default_str();
  command->add_option("--max-size", flags->max_size, "Longer side of the thumbnail in pixels")->capture_default_str();
  command->add_option("--alpha", flags->alpha, "Opacity of the colour map over the thumbnail")->capture_default_str();
  command->add_option("--device", flags->device, "Vulkan device index");
  command->callback([flags] { run_heatmap(*flags); });
}

}  // namespace tessera::cli
