// GeoJSON annotations as QuPath (0.2's bare array of Features, 0.3+'s Feature or
// FeatureCollection), HistoQC and the Digital Slide Archive write them.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/json_input.h"
#include "data/labels.h"

namespace tessera::data {

namespace {

// Samples per side of the grid that estimates a tile's coverage by polygons.
constexpr int coverage_samples = 8;
// An annotation file: QuPath's export of a whole slide's cells is tens of MB; 1 GiB bounds what
// is read whole before it is parsed.
constexpr uint64_t kMaxAnnotationBytes = 1ull << 30;

struct Point {
  double x, y;
};

struct Box {
  double x0 = std::numeric_limits<double>::max(), y0 = std::numeric_limits<double>::max();
  double x1 = std::numeric_limits<double>::lowest(), y1 = std::numeric_limits<double>::lowest();
  void add(const Box& other) {
    x0 = std::min(x0, other.x0);
    y0 = std::min(y0, other.y0);
    x1 = std::max(x1, other.x1);
    y1 = std::max(y1, other.y1);
  }
  std::string text() const {
    return "x " + std::to_string(std::lround(x0)) + " to " + std::to_string(std::lround(x1)) + ", y " +
           std::to_string(std::lround(y0)) + " to " + std::to_string(std::lround(y1));
  }
};

// One GeoJSON polygon: an exterior ring and its holes, tested with the even-odd rule.
class Polygon {
 public:
  explicit Polygon(std::vector<std::vector<Point>> rings) : rings_(std::move(rings)) {
    for (const Point& p : rings_.front()) box_.add({p.x, p.y, p.x, p.y});
  }

  const Box& box() const { return box_; }
  size_t holes() const { return rings_.size() - 1; }

  // The exterior's area less its holes' (shoelace formula), for "the smallest shape" at a point.
  double area() const {
    double total = std::abs(ring_area(rings_.front()));
    for (size_t hole = 1; hole < rings_.size(); ++hole) total -= std::abs(ring_area(rings_[hole]));
    return std::max(0.0, total);
  }

  bool overlaps_box(double x0, double y0, double x1, double y1) const {
    return x0 <= box_.x1 && x1 >= box_.x0 && y0 <= box_.y1 && y1 >= box_.y0;
  }

  bool contains(double x, double y) const {
    if (x < box_.x0 || x > box_.x1 || y < box_.y0 || y > box_.y1) return false;
    bool inside = false;
    for (const auto& ring : rings_)
      for (size_t i = 0, j = ring.size() - 1; i < ring.size(); j = i++)
        if ((ring[i].y > y) != (ring[j].y > y) &&
            x < (ring[j].x - ring[i].x) * (y - ring[i].y) / (ring[j].y - ring[i].y) + ring[i].x)
          inside = !inside;
    return inside;
  }

 private:
  static double ring_area(const std::vector<Point>& ring) {
    double twice = 0;
    for (size_t i = 0, j = ring.size() - 1; i < ring.size(); j = i++) twice += ring[j].x * ring[i].y - ring[i].x * ring[j].y;
    return twice / 2;
  }

  std::vector<std::vector<Point>> rings_;
  Box box_;
};

// A polygon that annotates: its class's label.
struct Shape {
  Polygon polygon;
  uint32_t label = 0;
  double area = 0;
};

// What a file holds, for messages: shapes by class (empty: unclassified) and what is not an area.
struct Found {
  size_t features = 0, not_areas = 0, without_geometry = 0;
  std::map<std::string, size_t> polygons, holes;
  Box extent;  // of every polygon
};

// A feature's class: QuPath's classification (an object with a name, or a plain name), else the
// Digital Slide Archive's group or label; empty when it has none.
std::string class_of(const nlohmann::json& properties) {
  if (!properties.is_object()) return "";
  auto text = [](const nlohmann::json& value) { return value.is_string() ? value.get<std::string>() : std::string(); };
  if (auto found = properties.find("classification"); found != properties.end())
    return found->is_object() ? text(found->value("name", nlohmann::json())) : text(*found);
  if (auto group = text(properties.value("group", nlohmann::json())); !group.empty()) return group;
  if (auto label = properties.find("label"); label != properties.end())
    return label->is_object() ? text(label->value("value", nlohmann::json())) : text(*label);
  return "";
}

class GeoJsonLabeler final : public TileLabeler {
 public:
  GeoJsonLabeler(const std::string& path, int64_t slide_width, int64_t slide_height, const LabelOptions& options)
      : path_(path), options_(options), slide_width_(slide_width), slide_height_(slide_height),
        class_count_(options.classes.empty() ? 2 : options.classes.size()) {
    if (!options.unannotated.empty()) unannotated_label_ = options.label_of(options.unannotated);
    read_document(read_json_file(path, path, kMaxAnnotationBytes));
    // The smallest shape first: a tumour island drawn inside a stroma region is tumour. Equal
    // areas go to the lower label, then to the file's order.
    std::stable_sort(shapes_.begin(), shapes_.end(), [](const Shape& a, const Shape& b) {
      return std::tie(a.area, a.label) < std::tie(b.area, b.label);
    });
    if (marking_box() && !overlaps_slide())
      throw BadInput(description() + ": none of them lies on the slide (the annotations of another slide?)");
  }

