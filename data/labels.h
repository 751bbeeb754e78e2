// Tile labels from a label mask (a low-resolution uint8 TIFF whose values are classes) or from
// QuPath-style GeoJSON annotations (Polygon and MultiPolygon features, holes included).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace tessera::data {

enum class LabelRule {
  centre,    // the class at the tile's centre
  coverage,  // a class covering at least the coverage fraction of the tile, else 0
};

class TileLabeler {
 public:
  virtual ~TileLabeler() = default;
  // The label of the level-0 rectangle [x0, x1) x [y0, y1). Safe from several threads.
  virtual uint32_t label(double x0, double y0, double x1, double y1) const = 0;
  virtual std::string description() const = 0;
};

// Opens `path` as GeoJSON (.geojson or .json: label 1 inside features classified `label_class`,
// 0 elsewhere) or as a mask TIFF scaled onto a slide of slide_width x slide_height. Throws
// BadInput naming the file (and the feature) when it is not valid, when a mask does not fit the
// slide (its declared downsample, else its shape), or holds a value that is not a class.
std::unique_ptr<TileLabeler> open_labels(const std::string& path, int64_t slide_width, int64_t slide_height,
                                         LabelRule rule, double coverage, const std::string& label_class);

}  // namespace tessera::data
