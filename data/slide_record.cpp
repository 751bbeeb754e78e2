#include "data/slide_record.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "common/error.h"

namespace tessera::data {

namespace {

constexpr uint32_t max_classes = 65536;

// A JSON number that is a whole number >= 0 (as parsed, or as built from a signed integer).
std::optional<uint64_t> whole_number(const nlohmann::json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0) return static_cast<uint64_t>(value.get<int64_t>());
  return std::nullopt;
}

// Reads the fields of one entry, each with its default where it is absent (a store tiled before
// the field existed), and names the field and the entry when one has the wrong type.
class EntryFields {
 public:
  EntryFields(const nlohmann::json& entry, const std::string& where) : entry_(entry), where_(where) {
    if (!entry.is_object()) fail("the entry", "is not a JSON object");
  }

  [[noreturn]] void fail(const std::string& field, const std::string& why) const {
    throw BadInput(where_ + ": slide entry: " + field + " " + why);
  }

  const nlohmann::json* find(const char* field) const {
    auto found = entry_.find(field);
    return found == entry_.end() || found->is_null() ? nullptr : &*found;
  }

  std::string text(const char* field, const std::string& fallback = "") const {
    const nlohmann::json* value = find(field);
    if (!value) return fallback;
    if (!value->is_string()) fail(field, "is not a string");
    return value->get<std::string>();
  }

  bool flag(const char* field, bool fallback) const {
    const nlohmann::json* value = find(field);
    if (!value) return fallback;
    if (!value->is_boolean()) fail(field, "is not true or false");
    return value->get<bool>();
  }

  double real(const char* field, double fallback) const {
    const nlohmann::json* value = find(field);
    if (!value) return fallback;
    if (!value->is_number()) fail(field, "is not a number");
    double number = value->get<double>();
    if (!std::isfinite(number) || number < 0) fail(field, "is " + value->dump() + ", not a finite number >= 0");
    return number;
  }

  // A whole number in [0, limit].
  uint64_t count(const char* field, uint64_t fallback, uint64_t limit = UINT64_MAX) const {
    const nlohmann::json* value = find(field);
    if (!value) return fallback;
    std::optional<uint64_t> number = whole_number(*value);
    if (!number || *number > limit)
      fail(field, "is " + value->dump() + ", not a whole number from 0 to " + std::to_string(limit));
    return *number;
  }

  const nlohmann::json& json(const char* field) const {
    static const nlohmann::json none;
    const nlohmann::json* value = find(field);
    return value ? *value : none;
  }

 private:
  const nlohmann::json& entry_;
  const std::string& where_;
};

constexpr uint64_t max_pixels = uint64_t{1} << 31;  // a side of any slide tessera reads
constexpr uint64_t max_channels = 255;              // what a tile header holds

std::vector<uint64_t> read_label_counts(const EntryFields& fields) {
  std::vector<uint64_t> counts;
  const nlohmann::json& found = fields.json("label_counts");
  if (found.is_null()) return counts;
  if (!found.is_object()) fields.fail("label_counts", "is not an object");
  for (auto& [label, count] : found.items()) {
    uint32_t value = 0;
    auto [end, error] = std::from_chars(label.data(), label.data() + label.size(), value);
    if (label.empty() || error != std::errc() || end != label.data() + label.size() || value >= max_classes)
      fields.fail("label_counts", "names '" + label + "', not a class index below " + std::to_string(max_classes));
    std::optional<uint64_t> tiles = whole_number(count);
    if (!tiles) fields.fail("label_counts", "of " + label + " is " + count.dump());
    if (value >= counts.size()) counts.resize(value + size_t{1});
    counts[value] = *tiles;
  }
  return counts;
}

}  // namespace

std::string SlideRecord::stem() const {
  return std::filesystem::path(name.empty() ? path : name).stem().string();
}

uint32_t SlideRecord::class_count() const {
  uint32_t classes = 1;
  for (uint32_t label = 0; label < label_counts.size(); ++label)
    if (label_counts[label]) classes = label + 1;
  return classes;
}

