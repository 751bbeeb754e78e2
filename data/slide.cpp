#include "data/slide.h"

#include <fcntl.h>
#include <openslide/openslide.h>
#include <tiffio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <list>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "common/error.h"
#include "common/files.h"
#include "common/library_warnings.h"
#include "common/utf8.h"
#include "data/jpeg.h"
#include "data/library_messages.h"
#include "data/slide_parts.h"

namespace tessera::data {

namespace {

bool has_tiff_signature(const std::string& path) {
  std::array<char, 4> head{};
  std::ifstream file(path, std::ios::binary);
  if (!file.read(head.data(), head.size())) return false;
  bool little = head[0] == 'I' && head[1] == 'I' && (head[2] == 42 || head[2] == 43) && head[3] == 0;
  bool big = head[0] == 'M' && head[1] == 'M' && head[2] == 0 && (head[3] == 42 || head[3] == 43);
  return little || big;
}

class TiffSlide final : public Slide {
  struct Level {
    SlideLevel shape;
    tdir_t directory = 0;
    int64_t columns = 0, rows = 0;
    bool ycbcr_jpeg = false;  // tiles decode with libturbojpeg; others go through TIFFReadRGBATile
    std::vector<uint8_t> jpeg_tables;
    std::vector<uint64_t> offsets, byte_counts;
  };

 public:
  TiffSlide(const std::string& path, uint64_t cache_bytes) : path_(path), cache_(cache_bytes) {
    tiff_ = open_tiff(path, "r");
    if (!tiff_) throw BadInput(path + ": not a readable TIFF (" + last_tiff_error() + ")");
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    tdir_t directory = 0;
    do {
      if (!TIFFIsTiled(tiff_)) {
        if (directory == 0)
          throw BadInput(path + ": not a tiled TIFF (it is stored in strips; the automatic reader opens it with libvips)");
        continue;
      }
      Level level = read_level(directory);
      if (!levels_.empty() && level.shape.width >= levels_.front().shape.width) continue;
      levels_.push_back(std::move(level));
    } while (TIFFReadDirectory(tiff_) && ++directory);
    std::sort(levels_.begin(), levels_.end(), [](auto& a, auto& b) { return a.shape.width > b.shape.width; });
    for (auto& level : levels_) {
      level.shape.downsample = 0.5 * (static_cast<double>(levels_[0].shape.width) / level.shape.width +
                                      static_cast<double>(levels_[0].shape.height) / level.shape.height);
      shapes_.push_back(level.shape);
    }
    check_levels_nest(path, shapes_);
    TIFFSetDirectory(tiff_, levels_[0].directory);
    current_directory_ = levels_[0].directory;
    read_resolution();
  }

  ~TiffSlide() override {
    if (fd_ >= 0) ::close(fd_);
    if (tiff_) TIFFClose(tiff_);
  }

  const std::string& path() const override { return path_; }
  std::string format() const override { return "tiff"; }
  const std::vector<SlideLevel>& levels() const override { return shapes_; }
  double mpp_x() const override { return mpp_x_; }
  double mpp_y() const override { return mpp_y_; }

  void read_region(int level_index, int64_t x, int64_t y, int width, int height, uint8_t* rgb) const override {
    const Level& level = levels_.at(static_cast<size_t>(level_index));
    // A region within the level is covered by its tiles: white goes only where a tile is missing.
    // One reaching past the level's edge is whitened whole first.
    const bool within = x >= 0 && y >= 0 && x + width <= level.shape.width && y + height <= level.shape.height;
    if (!within) std::memset(rgb, 255, static_cast<size_t>(width) * static_cast<size_t>(height) * 3);
    int tile_width = level.shape.tile_width, tile_height = level.shape.tile_height;
    int64_t first_column = std::max<int64_t>(0, x / tile_width);
    int64_t last_column = std::min<int64_t>(level.columns - 1, (x + width - 1) / tile_width);
    int64_t first_row = std::max<int64_t>(0, y / tile_height);
    int64_t last_row = std::min<int64_t>(level.rows - 1, (y + height - 1) / tile_height);
    for (int64_t row = first_row; row <= last_row; ++row)
      for (int64_t column = first_column; column <= last_column; ++column) {
        auto pixels = decoded_tile(level_index, column, row);
        if (pixels)
          copy_overlap(pixels->data(), column * tile_width, row * tile_height, tile_width, tile_height, x, y, width,
                       height, rgb);
        else if (within)
          whiten_overlap(column * tile_width, row * tile_height, tile_width, tile_height, x, y, width, height, rgb);
      }
  }

