#include "data/labels.h"

#include <tiffio.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/units.h"
#include "common/json_input.h"
#include "data/library_messages.h"

namespace tessera::data {

namespace {

class MaskLabeler final : public TileLabeler {
 public:
  MaskLabeler(const std::string& path, int64_t slide_width, int64_t slide_height, LabelRule rule, double coverage)
      : path_(path), rule_(rule), coverage_(coverage) {
    TIFF* tiff = open_tiff(path, "r");
    if (!tiff) throw BadInput(path + ": not a readable label mask TIFF (" + last_tiff_error() + ")");
    try {
      read(tiff);
    } catch (...) {
      TIFFClose(tiff);
      throw;
    }
    TIFFClose(tiff);
    scale_x_ = static_cast<double>(slide_width) / width_;
    scale_y_ = static_cast<double>(slide_height) / height_;
    check_extent(slide_width, slide_height);
    check_values();
  }

  // A mask is exhaustive: every tile has a class.
  std::optional<uint32_t> label(double x0, double y0, double x1, double y1) const override {
    return class_of(x0, y0, x1, y1);
  }

  bool marks(double x0, double y0, double x1, double y1) const override { return class_of(x0, y0, x1, y1) != 0; }

  std::string marked() const override { return "a class other than 0"; }

  std::string description() const override {
    return path_ + ": mask " + std::to_string(width_) + "x" + std::to_string(height_);
  }

 private:
  uint32_t class_of(double x0, double y0, double x1, double y1) const {
    auto at = [&](double x, double y) {
      int column = std::clamp(static_cast<int>(x / scale_x_), 0, width_ - 1);
      int row = std::clamp(static_cast<int>(y / scale_y_), 0, height_ - 1);
      return values_[static_cast<size_t>(row) * width_ + column];
    };
    if (rule_ == LabelRule::centre) return at((x0 + x1) / 2, (y0 + y1) / 2);
    std::array<uint64_t, 256> counts{};
    uint64_t total = 0;
    int columns = std::max(1, static_cast<int>(std::ceil((x1 - x0) / scale_x_)));
    int rows = std::max(1, static_cast<int>(std::ceil((y1 - y0) / scale_y_)));
    for (int row = 0; row < rows; ++row)
      for (int column = 0; column < columns; ++column, ++total)
        ++counts[at(x0 + (x1 - x0) * (column + 0.5) / columns, y0 + (y1 - y0) * (row + 0.5) / rows)];
    auto most = std::max_element(counts.begin() + 1, counts.end());
    return *most >= coverage_ * static_cast<double>(total) ? static_cast<uint32_t>(most - counts.begin()) : 0;
  }

  // The mask must cover the slide: at its declared downsample exactly (to a pixel), else with the
  // slide's shape (a mask of another slide, given in the wrong order, fails here).
  void check_extent(int64_t slide_width, int64_t slide_height) const {
    std::string sizes = "the mask is " + std::to_string(width_) + "x" + std::to_string(height_) + ", the slide " +
                        std::to_string(slide_width) + "x" + std::to_string(slide_height);
    if (downsample_ > 0) {
      auto covers = [&](int mask, int64_t slide) {
        return std::abs(static_cast<double>(mask) - static_cast<double>(slide) / downsample_) <= 1;
      };
      if (!covers(width_, slide_width) || !covers(height_, slide_height))
        throw BadInput(path_ + ": does not fit the slide: " + sizes + " and the mask says downsample " +
                       format_number(downsample_) + " (the mask of another slide?)");
    } else if (std::abs(scale_x_ - scale_y_) > 0.02 * std::max(scale_x_, scale_y_)) {
      throw BadInput(path_ + ": does not fit the slide: " + sizes + ", another shape (the mask of another slide?)");
    }
  }

  // Values are classes: those the mask declares, else 0, 1, 2, ... without gaps (255 or 7 in a
  // 0/1 mask is not a class).
  void check_values() const {
    std::array<uint64_t, 256> counts{};
    for (uint8_t value : values_) ++counts[value];
    for (int value = 0; value < 256; ++value) {
      if (!counts[static_cast<size_t>(value)]) continue;
      bool known = declared_.empty() ? (value == 0 || counts[static_cast<size_t>(value - 1)] > 0)
                                     : std::count(declared_.begin(), declared_.end(), value) > 0;
      if (!known)
        throw BadInput(path_ + ": value " + std::to_string(value) + " (" + std::to_string(counts[static_cast<size_t>(value)]) +
                       " pixels) is not a class: " +
                       (declared_.empty() ? std::string("class numbers run 0, 1, 2, ... without gaps")
                                          : "the mask declares classes " + declared_text()));
    }
  }

  std::string declared_text() const {
    std::string text;
    for (int value : declared_) text += (text.empty() ? "" : ", ") + std::to_string(value);
    return text;
  }

  // tessera synth's masks say {"downsample": N, "values": {"0": "other", "1": "Tumor"}} in their
  // ImageDescription; other masks may say nothing.
  void read_declaration(TIFF* tiff) {
    char* text = nullptr;
    if (!TIFFGetField(tiff, TIFFTAG_IMAGEDESCRIPTION, &text) || !text) return;
    auto parsed = try_parse_json_input(text);  // a description that is not JSON declares nothing
    if (!parsed || !parsed->is_object()) return;
    const nlohmann::json& description = *parsed;
    if (description.contains("downsample") && description["downsample"].is_number()) {
      downsample_ = description["downsample"].get<double>();
      // 0 or -1 read as "not declared" before, so the mask's shape alone decided whether it fit.
      if (!(downsample_ > 0))
        throw BadInput(path_ + ": its description's downsample is " + description["downsample"].dump() +
                       ", not a positive number of slide pixels a mask pixel");
    }
    if (description.contains("values") && description["values"].is_object())
      for (auto& [key, name] : description["values"].items()) {
        char* end = nullptr;
        long value = std::strtol(key.c_str(), &end, 10);
        if (*end || value < 0 || value > 255) throw BadInput(path_ + ": declares a class '" + key + "' that is not 0-255");
        declared_.push_back(static_cast<int>(value));
      }
  }