nlohmann::json SlideRecord::to_json() const {
  nlohmann::json counts = nlohmann::json::object();
  for (size_t label = 0; label < label_counts.size(); ++label)
    if (label_counts[label]) counts[std::to_string(label)] = label_counts[label];
  nlohmann::json entry = {{"path", path},
                          {"name", name},
                          {"format", format},
                          {"fingerprint", fingerprint},
                          {"width", width},
                          {"height", height},
                          {"mpp_x", mpp_x},
                          {"mpp_y", mpp_y},
                          {"channels", channels},
                          {"level", level},
                          {"level_width", level_width},
                          {"level_height", level_height},
                          {"downsample", downsample},
                          {"tile_size", tile_size},
                          {"settings", settings},
                          {"candidates", candidates},
                          {"done", done},
                          {"tiles", tiles},
                          {"corrupt_tiles", corrupt_tiles},
                          {"unannotated", unannotated},
                          {"label_counts", counts},
                          {"complete", complete}};
  // Written only where they say something, as stores have always had them.
  if (grid_columns || grid_rows) entry["grid"] = {grid_columns, grid_rows};
  if (!tissue.is_null()) entry["tissue"] = tissue;
  if (tissue_level) entry["tissue_level"] = *tissue_level;
  if (!channel_names.empty()) entry["channel_names"] = channel_names;
  if (!rgb) entry["rgb"] = false;
  if (sample_bits != 8) {
    entry["sample_bits"] = sample_bits;
    nlohmann::json windows = nlohmann::json::array();
    for (const IntensityWindow& window : intensity_windows) windows.push_back({window.low, window.high});
    entry["intensity_windows"] = windows;
  }
  return entry;
}

SlideRecord SlideRecord::from_json(const nlohmann::json& entry, const std::string& where) {
  EntryFields fields(entry, where);
  SlideRecord record;
  record.path = fields.text("path");
  record.name = fields.text("name", std::filesystem::path(record.path).filename().string());
  record.format = fields.text("format");
  record.fingerprint = fields.text("fingerprint");
  record.width = static_cast<int64_t>(fields.count("width", 0, max_pixels));
  record.height = static_cast<int64_t>(fields.count("height", 0, max_pixels));
  record.mpp_x = fields.real("mpp_x", 0);
  record.mpp_y = fields.real("mpp_y", 0);
  record.channels = static_cast<int>(fields.count("channels", 3, max_channels));
  if (record.channels == 0) fields.fail("channels", "is 0");
  // Stores tiled before `rgb` was recorded held colour images exactly when they had 3 channels.
  record.rgb = fields.flag("rgb", record.channels == 3);
  if (record.rgb && record.channels != 3) fields.fail("rgb", "is true for " + std::to_string(record.channels) + " channels");
  if (const nlohmann::json& names = fields.json("channel_names"); !names.is_null()) {
    if (!names.is_array()) fields.fail("channel_names", "is not a list");
    for (const nlohmann::json& name : names) {
      if (!name.is_string()) fields.fail("channel_names", "holds " + name.dump() + ", not a name");
      record.channel_names.push_back(name.get<std::string>());
    }
  }
  record.sample_bits = static_cast<int>(fields.count("sample_bits", 8, 16));
  if (record.sample_bits != 8 && record.sample_bits != 16) fields.fail("sample_bits", "is neither 8 nor 16");
  if (const nlohmann::json& windows = fields.json("intensity_windows"); !windows.is_null()) {
    if (!windows.is_array()) fields.fail("intensity_windows", "is not a list");
    for (const nlohmann::json& window : windows) {
      std::optional<uint64_t> low, high;
      if (window.is_array() && window.size() == 2) low = whole_number(window[0]), high = whole_number(window[1]);
      if (!low || !high || *low >= *high || *high > 65535)
        fields.fail("intensity_windows", "holds " + window.dump() + ", not [low, high] with low < high <= 65535");
      record.intensity_windows.push_back({static_cast<uint32_t>(*low), static_cast<uint32_t>(*high)});
    }
  }
  record.level = static_cast<int>(fields.count("level", 0, 255));
  record.level_width = static_cast<int64_t>(fields.count("level_width", 0, max_pixels));
  record.level_height = static_cast<int64_t>(fields.count("level_height", 0, max_pixels));
  record.downsample = fields.real("downsample", 1);
  if (!(record.downsample >= 1)) fields.fail("downsample", "is below 1");
  record.tile_size = static_cast<int>(fields.count("tile_size", 0, 65535));
  if (record.tile_size == 0) fields.fail("tile_size", "is missing or 0");
  record.settings = fields.json("settings");
  if (const nlohmann::json& grid = fields.json("grid"); !grid.is_null()) {
    std::optional<uint64_t> columns, rows;
    if (grid.is_array() && grid.size() == 2) columns = whole_number(grid[0]), rows = whole_number(grid[1]);
    if (!columns || !rows || *columns > max_pixels || *rows > max_pixels)
      fields.fail("grid", "is " + grid.dump() + ", not [columns, rows]");
    record.grid_columns = static_cast<int64_t>(*columns);
    record.grid_rows = static_cast<int64_t>(*rows);
  }
  record.tissue = fields.json("tissue");
  if (fields.find("tissue_level")) record.tissue_level = static_cast<int>(fields.count("tissue_level", 0, 255));
  record.candidates = fields.count("candidates", 0);
  record.done = fields.count("done", 0);
  record.tiles = fields.count("tiles", 0);
  record.corrupt_tiles = fields.count("corrupt_tiles", 0);
  record.unannotated = fields.count("unannotated", 0);
  record.label_counts = read_label_counts(fields);
  record.complete = fields.flag("complete", false);
  uint64_t counted = 0;
  for (uint64_t count : record.label_counts) counted += count;
  if (!record.label_counts.empty() && counted != record.tiles)
    fields.fail("label_counts", "add up to " + std::to_string(counted) + ", not its " + std::to_string(record.tiles) +
                                    " tiles");
  // By subtraction, so that no sum wraps around.
  if (fields.find("candidates") &&
      (record.tiles > record.candidates || record.corrupt_tiles > record.candidates - record.tiles ||
       record.unannotated > record.candidates - record.tiles - record.corrupt_tiles))
    fields.fail("tiles", std::to_string(record.tiles) + ", corrupt_tiles " + std::to_string(record.corrupt_tiles) +
                             " and unannotated " + std::to_string(record.unannotated) + " are more than its " +
                             std::to_string(record.candidates) + " candidates");
  if (fields.find("candidates") && record.done > record.candidates)
    fields.fail("done", "is " + std::to_string(record.done) + ", more than its " + std::to_string(record.candidates) +
                            " candidates");
  return record;
}