  std::optional<std::vector<uint8_t>> jpeg_tile(int level_index, int64_t column, int64_t row) const override {
    const Level& level = levels_.at(static_cast<size_t>(level_index));
    if (!level.ycbcr_jpeg) return std::nullopt;
    auto raw = raw_tile(level, level_index, column, row);
    if (raw.empty()) return std::nullopt;
    return complete_jpeg(level, raw);
  }

 private:
  Level read_level(tdir_t directory) {
    Level level;
    level.directory = directory;
    uint32_t width = 0, height = 0, tile_width = 0, tile_height = 0;
    uint16_t compression = COMPRESSION_NONE, photometric = PHOTOMETRIC_RGB;
    TIFFGetField(tiff_, TIFFTAG_IMAGEWIDTH, &width);
    TIFFGetField(tiff_, TIFFTAG_IMAGELENGTH, &height);
    TIFFGetField(tiff_, TIFFTAG_TILEWIDTH, &tile_width);
    TIFFGetField(tiff_, TIFFTAG_TILELENGTH, &tile_height);
    TIFFGetField(tiff_, TIFFTAG_COMPRESSION, &compression);
    TIFFGetField(tiff_, TIFFTAG_PHOTOMETRIC, &photometric);
    if (!width || !height || !tile_width || !tile_height)
      throw BadInput(path_ + ": directory " + std::to_string(directory) + " has no image or tile size");
    if (!TIFFIsCODECConfigured(compression))
      throw BadInput(path_ + ": directory " + std::to_string(directory) + ": unsupported TIFF compression " +
                     std::to_string(compression));
    level.shape = {width, height, 1.0, static_cast<int>(tile_width), static_cast<int>(tile_height)};
    level.columns = (width + tile_width - 1) / tile_width;
    level.rows = (height + tile_height - 1) / tile_height;
    uint16_t samples = 0, bits = 0;
    TIFFGetFieldDefaulted(tiff_, TIFFTAG_SAMPLESPERPIXEL, &samples);
    TIFFGetFieldDefaulted(tiff_, TIFFTAG_BITSPERSAMPLE, &bits);
    level.ycbcr_jpeg = compression == COMPRESSION_JPEG && photometric == PHOTOMETRIC_YCBCR && samples == 3 && bits == 8;
    uint32_t table_size = 0;
    void* tables = nullptr;
    if (TIFFGetField(tiff_, TIFFTAG_JPEGTABLES, &table_size, &tables) && table_size > 4)
      level.jpeg_tables.assign(static_cast<uint8_t*>(tables), static_cast<uint8_t*>(tables) + table_size);
    uint64_t* offsets = nullptr;
    uint64_t* byte_counts = nullptr;
    size_t tiles = TIFFNumberOfTiles(tiff_);
    if (!TIFFGetField(tiff_, TIFFTAG_TILEOFFSETS, &offsets) ||
        !TIFFGetField(tiff_, TIFFTAG_TILEBYTECOUNTS, &byte_counts))
      throw BadInput(path_ + ": directory " + std::to_string(directory) + " has no tile offsets (" + last_tiff_error() +
                     ")");
    level.offsets.assign(offsets, offsets + tiles);
    level.byte_counts.assign(byte_counts, byte_counts + tiles);
    return level;
  }

  void read_resolution() {
    float x_resolution = 0, y_resolution = 0;
    uint16_t unit = RESUNIT_NONE;
    TIFFGetFieldDefaulted(tiff_, TIFFTAG_RESOLUTIONUNIT, &unit);
    double microns_per_unit = unit == RESUNIT_CENTIMETER ? 1e4 : unit == RESUNIT_INCH ? 25400 : 0;
    if (microns_per_unit > 0 && TIFFGetField(tiff_, TIFFTAG_XRESOLUTION, &x_resolution) && x_resolution > 0 &&
        TIFFGetField(tiff_, TIFFTAG_YRESOLUTION, &y_resolution) && y_resolution > 0) {
      mpp_x_ = microns_per_unit / x_resolution;
      mpp_y_ = microns_per_unit / y_resolution;
    }
  }