  std::optional<uint32_t> label(double x0, double y0, double x1, double y1) const override {
    if (auto claimed = claim(x0, y0, x1, y1, true)) return claimed;
    return unannotated_label_;
  }

  bool marks(double x0, double y0, double x1, double y1) const override {
    auto claimed = claim(x0, y0, x1, y1, false);
    return options_.classes.empty() ? claimed == 1u : claimed.has_value();
  }

  std::string marked() const override {
    return options_.classes.empty() ? options_.label_class : "any of " + class_names(", ", " or ");
  }

  // "PATH: 2 features: 8 polygons (3 Tumor, 5 Invborder), 1 hole; label 1 is Tumor: 3 polygons
  // spanning x ... to ..., y ... to ... of the slide's WxH", or what there is and why none is.
  std::string description() const override {
    size_t polygons = 0, holes = 0;
    std::string classes;
    for (auto& [name, count] : found_.polygons) {
      polygons += count;
      holes += found_.holes.at(name);
      classes += (classes.empty() ? "" : ", ") + std::to_string(count) + " " + (name.empty() ? "unclassified" : name);
    }
    std::string text = path_ + ": " + plural(found_.features, "feature") + ": " + plural(polygons, "polygon") +
                       (classes.empty() ? "" : " (" + classes + ")");
    auto box = marking_box();
    if (polygons && !box) text += " spanning " + found_.extent.text() + " (the slide is " + slide_size() + ")";
    if (holes) text += ", " + plural(holes, "hole");
    if (found_.not_areas) text += ", " + plural(found_.not_areas, "point or line") + " (not areas, unused)";
    if (found_.without_geometry) text += ", " + plural(found_.without_geometry, "feature") + " without geometry";
    if (box) {
      std::string which = options_.classes.empty()
                              ? "label 1 is " + options_.label_class
                              : "labels 0 to " + std::to_string(class_count_ - 1) + " are " + class_names(", ", ", ");
      return text + "; " + which + ": " + plural(marking_count(), "polygon") + " spanning " + box->text() +
             " of the slide's " + slide_size();
    }
    text += "; none is " + (options_.classes.empty() ? options_.label_class : class_names(", ", " or "));
    std::string others;  // the classes the file holds that mark nothing
    for (auto& [name, count] : found_.polygons)
      if (!name.empty() && (options_.classes.empty() ? name != options_.label_class : !options_.label_of(name)))
        others += (others.empty() ? "" : " or ") + name;
    if (!others.empty()) text += options_.classes.empty() ? " (--label-class " + others + "?)" : " (--classes with " + others + "?)";
    if (found_.polygons.count("") && options_.unclassified_as.empty())
      text += "; unclassified shapes take a class with --unclassified-as " +
              (options_.classes.empty() ? options_.label_class : options_.classes.front());
    return text;
  }

  // Shapes that mark tiles reaching past the slide, and shapes that annotate nothing (a class
  // --classes does not list, or none without --unclassified-as), each named.
  std::string warning() const override {
    std::string text;
    auto add = [&](const std::string& line) { text += (text.empty() ? "" : "; ") + path_ + ": " + line; };
    double slack_x = 0.01 * static_cast<double>(slide_width_), slack_y = 0.01 * static_cast<double>(slide_height_);
    if (auto box = marking_box(); box && (box->x0 < -slack_x || box->y0 < -slack_y ||
                                          box->x1 > static_cast<double>(slide_width_) + slack_x ||
                                          box->y1 > static_cast<double>(slide_height_) + slack_y))
      add("the " + (options_.classes.empty() ? options_.label_class : class_names(", ", " and ")) + " shapes span " +
          box->text() + ", beyond the slide (" + slide_size() + "); tiles are labelled where they overlap it");
    if (!ignored_.empty()) {
      size_t count = 0;
      std::string classes;
      for (auto& [name, polygons] : ignored_) {
        count += polygons;
        classes += (classes.empty() ? "" : ", ") + std::to_string(polygons) + " " + (name.empty() ? "unclassified" : name);
      }
      add(plural(count, "polygon") + " (" + classes + (count == 1 ? ") annotates" : ") annotate") + " nothing: " +
          (options_.classes.empty() ? "--unclassified-as CLASS gives unclassified shapes a class"
                                    : "their classes are not among --classes " + class_names(",", ",")));
    }
    return text;
  }

