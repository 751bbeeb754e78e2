// A slide's entry in a tile store (its `slides` database): the slide, how it was tiled and how
// far tiling got, as one struct with one JSON mapping. Its defaults (for entries written before a
// field existed) and its checks live here only; the table in docs/architecture.md ("Formats",
// "Slide record") gives every field's JSON type, default, meaning and checks, and
// python/tessera/slide_record.py reads them by the same rules (tests/test_python_slide_record.py
// holds the two to the same defaults, messages and JSON).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/slide.h"

namespace tessera::data {

struct SlideRecord {
  // The slide.
  std::string path;         // absolute, as tiled
  std::string name;         // its file name
  std::string format;       // "tiff", "openslide:aperio", ...
  std::string fingerprint;  // its content (tiler.h): empty in stores tiled before fingerprints
  int64_t width = 0, height = 0;  // level 0
  double mpp_x = 0, mpp_y = 0;    // microns per level-0 pixel; 0 when the file does not say
  int channels = 3;
  bool rgb = true;  // red, green and blue of a colour image, not a multiplex slide's planes
  std::vector<std::string> channel_names;
  int sample_bits = 8;                            // 16: planes mapped to 8 bits through...
  std::vector<IntensityWindow> intensity_windows;  // ... one window a channel

  // How it is tiled: squares of tile_size pixels of `level`.
  int level = 0;
  int64_t level_width = 0, level_height = 0;
  double downsample = 1;  // level-0 pixels per pixel of `level`
  int tile_size = 0;
  nlohmann::json settings;  // the tiling settings a resumed run must match (compared whole)
  int64_t grid_columns = 0, grid_rows = 0;
  nlohmann::json tissue;  // how tissue was found (TissueMask::report)
  std::optional<int> tissue_level;
  uint64_t candidates = 0;  // tissue tiles of the grid

  // How far tiling got.
  uint64_t done = 0;           // candidates processed
  uint64_t tiles = 0;          // tiles stored
  uint64_t corrupt_tiles = 0;  // candidates skipped as corrupt
  uint64_t unannotated = 0;    // candidates left out: no annotation claims them (labels.h)
  std::vector<uint64_t> label_counts;  // tiles stored, by label
  bool complete = false;

  // The file name without its extension: the name of the slide's feature file.
  std::string stem() const;
  // The level-0 origin of grid tile (column, row), as the tile's header records it.
  int64_t tile_x(int64_t column) const { return level0_position(column * tile_size, downsample); }
  int64_t tile_y(int64_t row) const { return level0_position(row * tile_size, downsample); }
  // One more than the largest label with tiles (1 when there are none).
  uint32_t class_count() const;

  nlohmann::json to_json() const;
  // Throws BadInput naming `where` (the store and slide) when a field has the wrong type or an
  // impossible value: a negative size, a tile size of 0, a label that is not a class index,
  // more tiles, corrupt and unannotated candidates than candidates.
  static SlideRecord from_json(const nlohmann::json& entry, const std::string& where);
};

// A slide is known by its content, not its path: the file's size and CRC-32s of its first 4 MiB
// (the header, the first tiles) and its last MiB, so that a file replaced at the same path is not
// mistaken for the one tiled before, and a slide moved elsewhere is. Throws BadInput naming the
// file when it cannot be read.
std::string slide_fingerprint(const std::string& path);

// The record of an opened slide, before it is tiled: the slide's fields and level `level`'s, in
// tile_size squares, with `settings`.
SlideRecord describe_slide(const Slide& slide, const std::string& path, const std::string& fingerprint, int level,
                           int tile_size, nlohmann::json settings);

}  // namespace tessera::data
