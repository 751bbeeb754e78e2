// Tile labels from a label mask (a low-resolution uint8 TIFF whose values are classes) or from
// GeoJSON annotations as QuPath, HistoQC and the Digital Slide Archive write them
// (labels_geojson.cpp: a FeatureCollection, a Feature, a bare array of Features or a bare
// geometry; Polygon, MultiPolygon and GeometryCollection, holes included).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tessera::data {

enum class LabelRule {
  centre,    // the class at the tile's centre
  coverage,  // the class covering the largest fraction of the tile, when it reaches the coverage fraction
};

// How labels are read. A mask's values are its labels; GeoJSON shapes take theirs from their
// class: with `classes`, label i is classes[i] (a shape of another class annotates nothing);
// without, label 1 is `label_class` and label 0 any other named class. Annotations are sparse:
// tissue no shape claims is unannotated, and takes `unannotated`'s label when it is given (the
// rest of the tissue is that class: Camelyon's tumour outlines) or is left out of the store.
struct LabelOptions {
  LabelRule rule = LabelRule::centre;
  double coverage = 0.5;  // the fraction a class needs under LabelRule::coverage
  std::vector<std::string> classes;
  std::string label_class = "Tumor";
  std::string unclassified_as;  // GeoJSON shapes without a class take this one (empty: they annotate nothing)
  std::string unannotated;      // the class of tissue no shape claims (empty: none, left out)

  // The label of the class `name`: its index in `classes`, or without classes 1 for label_class
  // and 0 for any other name; none for an empty name or one --classes does not list.
  std::optional<uint32_t> label_of(const std::string& name) const;
};

// The names of "A,B,C" (--classes), in order; throws UsageError naming --classes for an empty
// name, a name given twice or more classes than a tile's label holds.
std::vector<std::string> parse_class_names(const std::string& text);

// Throws UsageError naming the flag when --unannotated or --unclassified-as names a class that
// --classes does not list, or when the label class is empty.
void check_label_options(const LabelOptions& options);

class TileLabeler {
 public:
  virtual ~TileLabeler() = default;
  // The label of the level-0 rectangle [x0, x1) x [y0, y1); none when no annotation claims it
  // and LabelOptions::unannotated gives it no class (a mask claims every tile). Safe from
  // several threads.
  virtual std::optional<uint32_t> label(double x0, double y0, double x1, double y1) const = 0;
  // Whether the labels themselves mark the rectangle, for the checks that they fit the slide (a
  // mask: a class other than 0; GeoJSON: the label class's shapes, or with classes any shape,
  // claim it, whatever --unannotated says of the rest).
  virtual bool marks(double x0, double y0, double x1, double y1) const = 0;
  // What marks() looks for, for messages: "a class other than 0", "Tumor".
  virtual std::string marked() const = 0;
  // What the file holds, for messages (for GeoJSON: its shapes by class and their extent).
  virtual std::string description() const = 0;
  // Something to tell the user that does not stop the run (shapes beyond the slide, shapes of
  // classes that annotate nothing); empty if none.
  virtual std::string warning() const { return ""; }
};

// Opens `path` as GeoJSON (.geojson or .json) or as a mask TIFF scaled onto a slide of
// slide_width x slide_height. Throws BadInput naming the file (and the feature) when it is not
// valid, when a mask does not fit the slide (its declared downsample, else its shape) or holds a
// value that is not a class, and when the shapes that mark tiles all lie off the slide (naming
// what the file holds and the slide's size).
std::unique_ptr<TileLabeler> open_labels(const std::string& path, int64_t slide_width, int64_t slide_height,
                                         const LabelOptions& options);

// Whether open_labels reads `path` as GeoJSON (by its extension).
bool is_geojson_path(const std::string& path);

// The GeoJSON reader behind open_labels.
std::unique_ptr<TileLabeler> open_geojson_labels(const std::string& path, int64_t slide_width, int64_t slide_height,
                                                 const LabelOptions& options);

}  // namespace tessera::data
