// A slide's tiles, in grid order, with their level-0 origins and pixels: read back from a tile
// store (tile_store.h), or live from the slide through the grid, level choice and tissue
// detection that `tessera tile` uses. The tiler, the training loader's patch source and
// extraction read tiles through this one interface.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/slide.h"
#include "data/slide_record.h"
#include "data/tiler.h"
#include "data/tissue.h"

namespace tessera::data {

// A tile's top-left corner in level-0 pixels.
struct TileOrigin {
  int64_t x = 0, y = 0;
  auto operator<=>(const TileOrigin&) const = default;
};

class TileSource {
 public:
  virtual ~TileSource() = default;
  // The slide and how its tiles are cut: level, tile_size, channels, grid and tissue.
  virtual const SlideRecord& record() const = 0;
  virtual size_t size() const = 0;
  virtual TileOrigin origin(size_t index) const = 0;
  // Writes tile `index` as tile_size x tile_size x channels uint8, row-major, and returns its
  // label (0 for a live slide); with `pixels` null, returns the label alone and decodes nothing.
  // Safe from several threads. Throws BadInput naming the slide (or store) and the tile.
  virtual uint32_t read(size_t index, uint8_t* pixels) const = 0;
  // The tile in messages: "slide.svs level 0 at (2240, 448)", "store tile slide 2 level 0 row ...".
  virtual std::string describe(size_t index) const = 0;
};

// Where a slide's tiles lie: squares of `size` pixels of `level`, a grid of columns x rows, of
// which `kept` (row * columns + column, ascending) hold enough tissue.
struct TileGrid {
  int level = 0, size = 0;
  int64_t columns = 0, rows = 0;
  std::vector<uint32_t> kept;
  int64_t column(size_t index) const { return kept[index] % columns; }
  int64_t row(size_t index) const { return kept[index] / columns; }
};

// Tissue detection as `tile --tissue --tissue-threshold` asks, for tiles of `extent` level-0
// pixels; none with --tissue none (every tile is kept).
std::optional<TissueMask> find_tissue(const Slide& slide, double extent, const TilerOptions& options);

// The grid of `level` in `size` squares, keeping the tiles at least `min_tissue` tissue by `mask`
// (every one without a mask).
TileGrid tissue_grid(const Slide& slide, int level, int size, const TissueMask* mask, double min_tissue);

// A slide's grid tiles read live: read() reads each from the slide (no store, nothing encoded).
// `record` describes the slide and its tiling (describe_slide), its grid and tissue filled in here.
std::unique_ptr<TileSource> live_grid_tiles(std::shared_ptr<const Slide> slide, SlideRecord record, TileGrid grid,
                                            const TissueMask* mask);

// Squares of record.tile_size pixels of record.level at given level-0 origins (coordinates from
// another tool: extract --coords), read live. An origin maps to the level's pixel nearest it.
std::unique_ptr<TileSource> live_tiles_at(std::shared_ptr<const Slide> slide, SlideRecord record,
                                          std::vector<TileOrigin> origins);

// Where to read a slide for a model trained at `microns_per_pixel` whose input is `image_size`
// pixels: squares of `read_size` pixels of `level`, shrunk to image_size (resize.h). The level is
// the first whose pixel is the model's within 10% of a level-0 pixel (TRIDENT's tolerance), else
// the coarsest one finer than it, so tiles are only ever shrunk.
struct MagnificationRead {
  int level = 0;
  int read_size = 0;
};
// `slide_mpp`: microns per level-0 pixel. Throws BadInput naming `slide` when even level 0 is
// coarser than the model reads (tessera does not enlarge tiles).
MagnificationRead read_at_magnification(const std::string& slide, const std::vector<double>& downsamples,
                                        double slide_mpp, double microns_per_pixel, int image_size,
                                        const std::string& model);

}  // namespace tessera::data