std::string slide_fingerprint(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_regular_file(path, error))
    return "path:" + fs::absolute(path).lexically_normal().string();  // a DICOM series' directory, say
  uint64_t size = fs::file_size(path, error);
  std::ifstream file(path, std::ios::binary);
  if (error || !file) throw BadInput(path + ": cannot read the slide");
  auto crc_of = [&](uint64_t offset, uint64_t length) {
    std::vector<char> bytes(static_cast<size_t>(std::min(length, size - std::min(offset, size))));
    file.seekg(static_cast<std::streamoff>(offset));
    if (!file.read(bytes.data(), static_cast<std::streamsize>(bytes.size())))
      throw BadInput(path + ": cannot read the slide");
    std::array<char, 9> hex{};
    std::snprintf(hex.data(), hex.size(), "%08lx",
                  crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
    return std::string(hex.data());
  };
  constexpr uint64_t head = uint64_t{4} << 20, tail = uint64_t{1} << 20;
  return "size:" + std::to_string(size) + " crc32:" + crc_of(0, head) + ":" +
         crc_of(size > tail ? size - tail : 0, tail);
}

SlideRecord describe_slide(const Slide& slide, const std::string& path, const std::string& fingerprint, int level,
                           int tile_size, nlohmann::json settings) {
  const SlideLevel& base = slide.levels()[0];
  const SlideLevel& tiled = slide.levels()[static_cast<size_t>(level)];
  SlideRecord record;
  record.path = path;
  record.name = std::filesystem::path(path).filename().string();
  record.format = slide.format();
  record.fingerprint = fingerprint;
  record.width = base.width;
  record.height = base.height;
  record.mpp_x = slide.mpp_x();
  record.mpp_y = slide.mpp_y();
  record.channels = slide.channels();
  record.rgb = slide.rgb();
  record.channel_names = slide.channel_names();
  record.sample_bits = slide.sample_bits();
  if (record.sample_bits != 8) record.intensity_windows = slide.intensity_windows();
  record.level = level;
  record.level_width = tiled.width;
  record.level_height = tiled.height;
  record.downsample = tiled.downsample;
  record.tile_size = tile_size;
  record.settings = std::move(settings);
  return record;
}

}  // namespace tessera::data