 private:
  static std::string plural(size_t count, const std::string& noun) {
    return std::to_string(count) + " " + noun + (count == 1 ? "" : "s");
  }

  std::string slide_size() const { return std::to_string(slide_width_) + "x" + std::to_string(slide_height_); }

  std::string class_names(const std::string& separator, const std::string& last) const {
    std::string text;
    for (size_t i = 0; i < options_.classes.size(); ++i)
      text += (i == 0 ? "" : i + 1 == options_.classes.size() ? last : separator) + options_.classes[i];
    return text;
  }

  // The shapes whose tiles the checks count (marks()): the label class's, or with classes all.
  bool marking(const Shape& shape) const { return !options_.classes.empty() || shape.label == 1; }

  size_t marking_count() const {
    return static_cast<size_t>(std::count_if(shapes_.begin(), shapes_.end(), [&](auto& s) { return marking(s); }));
  }

  // The extent of the marking shapes; none when there are none.
  std::optional<Box> marking_box() const {
    std::optional<Box> box;
    for (auto& shape : shapes_)
      if (marking(shape)) {
        if (!box) box = Box();
        box->add(shape.polygon.box());
      }
    return box;
  }

  bool overlaps_slide() const {
    return std::any_of(shapes_.begin(), shapes_.end(), [&](const Shape& shape) {
      return marking(shape) && shape.polygon.overlaps_box(0, 0, static_cast<double>(slide_width_),
                                                          static_cast<double>(slide_height_));
    });
  }

  // The label the shapes give the rectangle: the centre rule's smallest shape at its centre, or
  // the coverage rule's class covering the largest fraction (each sample point counting for the
  // smallest shape holding it, the uncovered ones for --unannotated's class when `credit`), if it
  // reaches the coverage fraction, ties to the lower label. None when no class claims it.
  std::optional<uint32_t> claim(double x0, double y0, double x1, double y1, bool credit) const {
    if (options_.rule == LabelRule::centre) {
      double x = (x0 + x1) / 2, y = (y0 + y1) / 2;
      for (auto& shape : shapes_)
        if (shape.polygon.contains(x, y)) return shape.label;
      return std::nullopt;
    }
    std::vector<const Shape*> nearby;  // still smallest first
    for (auto& shape : shapes_)
      if (shape.polygon.overlaps_box(x0, y0, x1, y1)) nearby.push_back(&shape);
    std::vector<int> counts(class_count_, 0);
    int uncovered = 0;
    for (int sy = 0; sy < coverage_samples; ++sy)
      for (int sx = 0; sx < coverage_samples; ++sx) {
        double x = x0 + (x1 - x0) * (sx + 0.5) / coverage_samples, y = y0 + (y1 - y0) * (sy + 0.5) / coverage_samples;
        auto holding = std::find_if(nearby.begin(), nearby.end(), [&](auto* shape) { return shape->polygon.contains(x, y); });
        if (holding == nearby.end())
          ++uncovered;
        else
          ++counts[(*holding)->label];
      }
    if (credit && unannotated_label_) counts[*unannotated_label_] += uncovered;
    auto most = std::max_element(counts.begin(), counts.end());  // the first of the largest: the lower label
    if (*most > 0 && *most >= options_.coverage * coverage_samples * coverage_samples)
      return static_cast<uint32_t>(most - counts.begin());
    return std::nullopt;
  }

  [[noreturn]] void invalid(size_t feature, const std::string& what) const {
    throw BadInput(path_ + ": feature " + std::to_string(feature) + ": " + what);
  }

