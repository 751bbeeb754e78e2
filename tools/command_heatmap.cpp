// tessera heatmap: a slide thumbnail with the per-tile scores of a trained slide-level head
// (tessera train --features) painted over it in a perceptual colour map.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "compute/feature_file.h"
#include "jobs/mil.h"
#include "compute/vk/context.h"
#include "data/png.h"
#include "data/slide.h"
#include "tools/commands.h"

namespace tessera::cli {

namespace {

struct HeatmapFlags {
  std::string features, model, slide, out;
  int max_size = 1024;
  double alpha = 0.5;
  int device = -1;
};

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

// Viridis (matplotlib) at nine even steps: perceptually uniform and readable in grey.
constexpr std::array<std::array<float, 3>, 9> kViridis{{{68, 1, 84},
                                                        {71, 44, 122},
                                                        {59, 81, 139},
                                                        {44, 113, 142},
                                                        {33, 144, 141},
                                                        {39, 173, 129},
                                                        {92, 200, 99},
                                                        {170, 220, 50},
                                                        {253, 231, 37}}};

std::array<float, 3> viridis(float score) {
  float position = std::clamp(score, 0.0f, 1.0f) * static_cast<float>(kViridis.size() - 1);
  auto low = std::min(static_cast<size_t>(position), kViridis.size() - 2);
  float t = position - static_cast<float>(low);
  std::array<float, 3> colour;
  for (size_t c = 0; c < 3; ++c) colour[c] = kViridis[low][c] + t * (kViridis[low + 1][c] - kViridis[low][c]);
  return colour;
}

// The level whose longer side is nearest `max_size`.
int thumbnail_level(const data::Slide& slide, int max_size) {
  const auto& levels = slide.levels();
  int best = 0;
  auto distance = [&](size_t level) {
    return std::abs(static_cast<double>(std::max(levels[level].width, levels[level].height)) - max_size);
  };
  for (size_t level = 1; level < levels.size(); ++level)
    if (distance(level) < distance(static_cast<size_t>(best))) best = static_cast<int>(level);
  return best;
}

// `level` read whole and, when its longer side exceeds `max_size`, shrunk to it by averaging
// the source pixels under each thumbnail pixel.
Image read_thumbnail(const data::Slide& slide, int level, int max_size) {
  const auto& source_level = slide.levels()[static_cast<size_t>(level)];
  auto source_width = static_cast<int>(source_level.width), source_height = static_cast<int>(source_level.height);
  std::vector<uint8_t> source(static_cast<size_t>(source_width) * static_cast<size_t>(source_height) * 3);
  slide.read_region(level, 0, 0, source_width, source_height, source.data());
  double scale = std::min(1.0, max_size / static_cast<double>(std::max(source_width, source_height)));
  Image image{std::max(1, static_cast<int>(std::lround(source_width * scale))),
              std::max(1, static_cast<int>(std::lround(source_height * scale))), {}};
  image.rgb.resize(static_cast<size_t>(image.width) * static_cast<size_t>(image.height) * 3);
  auto span = [](int index, int from, int to) {
    int first = static_cast<int>(static_cast<int64_t>(index) * from / to);
    int last = std::max(first + 1, static_cast<int>((static_cast<int64_t>(index) + 1) * from / to));
    return std::pair{first, std::min(last, from)};
  };
  for (int y = 0; y < image.height; ++y) {
    auto [y0, y1] = span(y, source_height, image.height);
    for (int x = 0; x < image.width; ++x) {
      auto [x0, x1] = span(x, source_width, image.width);
      std::array<uint32_t, 3> sum{};
      for (int sy = y0; sy < y1; ++sy)
        for (int sx = x0; sx < x1; ++sx)
          for (size_t c = 0; c < 3; ++c)
            sum[c] += source[(static_cast<size_t>(sy) * static_cast<size_t>(source_width) + static_cast<size_t>(sx)) * 3 + c];
      auto count = static_cast<uint32_t>((y1 - y0) * (x1 - x0));
      for (size_t c = 0; c < 3; ++c)
        image.rgb[(static_cast<size_t>(y) * static_cast<size_t>(image.width) + static_cast<size_t>(x)) * 3 + c] =
            static_cast<uint8_t>((sum[c] + count / 2) / count);
    }
  }
  return image;
}

// Every tile must start on the slide (tiles on its right and bottom edges may run past it).
void check_coords(const FeatureFileTiles& tiles, const data::Slide& slide, const std::string& features_path) {
  const auto& base = slide.levels()[0];
  for (size_t n = 0; n < tiles.coords.size() / 2; ++n) {
    int64_t x = tiles.coords[2 * n], y = tiles.coords[2 * n + 1];
    if (x < 0 || y < 0 || x >= base.width || y >= base.height)
      throw BadInput(features_path + ": tile " + std::to_string(n) + " at (" + std::to_string(x) + ", " +
                     std::to_string(y) + ") lies outside the slide " + slide.path() + " (" +
                     std::to_string(base.width) + "x" + std::to_string(base.height) + " at level 0)");
  }
}

// Each thumbnail pixel takes the highest score of the tiles over it, then is blended once.
void paint_scores(Image& image, const FeatureFileTiles& tiles, const std::vector<float>& scores,
                  const data::SlideLevel& base, double alpha) {
  double scale_x = image.width / static_cast<double>(base.width);
  double scale_y = image.height / static_cast<double>(base.height);
  std::vector<float> pixel_scores(static_cast<size_t>(image.width) * static_cast<size_t>(image.height), -1.0f);
  for (size_t n = 0; n < scores.size(); ++n) {
    auto x = static_cast<double>(tiles.coords[2 * n]), y = static_cast<double>(tiles.coords[2 * n + 1]);
    int x0 = static_cast<int>(std::floor(x * scale_x)), y0 = static_cast<int>(std::floor(y * scale_y));
    int x1 = std::min(image.width, std::max(x0 + 1, static_cast<int>(std::ceil((x + tiles.extent()) * scale_x))));
    int y1 = std::min(image.height, std::max(y0 + 1, static_cast<int>(std::ceil((y + tiles.extent()) * scale_y))));
    for (int py = y0; py < y1; ++py)
      for (int px = x0; px < x1; ++px) {
        float& pixel = pixel_scores[static_cast<size_t>(py) * static_cast<size_t>(image.width) + static_cast<size_t>(px)];
        pixel = std::max(pixel, scores[n]);
      }
  }
  for (size_t p = 0; p < pixel_scores.size(); ++p) {
    if (pixel_scores[p] < 0) continue;
    auto colour = viridis(pixel_scores[p]);
    for (size_t c = 0; c < 3; ++c) {
      double blended = (1 - alpha) * image.rgb[p * 3 + c] + alpha * colour[c];
      image.rgb[p * 3 + c] = static_cast<uint8_t>(std::lround(std::clamp(blended, 0.0, 255.0)));
    }
  }
}

void run_heatmap(const HeatmapFlags& flags) {
  if (flags.max_size < 1) throw UsageError("--max-size must be at least 1");
  if (!(flags.alpha >= 0 && flags.alpha <= 1)) throw UsageError("--alpha must be in [0, 1]");
  FeatureFileTiles tiles = read_feature_tiles(flags.features);
  auto slide = data::open_slide(flags.slide);
  check_coords(tiles, *slide, flags.features);

  vk::ContextOptions options = vk::options_from_environment();
  options.device_index = flags.device;
  vk::Context context(options);
  std::vector<float> scores = tile_scores(context, flags.features, flags.model);
  if (scores.size() * 2 != tiles.coords.size())
    throw BadInput(flags.features + ": features has " + std::to_string(scores.size()) + " rows but coords " +
                   std::to_string(tiles.coords.size() / 2));

  int level = thumbnail_level(*slide, flags.max_size);
  Image image = read_thumbnail(*slide, level, flags.max_size);
  paint_scores(image, tiles, scores, slide->levels()[0], flags.alpha);
  data::write_png_rgb(flags.out, image.width, image.height, image.rgb.data());

  auto [low, high] = std::minmax_element(scores.begin(), scores.end());
  nlohmann::json summary{{"event", "heatmap"}, {"out", flags.out},       {"width", image.width},
                         {"height", image.height}, {"level", level},      {"tiles", scores.size()},
                         {"score_min", *low},      {"score_max", *high}};
  std::printf("%s\n", summary.dump().c_str());
}

}  // namespace

void add_heatmap_command(CLI::App& app) {
  auto* command = app.add_subcommand("heatmap", "A slide thumbnail with a trained MIL head's tile scores overlaid");
  auto flags = std::make_shared<HeatmapFlags>();
  command->add_option("--features", flags->features, "The slide's feature file (tessera extract)")->required();
  command->add_option("--model", flags->model, "A head's checkpoint (tessera train --features)")->required();
  command->add_option("--slide", flags->slide, "The slide the feature file was extracted from")->required();
  command->add_option("--out", flags->out, "PNG to write")->required();
  command->add_option("--max-size", flags->max_size, "Longer side of the thumbnail in pixels")->capture_default_str();
  command->add_option("--alpha", flags->alpha, "Opacity of the colour map over the thumbnail")->capture_default_str();
  command->add_option("--device", flags->device, "Vulkan device index");
  command->callback([flags] { run_heatmap(*flags); });
}

}  // namespace tessera::cli