  // The tile's bytes as stored; empty for a tile the file leaves out (byte count 0).
  std::vector<uint8_t> raw_tile(const Level& level, int level_index, int64_t column, int64_t row) const {
    size_t tile = static_cast<size_t>(row * level.columns + column);
    std::vector<uint8_t> bytes(level.byte_counts.at(tile));
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t got =
          ::pread(fd_, bytes.data() + done, bytes.size() - done, static_cast<off_t>(level.offsets[tile] + done));
      if (got <= 0)
        throw BadInput(path_ + ": " + tile_name(level_index, column, row) + ": cannot read " +
                       std::to_string(bytes.size()) + " bytes at offset " + std::to_string(level.offsets[tile]) +
                       (got < 0 ? std::string(": ") + std::strerror(errno) : std::string(": end of file")));
      done += static_cast<size_t>(got);
    }
    return bytes;
  }

  // Abbreviated tile streams share the directory's JPEGTables: tables without EOI, tile without SOI.
  static std::vector<uint8_t> complete_jpeg(const Level& level, std::vector<uint8_t> raw) {
    if (level.jpeg_tables.empty() || raw.size() < 2) return raw;
    std::vector<uint8_t> jpeg(level.jpeg_tables.begin(), level.jpeg_tables.end() - 2);
    jpeg.insert(jpeg.end(), raw.begin() + 2, raw.end());
    return jpeg;
  }

  TileCache::Pixels decoded_tile(int level_index, int64_t column, int64_t row) const {
    const Level& level = levels_[static_cast<size_t>(level_index)];
    const TileCache::Key key{static_cast<uint32_t>(level_index), 0, row, column};
    if (auto cached = cache_.find(key)) return cached;
    int tile_width = level.shape.tile_width, tile_height = level.shape.tile_height;
    auto pixels = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(tile_width) * tile_height * 3);
    if (level.ycbcr_jpeg) {
      auto raw = raw_tile(level, level_index, column, row);
      if (raw.empty()) return nullptr;
      auto jpeg = complete_jpeg(level, std::move(raw));
      if (auto problem = decode_jpeg(jpeg.data(), jpeg.size(), tile_width, tile_height, pixels->data());
          !problem.empty())
        throw BadInput(path_ + ": " + tile_name(level_index, column, row) + ": corrupt JPEG: " + problem);
    } else {
      read_rgba_tile(level, level_index, column, row, pixels->data());
    }
    cache_.insert(key, pixels);
    return pixels;
  }

  // Any other compression or colour space, through libtiff's RGBA interface (one thread at a time).
  void read_rgba_tile(const Level& level, int level_index, int64_t column, int64_t row, uint8_t* rgb) const {
    int tile_width = level.shape.tile_width, tile_height = level.shape.tile_height;
    std::vector<uint32_t> rgba(static_cast<size_t>(tile_width) * tile_height);
    std::lock_guard lock(tiff_mutex_);
    if (current_directory_ != level.directory) {
      TIFFSetDirectory(tiff_, level.directory);
      current_directory_ = level.directory;
    }
    if (!TIFFReadRGBATile(tiff_, static_cast<uint32_t>(column * tile_width), static_cast<uint32_t>(row * tile_height),
                          rgba.data()))
      throw BadInput(path_ + ": " + tile_name(level_index, column, row) + ": " + last_tiff_error());
    // TIFFReadRGBATile puts the origin at the bottom left.
    for (int y = 0; y < tile_height; ++y)
      for (int x = 0; x < tile_width; ++x) {
        uint32_t pixel = rgba[static_cast<size_t>(tile_height - 1 - y) * tile_width + x];
        uint8_t* out = rgb + (static_cast<size_t>(y) * tile_width + x) * 3;
        out[0] = static_cast<uint8_t>(TIFFGetR(pixel));
        out[1] = static_cast<uint8_t>(TIFFGetG(pixel));
        out[2] = static_cast<uint8_t>(TIFFGetB(pixel));
      }
  }