  // A FeatureCollection, a Feature, a bare array of Features (QuPath 0.2) or a bare geometry.
  void read_document(const nlohmann::json& document) {
    if (document.is_array()) {
      for (size_t i = 0; i < document.size(); ++i) read_feature(document[i], i);
      return;
    }
    if (!document.is_object() || !document.contains("type") || !document["type"].is_string())
      throw BadInput(path_ + ": not GeoJSON (expected a FeatureCollection, a Feature, an array of Features or a "
                             "geometry)");
    std::string type = document["type"].get<std::string>();
    if (type == "FeatureCollection") {
      if (!document.contains("features") || !document["features"].is_array())
        throw BadInput(path_ + ": a FeatureCollection without a `features` array");
      for (size_t i = 0; i < document["features"].size(); ++i) read_feature(document["features"][i], i);
    } else {
      read_feature(document, 0);
    }
  }

  void read_feature(const nlohmann::json& feature, size_t index) {
    if (!feature.is_object()) invalid(index, "not a Feature");
    ++found_.features;
    std::string type = feature.value("type", "");
    if (type != "Feature") {  // a bare geometry: unclassified
      read_geometry(feature, "", index);
      return;
    }
    auto geometry = feature.find("geometry");
    if (geometry == feature.end() || geometry->is_null()) {
      ++found_.without_geometry;
      return;
    }
    read_geometry(*geometry, class_of(feature.value("properties", nlohmann::json())), index);
  }

  void read_geometry(const nlohmann::json& geometry, const std::string& name, size_t index) {
    if (!geometry.is_object()) invalid(index, "its geometry is not an object");
    std::string type = geometry.value("type", "");
    if (type == "GeometryCollection") {
      if (!geometry.contains("geometries") || !geometry["geometries"].is_array())
        invalid(index, "a GeometryCollection without `geometries`");
      for (auto& part : geometry["geometries"]) read_geometry(part, name, index);
      return;
    }
    if (type == "Point" || type == "MultiPoint" || type == "LineString" || type == "MultiLineString") {
      ++found_.not_areas;
      return;
    }
    if (type != "Polygon" && type != "MultiPolygon")
      invalid(index, "geometry type '" + type + "' (expected Polygon, MultiPolygon or GeometryCollection)");
    if (!geometry.contains("coordinates") || !geometry["coordinates"].is_array())
      invalid(index, type + " without coordinates");
    const auto& coordinates = geometry["coordinates"];
    if (type == "Polygon") {
      add_polygon(coordinates, name, index);
    } else {
      for (auto& polygon : coordinates) add_polygon(polygon, name, index);
    }
  }

  std::vector<Point> parse_ring(const nlohmann::json& ring, size_t feature) const {
    if (!ring.is_array() || ring.size() < 4) invalid(feature, "a ring needs at least 4 positions");
    std::vector<Point> points;
    for (auto& position : ring) {
      if (!position.is_array() || position.size() < 2 || !position[0].is_number() || !position[1].is_number())
        invalid(feature, "a position is not [x, y]");
      points.push_back({position[0].get<double>(), position[1].get<double>()});
      if (!std::isfinite(points.back().x) || !std::isfinite(points.back().y))
        invalid(feature, "a position is not finite");
    }
    return points;
  }

  void add_polygon(const nlohmann::json& coordinates, const std::string& name, size_t feature) {
    if (!coordinates.is_array() || coordinates.empty()) invalid(feature, "a Polygon without rings");
    std::vector<std::vector<Point>> rings;
    for (auto& ring : coordinates) rings.push_back(parse_ring(ring, feature));
    Polygon polygon(std::move(rings));
    ++found_.polygons[name];
    found_.holes[name] += polygon.holes();
    found_.extent.add(polygon.box());
    std::string effective = name.empty() ? options_.unclassified_as : name;
    if (auto label = options_.label_of(effective)) {
      double area = polygon.area();
      shapes_.push_back({std::move(polygon), *label, area});
    } else {
      ++ignored_[name];
    }
  }

  std::string path_;
  LabelOptions options_;
  int64_t slide_width_, slide_height_;
  size_t class_count_;
  std::optional<uint32_t> unannotated_label_;
  Found found_;
  std::vector<Shape> shapes_;               // those that annotate, smallest first
  std::map<std::string, size_t> ignored_;  // polygons that annotate nothing, by class (empty: unclassified)
};

}  // namespace

std::unique_ptr<TileLabeler> open_geojson_labels(const std::string& path, int64_t slide_width, int64_t slide_height,
                                                 const LabelOptions& options) {
  return std::make_unique<GeoJsonLabeler>(path, slide_width, slide_height, options);
}

}  // namespace tessera::data