  void read(TIFF* tiff) {
    read_declaration(tiff);
    uint32_t width = 0, height = 0;
    uint16_t samples = 1, bits = 8;
    TIFFGetField(tiff, TIFFTAG_IMAGEWIDTH, &width);
    TIFFGetField(tiff, TIFFTAG_IMAGELENGTH, &height);
    TIFFGetFieldDefaulted(tiff, TIFFTAG_SAMPLESPERPIXEL, &samples);
    TIFFGetFieldDefaulted(tiff, TIFFTAG_BITSPERSAMPLE, &bits);
    if (samples != 1 || bits != 8 || width == 0 || height == 0)
      throw BadInput(path_ + ": a label mask must be one 8-bit channel, found " + std::to_string(samples) +
                     " channels of " + std::to_string(bits) + " bits");
    if (uint64_t{width} * height > (uint64_t{1} << 28))
      throw BadInput(path_ + ": a label mask of " + std::to_string(width) + "x" + std::to_string(height) +
                     " is not low-resolution");
    width_ = static_cast<int>(width);
    height_ = static_cast<int>(height);
    values_.resize(uint64_t{width} * height);
    if (TIFFIsTiled(tiff)) {
      uint32_t tile_width = 0, tile_height = 0;
      TIFFGetField(tiff, TIFFTAG_TILEWIDTH, &tile_width);
      TIFFGetField(tiff, TIFFTAG_TILELENGTH, &tile_height);
      std::vector<uint8_t> tile(static_cast<size_t>(TIFFTileSize(tiff)));
      for (uint32_t y = 0; y < height; y += tile_height)
        for (uint32_t x = 0; x < width; x += tile_width) {
          if (TIFFReadTile(tiff, tile.data(), x, y, 0, 0) < 0)
            throw BadInput(path_ + ": cannot read the mask tile at " + std::to_string(x) + "," + std::to_string(y));
          for (uint32_t row = 0; row < tile_height && y + row < height; ++row)
            std::copy_n(&tile[static_cast<size_t>(row) * tile_width], std::min(tile_width, width - x),
                        &values_[static_cast<size_t>(y + row) * width + x]);
        }
      return;
    }
    for (uint32_t row = 0; row < height; ++row)
      if (TIFFReadScanline(tiff, &values_[static_cast<size_t>(row) * width], row, 0) < 0)
        throw BadInput(path_ + ": cannot read mask row " + std::to_string(row));
  }

  std::string path_;
  LabelRule rule_;
  double coverage_;
  int width_ = 0, height_ = 0;
  double scale_x_ = 1, scale_y_ = 1;
  double downsample_ = 0;       // declared; 0 when not
  std::vector<int> declared_;   // declared classes; empty when not
  std::vector<uint8_t> values_;
};

// The classes a tile header's label and a store's label_counts hold.
constexpr size_t max_classes = 65536;

std::string listed(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ",") + name;
  return text;
}

}  // namespace

std::optional<uint32_t> LabelOptions::label_of(const std::string& name) const {
  if (name.empty()) return std::nullopt;
  if (classes.empty()) return name == label_class ? 1u : 0u;
  auto found = std::find(classes.begin(), classes.end(), name);
  if (found == classes.end()) return std::nullopt;
  return static_cast<uint32_t>(found - classes.begin());
}

std::vector<std::string> parse_class_names(const std::string& text) {
  std::vector<std::string> names;
  for (size_t start = 0;;) {
    size_t comma = text.find(',', start);
    std::string name = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (name.empty())
      throw UsageError("--classes: class names separated by commas (label 0 first), not '" + text +
                       "': an empty name");
    if (std::find(names.begin(), names.end(), name) != names.end())
      throw UsageError("--classes: '" + name + "' is named twice in '" + text + "'");
    names.push_back(std::move(name));
    if (names.size() > max_classes)
      throw UsageError("--classes: more than " + std::to_string(max_classes) + " classes");
    if (comma == std::string::npos) return names;
    start = comma + 1;
  }
}

void check_label_options(const LabelOptions& options) {
  if (options.classes.empty()) {
    if (options.label_class.empty()) throw UsageError("--label-class: a class name, not empty");
    return;
  }
  for (auto [flag, name] : {std::pair{"--unannotated", &options.unannotated},
                            std::pair{"--unclassified-as", &options.unclassified_as}})
    if (!name->empty() && !options.label_of(*name))
      throw UsageError(std::string(flag) + ": '" + *name + "' is not one of --classes " + listed(options.classes));
}

bool is_geojson_path(const std::string& path) {
  auto extension = std::filesystem::path(path).extension().string();
  return extension == ".geojson" || extension == ".json";
}

std::unique_ptr<TileLabeler> open_labels(const std::string& path, int64_t slide_width, int64_t slide_height,
                                         const LabelOptions& options) {
  if (!std::filesystem::is_regular_file(path)) throw BadInput(path + ": no such label file");
  if (is_geojson_path(path)) return open_geojson_labels(path, slide_width, slide_height, options);
  return std::make_unique<MaskLabeler>(path, slide_width, slide_height, options.rule, options.coverage);
}

}  // namespace tessera::data