  std::string path_;
  TIFF* tiff_ = nullptr;
  int fd_ = -1;
  std::vector<Level> levels_;
  std::vector<SlideLevel> shapes_;
  double mpp_x_ = 0, mpp_y_ = 0;
  mutable TileCache cache_;
  mutable std::mutex tiff_mutex_;
  mutable tdir_t current_directory_ = 0;
};

class OpenSlideSlide final : public Slide {
 public:
  OpenSlideSlide(const std::string& path, const char* vendor) : path_(path), vendor_(vendor ? vendor : "unknown") {
    slide_ = openslide_open(path.c_str());
    if (!slide_) throw BadInput(path + ": not a slide that OpenSlide, libtiff or libvips can read");
    if (const char* error = openslide_get_error(slide_)) {
      std::string message = path + ": OpenSlide: " + error;
      openslide_close(slide_);
      throw BadInput(message);
    }
    for (int32_t level = 0; level < openslide_get_level_count(slide_); ++level) {
      SlideLevel shape;
      openslide_get_level_dimensions(slide_, level, &shape.width, &shape.height);
      shape.downsample = openslide_get_level_downsample(slide_, level);
      shape.tile_width = integer_property("openslide.level[" + std::to_string(level) + "].tile-width", 256);
      shape.tile_height = integer_property("openslide.level[" + std::to_string(level) + "].tile-height", 256);
      levels_.push_back(shape);
    }
    mpp_x_ = number_property(OPENSLIDE_PROPERTY_NAME_MPP_X);
    mpp_y_ = number_property(OPENSLIDE_PROPERTY_NAME_MPP_Y);
  }

  ~OpenSlideSlide() override { openslide_close(slide_); }

  const std::string& path() const override { return path_; }
  std::string format() const override { return "openslide:" + vendor_; }
  const std::vector<SlideLevel>& levels() const override { return levels_; }
  double mpp_x() const override { return mpp_x_; }
  double mpp_y() const override { return mpp_y_; }

  void read_region(int level, int64_t x, int64_t y, int width, int height, uint8_t* rgb) const override {
    const LibraryFileScope scope(path_);  // what OpenSlide logs names the slide
    double downsample = levels_.at(static_cast<size_t>(level)).downsample;
    std::vector<uint32_t> argb(static_cast<size_t>(width) * static_cast<size_t>(height));
    std::string error;
    {
      std::shared_lock reading(handle_mutex_);
      openslide_read_region(slide_, argb.data(), level0_position(x, downsample), level0_position(y, downsample),
                            level, width, height);
      if (const char* problem = openslide_get_error(slide_)) error = problem;
    }
    if (!error.empty()) {
      reopen_after_error();
      throw BadInput(path_ + ": OpenSlide: level " + std::to_string(level) + " region at " + std::to_string(x) + "," +
                     std::to_string(y) + ": " + error);
    }
    // Premultiplied ARGB composited over white: colour + (255 - alpha).
    for (size_t i = 0; i < argb.size(); ++i) {
      uint32_t pixel = argb[i];
      uint32_t transparent = 255 - (pixel >> 24);
      rgb[3 * i] = static_cast<uint8_t>(((pixel >> 16) & 255) + transparent);
      rgb[3 * i + 1] = static_cast<uint8_t>(((pixel >> 8) & 255) + transparent);
      rgb[3 * i + 2] = static_cast<uint8_t>((pixel & 255) + transparent);
    }
  }

  std::optional<std::vector<uint8_t>> jpeg_tile(int, int64_t, int64_t) const override { return std::nullopt; }

 private:
  // An OpenSlide handle that met an error fails every later read: the next tile gets a new one.
  void reopen_after_error() const {
    std::unique_lock replacing(handle_mutex_);
    if (!openslide_get_error(slide_)) return;  // another thread replaced it
    if (openslide_t* fresh = openslide_open(path_.c_str())) {
      if (openslide_get_error(fresh)) {
        openslide_close(fresh);
        return;
      }
      openslide_close(slide_);
      slide_ = fresh;
    }
  }

