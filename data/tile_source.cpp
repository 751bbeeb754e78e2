#include "data/tile_source.h"

#include <cmath>
#include <sstream>

#include "common/checked.h"
#include "common/error.h"

namespace tessera::data {

namespace {

// TRIDENT's tolerance on a level's downsample (get_best_level_and_custom_downsample).
constexpr double level_tolerance = 0.1;
// The largest square a model's input is read from: 192 MiB of RGB, 15 times the side of a 518-pixel input.
constexpr int max_read_side = 8192;

std::string microns(double mpp) {
  std::ostringstream text;
  text << mpp << " um/px";
  return text.str();
}

// Squares of record.tile_size pixels of record.level, read from the slide at level-0 origins.
class LiveTiles final : public TileSource {
 public:
  LiveTiles(std::shared_ptr<const Slide> slide, SlideRecord record, std::vector<TileOrigin> origins)
      : slide_(std::move(slide)), record_(std::move(record)), origins_(std::move(origins)) {}

  const SlideRecord& record() const override { return record_; }
  size_t size() const override { return origins_.size(); }
  TileOrigin origin(size_t index) const override { return origins_.at(index); }

  uint32_t read(size_t index, uint8_t* pixels) const override {
    if (!pixels) return 0;
    const TileOrigin& at = origins_.at(index);
    // The level's pixel whose level-0 position is the origin (exact on a grid, nearest otherwise).
    auto x = static_cast<int64_t>(std::llround(static_cast<double>(at.x) / record_.downsample));
    auto y = static_cast<int64_t>(std::llround(static_cast<double>(at.y) / record_.downsample));
    slide_->read_region(record_.level, x, y, record_.tile_size, record_.tile_size, pixels);
    return 0;
  }

  std::string describe(size_t index) const override {
    const TileOrigin& at = origins_.at(index);
    return record_.path + " level " + std::to_string(record_.level) + " tile at level-0 (" + std::to_string(at.x) +
           ", " + std::to_string(at.y) + ")";
  }

 private:
  std::shared_ptr<const Slide> slide_;
  SlideRecord record_;
  std::vector<TileOrigin> origins_;
};

}  // namespace

std::optional<TissueMask> find_tissue(const Slide& slide, double extent, const TilerOptions& options) {
  if (options.tissue == Stain::none) return std::nullopt;
  return std::optional<TissueMask>(std::in_place, slide, extent, options.tissue_threshold, options.tissue);
}

TileGrid tissue_grid(const Slide& slide, int level, int size, const TissueMask* mask, double min_tissue) {
  const SlideLevel& tiled = slide.levels().at(static_cast<size_t>(level));
  within(size, 1, max_tile_size, Field(slide.path(), "tile size"), "pixels a tile header holds a side");
  TileGrid grid{level, size, tiled.width / size, tiled.height / size, {}};
  // Grid positions are 32-bit (TileGrid::kept, the store's keys): a grid of more is refused.
  Field grid_field(slide.path(), "tile grid of level " + std::to_string(level) + " in " + std::to_string(size) +
                                     "-pixel tiles (columns x rows)");
  within(multiply(grid.columns, grid.rows, grid_field), 0, int64_t{UINT32_MAX}, grid_field,
         "positions a grid index holds: use a larger tile size or a coarser level");
  const double extent = size * tiled.downsample;
  for (int64_t row = 0; row < grid.rows; ++row)
    for (int64_t column = 0; column < grid.columns; ++column) {
      double x0 = static_cast<double>(column) * extent, y0 = static_cast<double>(row) * extent;
      double fraction = mask ? mask->tissue_fraction(x0, y0, x0 + extent, y0 + extent) : 1.0;
      if (fraction >= min_tissue) grid.kept.push_back(static_cast<uint32_t>(row * grid.columns + column));
    }
  return grid;
}

std::unique_ptr<TileSource> live_grid_tiles(std::shared_ptr<const Slide> slide, SlideRecord record, TileGrid grid,
                                            const TissueMask* mask) {
  record.grid_columns = grid.columns;
  record.grid_rows = grid.rows;
  record.tissue = mask ? mask->report() : nlohmann::json{{"stain", "none"}, {"chosen", "given"}};
  if (mask) record.tissue_level = mask->level();
  record.candidates = record.done = record.tiles = grid.kept.size();
  record.complete = true;
  std::vector<TileOrigin> origins;
  origins.reserve(grid.kept.size());
  for (size_t i = 0; i < grid.kept.size(); ++i) origins.push_back({record.tile_x(grid.column(i)), record.tile_y(grid.row(i))});
  return std::make_unique<LiveTiles>(std::move(slide), std::move(record), std::move(origins));
}

std::unique_ptr<TileSource> live_tiles_at(std::shared_ptr<const Slide> slide, SlideRecord record,
                                          std::vector<TileOrigin> origins) {
  record.candidates = record.done = record.tiles = origins.size();
  record.complete = true;
  return std::make_unique<LiveTiles>(std::move(slide), std::move(record), std::move(origins));
}

MagnificationRead read_at_magnification(const std::string& slide, const std::vector<double>& downsamples,
                                        double slide_mpp, double microns_per_pixel, int image_size,
                                        const std::string& model) {
  // Level-0 pixels per model pixel.
  const double wanted = microns_per_pixel / slide_mpp;
  if (wanted < 1 - level_tolerance)
    throw BadInput(slide + ": level 0 is at " + microns(slide_mpp) + ", coarser than the " +
                   microns(microns_per_pixel) + " " + model + " was trained at; tessera does not enlarge tiles");
  size_t chosen = 0;
  for (size_t level = 0; level < downsamples.size(); ++level)
    if (std::abs(downsamples[level] - wanted) <= level_tolerance) {
      chosen = level;
      break;
    } else if (downsamples[level] <= wanted && downsamples[level] > downsamples[chosen]) {
      chosen = level;
    }
  // A pixel size the slide gives wrongly (1e-14 um) must not make the square overflow to nothing.
  std::ostringstream read_at;
  read_at << "the square " << model << " reads at level " << chosen << " (its input " << image_size << " pixels at "
          << microns(microns_per_pixel) << ", the slide's level 0 at " << microns(slide_mpp) << ")";
  return {static_cast<int>(chosen),
          rounded<int>(image_size * wanted / downsamples[chosen], Field(slide, read_at.str()), 1, max_read_side)};
}

}  // namespace tessera::data
