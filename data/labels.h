// Tile labels from a label mask (a low-resolution uint8 TIFF whose values are classes) or from
// GeoJSON annotations as QuPath, HistoQC and the Digital Slide Archive write them
// (labels_geojson.cpp: a FeatureCollection, a Feature, a bare array of Features or a bare
// geometry; Polygon, MultiPolygon and GeometryCollection, holes included).
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
  // What the file holds, for messages (for GeoJSON: its shapes by class and their extent).
  virtual std::string description() const = 0;
  // Something to tell the user that does not stop the run (shapes beyond the slide); empty if none.
  virtual std::string warning() const { return ""; }
};

// Opens `path` as GeoJSON (.geojson or .json: label 1 inside shapes classified `label_class`,
// 0 elsewhere; shapes without a class count as `unclassified_as` when it is given) or as a mask
// TIFF scaled onto a slide of slide_width x slide_height. Throws BadInput naming the file (and
// the feature) when it is not valid, when a mask does not fit the slide (its declared
// downsample, else its shape) or holds a value that is not a class, and when the label class's
// shapes all lie off the slide (naming what the file holds and the slide's size).
std::unique_ptr<TileLabeler> open_labels(const std::string& path, int64_t slide_width, int64_t slide_height,
                                         LabelRule rule, double coverage, const std::string& label_class,
                                         const std::string& unclassified_as = "");

// The GeoJSON reader behind open_labels.
std::unique_ptr<TileLabeler> open_geojson_labels(const std::string& path, int64_t slide_width, int64_t slide_height,
                                                 LabelRule rule, double coverage, const std::string& label_class,
                                                 const std::string& unclassified_as);

}  // namespace tessera::data