  int integer_property(const std::string& name, int fallback) const {
    const char* value = openslide_get_property_value(slide_, name.c_str());
    return value ? std::atoi(value) : fallback;
  }
  double number_property(const char* name) const {
    const char* value = openslide_get_property_value(slide_, name);
    return value ? std::atof(value) : 0.0;
  }

  std::string path_, vendor_;
  mutable openslide_t* slide_ = nullptr;
  mutable std::shared_mutex handle_mutex_;  // reads share the handle; replacing it is exclusive
  std::vector<SlideLevel> levels_;
  double mpp_x_ = 0, mpp_y_ = 0;
};


// Olympus VSI keeps only an overview image in the .vsi; the pyramid is in .ets files in a folder
// beside it, which neither OpenSlide 3.4 nor libvips reads (the .vsi alone would tile as the
// overview, silently).
void refuse_unread_formats(const std::string& path) {
  const std::string extension = lowercase_extension(path);
  if (extension == ".vsi" || extension == ".ets")
    throw BadInput(path + ": an Olympus VSI slide, whose pyramid lives in the .ets files of the _" +
                   std::filesystem::path(path).stem().string() +
                   "_ folder beside it; tessera does not read .ets (nor do OpenSlide 3.4 and libvips): convert it, "
                   "e.g. bfconvert -pyramid-resolutions 6 " + std::filesystem::path(path).filename().string() +
                   " slide.ome.tiff");
}

bool is_tiled_tiff(const std::string& path) {
  TIFF* tiff = open_tiff(path, "r");
  if (!tiff) return true;  // the TIFF reader names what is wrong
  bool tiled = TIFFIsTiled(tiff);
  TIFFClose(tiff);
  return tiled;
}

std::unique_ptr<Slide> open_reader(const std::string& path, uint64_t tile_cache_bytes, SlideReader reader,
                                   std::optional<IntensityWindow> window) {
  if (!std::filesystem::is_regular_file(path) && !std::filesystem::is_directory(path))
    throw BadInput(path + ": no such slide");
  // What a TIFF declares is checked against its bytes first, whatever reader follows (NDPI
  // stores offsets past 4 GiB outside the TIFF structure, which libtiff cannot follow).
  if (has_tiff_signature(path) && lowercase_extension(path) != ".ndpi") check_tiff_structure(path);
  refuse_unread_formats(path);
  if (reader == SlideReader::libtiff) return std::make_unique<TiffSlide>(path, tile_cache_bytes);
  bool automatic = reader == SlideReader::automatic;
  if (automatic && has_dicom_signature(path)) return open_dicom_slide(path);
  const char* vendor = openslide_detect_vendor(path.c_str());
  bool generic = vendor == nullptr || std::strcmp(vendor, "generic-tiff") == 0;
  if (automatic && has_tiff_signature(path)) {
    if (auto planes = open_plane_slide(path, tile_cache_bytes, window)) return planes;  // multiplex; refuses z-stacks
  }
  if (automatic && generic && has_tiff_signature(path)) {
    if (is_tiled_tiff(path)) return std::make_unique<TiffSlide>(path, tile_cache_bytes);
    return open_vips_slide(path);  // strips: plain TIFF, OME-TIFF without tiles
  }
  if (automatic && vendor == nullptr && std::filesystem::is_regular_file(path) && vips_can_read(path))
    return open_vips_slide(path);  // PNG, JPEG ...
  probe_openslide(path);
  auto slide = std::make_unique<OpenSlideSlide>(path, vendor);
  if (vendor && std::strcmp(vendor, "aperio") == 0) check_levels_nest(path, slide->levels());  // one pyramid
  return slide;
}

}  // namespace

std::unique_ptr<Slide> open_slide(const std::string& path, uint64_t tile_cache_bytes, SlideReader reader,
                                  std::optional<IntensityWindow> window) {
  // Stores, feature files and summaries record the path as a UTF-8 string.
  if (!is_valid_utf8(path))
    throw BadInput(valid_utf8(path) + ": the path is not valid UTF-8 (a Latin-1 name?); stores and feature files "
                   "record it as UTF-8: rename the file");
  const LibraryFileScope scope(path);  // what a library logs while opening it names it
  auto slide = open_reader(path, tile_cache_bytes, reader, window);
  check_slide_declares(*slide);
  return slide;
}

}  // namespace tessera::data
