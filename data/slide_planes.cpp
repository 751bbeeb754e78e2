// Multiplex slides whose channels are grey planes (OME-TIFF: a main directory per plane, its
// pyramid in SubIFDs; QPTIFF: a full-resolution directory per channel, then reduced ones), read
// through libtiff with one handle per plane, so that channels decode on several threads; and the
// kinds of image tessera does not read (z-stacks, time series, signed, floating-point or wider
// than 16-bit samples), refused naming what the file holds. 16-bit channels (most CyCIF, CODEX
// and Orion scans) read as 8 bits through a window per channel taken from the slide itself.
#include <tiffio.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>

#include "common/checked.h"
#include "common/error.h"
#include "data/library_messages.h"
#include "data/ome_xml.h"
#include "data/slide_parts.h"

namespace tessera::data {

namespace {

// A directory: the index of one in the main chain, or the offset of a SubIFD.
struct Directory {
  bool sub = false;
  uint64_t at = 0;
};

bool enter(TIFF* tiff, const Directory& directory) {
  return directory.sub ? TIFFSetSubDirectory(tiff, directory.at) != 0
                       : TIFFSetDirectory(tiff, static_cast<tdir_t>(directory.at)) != 0;
}

// What a multiplex TIFF holds: per level, per channel, the directory of its plane.
struct Layout {
  std::string kind;
  std::vector<std::string> names;
  std::vector<std::vector<Directory>> levels;
  double mpp = 0;
};

std::string description_of(TIFF* tiff) {
  char* text = nullptr;
  return TIFFGetField(tiff, TIFFTAG_IMAGEDESCRIPTION, &text) && text ? std::string(text) : std::string();
}

// "signed 8-bit (int8)": OME's pixel types as a sentence says them.
std::string ome_type_words(const std::string& type) {
  if (type == "int8") return "signed 8-bit (int8)";
  if (type == "int16") return "signed 16-bit (int16)";
  if (type == "int32") return "signed 32-bit (int32)";
  if (type == "uint16") return "16-bit (uint16)";
  if (type == "uint32") return "32-bit (uint32)";
  if (type == "float" || type == "double") return "floating-point (" + type + ")";
  if (type == "bit") return "1-bit";
  return type;
}

// The sample kind of the current directory when tessera cannot read it ("32-bit"), else empty.
std::string unreadable_samples(TIFF* tiff) {
  uint16_t bits = 8, format = SAMPLEFORMAT_UINT;
  TIFFGetFieldDefaulted(tiff, TIFFTAG_BITSPERSAMPLE, &bits);
  TIFFGetFieldDefaulted(tiff, TIFFTAG_SAMPLEFORMAT, &format);
  if (format == SAMPLEFORMAT_INT) return "signed " + std::to_string(bits) + "-bit";
  if (format == SAMPLEFORMAT_IEEEFP) return std::to_string(bits) + "-bit floating-point";
  if (bits != 8 && bits != 16) return std::to_string(bits) + "-bit";
  return "";
}

[[noreturn]] void refuse(const std::string& path, const std::string& holds) {
  throw BadInput(path + ": " + holds + ": tessera reads one focal plane and time point of unsigned 8- or 16-bit "
                                       "samples (export such a plane first, e.g. bfconvert -z 0 -t 0 -pixeltype uint16)");
}

// The IFD's width, height and samples: what its OME-XML says of it must be what it holds.
struct PlaneShape {
  uint32_t width = 0, height = 0;
  uint16_t samples = 1, bits = 8;
};

PlaneShape shape_of(TIFF* tiff) {
  PlaneShape shape;
  TIFFGetField(tiff, TIFFTAG_IMAGEWIDTH, &shape.width);
  TIFFGetField(tiff, TIFFTAG_IMAGELENGTH, &shape.height);
  TIFFGetFieldDefaulted(tiff, TIFFTAG_SAMPLESPERPIXEL, &shape.samples);
  TIFFGetFieldDefaulted(tiff, TIFFTAG_BITSPERSAMPLE, &shape.bits);
  return shape;
}

// Checks that the plane in directory `ifd` is what the OME-XML declares: SizeX x SizeY,
// SamplesPerPixel samples of Type's bits.
void check_plane(TIFF* tiff, const OmePixels& pixels, const std::string& path, uint32_t ifd, const std::string& plane) {
  if (!TIFFSetDirectory(tiff, ifd))
    throw BadInput(path + ": OME-XML TiffData: " + plane + " is in TIFF directory " + std::to_string(ifd) +
                   ", which cannot be read");
  PlaneShape shape = shape_of(tiff);
  std::string where = path + ": " + plane + " (TIFF directory " + std::to_string(ifd) + ")";
  if (shape.width != pixels.size_x || shape.height != pixels.size_y)
    throw BadInput(where + " is " + std::to_string(shape.width) + "x" + std::to_string(shape.height) +
                   ", but OME-XML Pixels SizeX x SizeY says " + std::to_string(pixels.size_x) + "x" +
                   std::to_string(pixels.size_y));
  if (shape.samples != pixels.samples_per_pixel)
    throw BadInput(where + " holds " + std::to_string(shape.samples) + (shape.samples == 1 ? " sample" : " samples") +
                   " a pixel, but OME-XML Channel SamplesPerPixel says " + std::to_string(pixels.samples_per_pixel));
  if (shape.bits != (pixels.type == "uint16" ? 16 : 8))
    throw BadInput(where + " holds " + std::to_string(shape.bits) + "-bit samples, but OME-XML Pixels Type says " +
                   pixels.type);
}

std::optional<Layout> ome_layout(TIFF* tiff, const std::string& path, const std::string& xml) {
  std::optional<OmePixels> read = read_ome_pixels(xml, path);
  if (!read) return std::nullopt;
  OmePixels& pixels = *read;
  std::string file = std::filesystem::path(path).filename().string();
  for (const std::string& name : pixels.files)
    if (name != file) refuse(path, "a multi-file OME-TIFF (planes in " + name + ")");
  const int64_t size_c = pixels.size_c, size_z = pixels.size_z, size_t_ = pixels.size_t_;
  if (size_z > 1 || size_t_ > 1 || (pixels.type != "uint8" && pixels.type != "uint16")) {
    std::string holds = "an OME-TIFF of " + std::to_string(size_c) + (size_c == 1 ? " channel" : " channels");
    if (size_z > 1) holds += ", a z-stack of " + std::to_string(size_z) + " focal planes";
    if (size_t_ > 1) holds += ", a time series of " + std::to_string(size_t_) + " time points";
    refuse(path, holds + ", of " + ome_type_words(pixels.type) + " samples");
  }
  // Without Channel elements, an IFD of SizeC samples is one interleaved (RGB) image.
  TIFFSetDirectory(tiff, 0);
  if (pixels.channels.empty() && size_c > 1 && shape_of(tiff).samples == size_c) pixels.samples_per_pixel = size_c;
  const tdir_t directory_count = TIFFNumberOfDirectories(tiff);
  std::vector<uint32_t> directories = ome_plane_directories(pixels, path, directory_count);
  for (int64_t c = 0; c < pixels.channel_planes(); ++c)
    check_plane(tiff, pixels, path, directories[static_cast<size_t>(pixels.plane_index(c, 0, 0))],
                "OME-XML plane (C " + std::to_string(c) + ", Z 0, T 0)");
  // A colour image (one channel of three samples) is for the ordinary readers; grey planes, one or
  // many, are channels (a single DAPI plane too, with its SubIFD pyramid).
  if (pixels.samples_per_pixel == 3 && size_c == 3) return std::nullopt;
  if (pixels.samples_per_pixel > 1)
    refuse(path, "an OME-TIFF of " + std::to_string(pixels.channel_planes()) + " channels of " +
                     std::to_string(pixels.samples_per_pixel) + " samples each (SamplesPerPixel)");
  // Another directory the size of the planes that no plane maps is a channel the OME-XML leaves
  // out (SizeC below what the file holds). Checked only where one Image describes the file.
  if (pixels.images == 1)
    for (uint32_t ifd = 0; ifd < directory_count; ++ifd) {
      if (std::find(directories.begin(), directories.end(), ifd) != directories.end() || !TIFFSetDirectory(tiff, ifd))
        continue;
      PlaneShape shape = shape_of(tiff);
      if (shape.width == pixels.size_x && shape.height == pixels.size_y && shape.samples == 1)
        throw BadInput(path + ": TIFF directory " + std::to_string(ifd) + " is another " + std::to_string(shape.width) +
                       "x" + std::to_string(shape.height) + " plane, which its OME-XML maps to no channel (SizeC " +
                       std::to_string(size_c) + "): the file holds more channels than it declares");
    }
  Layout layout{"ome-tiff", {}, {}, 0};
  std::vector<Directory> planes;
  for (int64_t c = 0; c < size_c; ++c) {
    auto index = static_cast<size_t>(c);
    layout.names.push_back(index < pixels.channels.size() ? pixels.channels[index].name : "");
    planes.push_back({false, directories[static_cast<size_t>(pixels.plane_index(c, 0, 0))]});
  }
  // Each plane's SubIFDs are its smaller levels; the levels every channel has are the pyramid's.
  size_t level_count = SIZE_MAX;
  std::vector<std::vector<uint64_t>> sub_levels;
  for (const Directory& plane : planes) {
    if (!enter(tiff, plane)) throw BadInput(path + ": OME-XML names TIFF directory " + std::to_string(plane.at) +
                                            ", which the file does not have");
    uint16_t count = 0;
    uint64_t* offsets = nullptr;
    sub_levels.emplace_back();
    if (TIFFGetField(tiff, TIFFTAG_SUBIFD, &count, &offsets) && offsets) sub_levels.back().assign(offsets, offsets + count);
    level_count = std::min(level_count, sub_levels.back().size() + 1);
  }
  layout.levels.assign(level_count, {});
  for (size_t c = 0; c < planes.size(); ++c) {
    layout.levels[0].push_back(planes[c]);
    for (size_t level = 1; level < level_count; ++level) layout.levels[level].push_back({true, sub_levels[c][level - 1]});
  }
  layout.mpp = pixels.microns_per_pixel;
  return layout;
}

// QPTIFF (Akoya/PerkinElmer Vectra, Polaris): each main directory's description says its type
// (FullResolution, ReducedResolution, Thumbnail, Overview, Label) and channel Name.
std::optional<Layout> qptiff_layout(TIFF* tiff, const std::string& path) {
  Layout layout{"qptiff", {}, {}, 0};
  std::vector<std::pair<Directory, std::string>> reduced;
  tdir_t index = 0;
  TIFFSetDirectory(tiff, 0);
  do {
    std::string xml = description_of(tiff);
    std::string type = xml_element_text(xml, "ImageType");
    if (type == "FullResolution") {
      if (layout.levels.empty()) layout.levels.emplace_back();
      layout.levels[0].push_back({false, index});
      layout.names.push_back(xml_element_text(xml, "Name"));
    } else if (type == "ReducedResolution") {
      reduced.push_back({{false, index}, ""});
    }
  } while (TIFFReadDirectory(tiff) && ++index);
  if (layout.levels.empty()) return std::nullopt;
  size_t channels = layout.levels[0].size();
  uint16_t samples = 1;
  enter(tiff, layout.levels[0][0]);
  TIFFGetFieldDefaulted(tiff, TIFFTAG_SAMPLESPERPIXEL, &samples);
  if (samples > 1) return std::nullopt;  // bright-field RGB: the ordinary readers
  within(static_cast<int64_t>(channels), 1, max_slide_channels,
         Field(path, "QPTIFF channels (FullResolution directories)"), "channels a tile header holds");
  for (size_t first = 0; first + channels <= reduced.size(); first += channels) {
    layout.levels.emplace_back();
    for (size_t c = 0; c < channels; ++c) layout.levels.back().push_back(reduced[first + c].first);
  }
  for (const Directory& plane : layout.levels[0]) {
    enter(tiff, plane);
    if (std::string kind = unreadable_samples(tiff); !kind.empty())
      refuse(path, "a QPTIFF of " + std::to_string(channels) + " channels of " + kind + " samples");
  }
  return layout;
}

// One plane of one level: its own libtiff handle parked on its directory, read one thread at a time.
struct Plane {
  TiffFile tiff;
  std::mutex mutex;
  int64_t width = 0, height = 0, columns = 0, rows = 0;
  int tile_width = 0, tile_height = 0;
  int sample_bytes = 1;  // 1 or 2
  bool tiled = false;
  std::vector<uint64_t> byte_counts;
};

class PlanesSlide final : public Slide {
 public:
  PlanesSlide(const std::string& path, Layout layout, uint64_t cache_bytes, std::optional<IntensityWindow> window)
      : path_(path), layout_(std::move(layout)), cache_(cache_bytes) {
    for (size_t level = 0; level < layout_.levels.size(); ++level) {
      auto& planes = planes_.emplace_back();
      for (const Directory& directory : layout_.levels[level]) planes.push_back(open_plane(directory, level));
      const Plane& first = *planes.front();
      for (auto& plane : planes)
        if (plane->width != first.width || plane->height != first.height || plane->tile_width != first.tile_width ||
            plane->tile_height != first.tile_height || plane->sample_bytes != planes_[0][0]->sample_bytes)
          throw BadInput(path + ": the channels of level " + std::to_string(level) +
                         " differ in size, tiling or bits per sample");
      shapes_.push_back({first.width, first.height, 1.0, first.tile_width, first.tile_height});
    }
    for (auto& shape : shapes_)
      shape.downsample = 0.5 * (static_cast<double>(shapes_[0].width) / static_cast<double>(shape.width) +
                                static_cast<double>(shapes_[0].height) / static_cast<double>(shape.height));
    check_levels_nest(path, shapes_);
    mpp_ = layout_.mpp;
    if (mpp_ <= 0) mpp_ = resolution_mpp(planes_[0][0]->tiff.get());
    if (planes_[0][0]->sample_bytes == 2)
      for (size_t channel = 0; channel < layout_.names.size(); ++channel) {
        windows_.push_back(window ? *window : window_of(channel));
        to_8_bits_.push_back(mapping(windows_.back()));
      }
  }

  const std::string& path() const override { return path_; }
  std::string format() const override { return layout_.kind; }
  const std::vector<SlideLevel>& levels() const override { return shapes_; }
  double mpp_x() const override { return mpp_; }
  double mpp_y() const override { return mpp_; }
  int channels() const override { return static_cast<int>(layout_.names.size()); }
  bool rgb() const override { return false; }
  std::vector<std::string> channel_names() const override { return layout_.names; }
  int sample_bits() const override { return 8 * planes_[0][0]->sample_bytes; }
  std::vector<IntensityWindow> intensity_windows() const override { return windows_; }

  void read_region(int level, int64_t x, int64_t y, int width, int height, uint8_t* out) const override {
    const auto& planes = planes_.at(static_cast<size_t>(level));
    const auto channels = planes.size();
    std::memset(out, 0, static_cast<size_t>(width) * static_cast<size_t>(height) * channels);
    const Plane& shape = *planes.front();
    int64_t first_column = std::max<int64_t>(0, x / shape.tile_width);
    int64_t last_column = std::min<int64_t>(shape.columns - 1, (x + width - 1) / shape.tile_width);
    int64_t first_row = std::max<int64_t>(0, y / shape.tile_height);
    int64_t last_row = std::min<int64_t>(shape.rows - 1, (y + height - 1) / shape.tile_height);
    for (size_t c = 0; c < channels; ++c)
      for (int64_t row = first_row; row <= last_row; ++row)
        for (int64_t column = first_column; column <= last_column; ++column) {
          auto tile = decoded(level, c, column, row);
          int64_t tile_x = column * shape.tile_width, tile_y = row * shape.tile_height;
          int64_t x0 = std::max(tile_x, x), x1 = std::min(tile_x + shape.tile_width, x + width);
          int64_t y0 = std::max(tile_y, y), y1 = std::min(tile_y + shape.tile_height, y + height);
          for (int64_t py = y0; py < y1; ++py) {
            const uint8_t* from = tile->data() + (py - tile_y) * shape.tile_width + (x0 - tile_x);
            uint8_t* to = out + ((py - y) * width + (x0 - x)) * static_cast<int64_t>(channels) + static_cast<int64_t>(c);
            for (int64_t px = x0; px < x1; ++px, to += channels) *to = *from++;
          }
        }
  }

  std::optional<std::vector<uint8_t>> jpeg_tile(int, int64_t, int64_t) const override { return std::nullopt; }

 private:
  std::unique_ptr<Plane> open_plane(const Directory& directory, size_t level) const {
    auto plane = std::make_unique<Plane>();
    plane->tiff.reset(open_tiff(path_, "r"));
    if (!plane->tiff || !enter(plane->tiff.get(), directory))
      throw BadInput(path_ + ": cannot open the TIFF directory of a level " + std::to_string(level) + " channel");
    TIFF* tiff = plane->tiff.get();
    uint32_t width = 0, height = 0, tile_width = 0, tile_height = 0, rows_per_strip = 0;
    uint16_t samples = 1;
    TIFFGetField(tiff, TIFFTAG_IMAGEWIDTH, &width);
    TIFFGetField(tiff, TIFFTAG_IMAGELENGTH, &height);
    TIFFGetFieldDefaulted(tiff, TIFFTAG_SAMPLESPERPIXEL, &samples);
    if (std::string kind = unreadable_samples(tiff); !kind.empty() || samples != 1)
      throw BadInput(path_ + ": a level " + std::to_string(level) + " channel holds " +
                     (kind.empty() ? std::to_string(samples) + " samples a pixel" : kind + " samples") +
                     ", not one unsigned 8- or 16-bit sample");
    uint16_t bits = 8;
    TIFFGetFieldDefaulted(tiff, TIFFTAG_BITSPERSAMPLE, &bits);
    plane->sample_bytes = bits / 8;
    plane->tiled = TIFFIsTiled(tiff);
    if (plane->tiled) {
      TIFFGetField(tiff, TIFFTAG_TILEWIDTH, &tile_width);
      TIFFGetField(tiff, TIFFTAG_TILELENGTH, &tile_height);
    } else {
      TIFFGetFieldDefaulted(tiff, TIFFTAG_ROWSPERSTRIP, &rows_per_strip);
      tile_width = width;
      tile_height = std::min(rows_per_strip, height);
    }
    // Sides within what tessera decodes, before anything is sized from them.
    const std::string where = "level " + std::to_string(level) + " channel TIFF directory ";
    plane->width = within(int64_t{width}, 1, int64_t{1} << 31, Field(path_, where + "ImageWidth"));
    plane->height = within(int64_t{height}, 1, int64_t{1} << 31, Field(path_, where + "ImageLength"));
    // A tile is at most max_tile_side a side; a strip as many samples (it spans the plane's width).
    const int64_t max_tile_samples = int64_t{max_tile_side} * max_tile_side;
    plane->tile_height = static_cast<int>(
        within(int64_t{tile_height}, 1, plane->tiled ? max_tile_side : max_tile_samples / plane->width,
               Field(path_, where + (plane->tiled ? "TileLength" : "RowsPerStrip")),
               plane->tiled ? "a tile side tessera decodes" : "a strip of at most 4096 x 4096 samples"));
    plane->tile_width = static_cast<int>(
        plane->tiled ? within(int64_t{tile_width}, 1, max_tile_side, Field(path_, where + "TileWidth")) : plane->width);
    plane->columns = (plane->width + tile_width - 1) / tile_width;
    plane->rows = (plane->height + tile_height - 1) / tile_height;
    // As many byte counts as libtiff holds for the directory, never more than the grid reads.
    uint64_t* counts = nullptr;
    const uint64_t stored = plane->tiled ? TIFFNumberOfTiles(tiff) : TIFFNumberOfStrips(tiff);
    if (TIFFGetField(tiff, plane->tiled ? TIFFTAG_TILEBYTECOUNTS : TIFFTAG_STRIPBYTECOUNTS, &counts) && counts)
      plane->byte_counts.assign(
          counts, counts + std::min<uint64_t>(stored, static_cast<uint64_t>(plane->columns * plane->rows)));
    return plane;
  }

  static double resolution_mpp(TIFF* tiff) {
    float resolution = 0;
    uint16_t unit = RESUNIT_NONE;
    TIFFGetFieldDefaulted(tiff, TIFFTAG_RESOLUTIONUNIT, &unit);
    double microns = unit == RESUNIT_CENTIMETER ? 1e4 : unit == RESUNIT_INCH ? 25400 : 0;
    return microns > 0 && TIFFGetField(tiff, TIFFTAG_XRESOLUTION, &resolution) && resolution > 0 ? microns / resolution
                                                                                                 : 0;
  }

  // Reads the plane's tile (or strip) at (column, row) into `out` (tile_width x tile_height
  // samples); false, leaving `out` as it was, where the file stores none (a sparse file).
  bool read_stored(int level, size_t channel, int64_t column, int64_t row, void* out) const {
    Plane& plane = *planes_[static_cast<size_t>(level)][channel];
    auto index = static_cast<uint32_t>(plane.tiled ? row * plane.columns + column : row);
    if (index >= plane.byte_counts.size() || plane.byte_counts[index] == 0) return false;
    auto bytes = static_cast<tmsize_t>(plane.tile_width) * plane.tile_height * plane.sample_bytes;
    std::lock_guard lock(plane.mutex);
    TIFF* tiff = plane.tiff.get();
    tmsize_t got = plane.tiled ? TIFFReadEncodedTile(tiff, index, out, bytes) : TIFFReadEncodedStrip(tiff, index, out, bytes);
    if (got < 0)
      throw BadInput(path_ + ": " + tile_name(level, column, row) + " of channel " + std::to_string(channel) +
                     " cannot be decoded");
    return true;
  }

  // The plane's tile (or strip), decoded to 8 bits; zeros where the file stores none.
  TileCache::Pixels decoded(int level, size_t channel, int64_t column, int64_t row) const {
    const TileCache::Key key{static_cast<uint32_t>(level), static_cast<uint32_t>(channel), row, column};
    if (auto cached = cache_.find(key)) return cached;
    const Plane& plane = *planes_[static_cast<size_t>(level)][channel];
    auto pixels = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(plane.tile_width) * plane.tile_height);
    if (plane.sample_bytes == 1) {
      read_stored(level, channel, column, row, pixels->data());
    } else {
      std::vector<uint16_t> samples(pixels->size(), 0);
      read_stored(level, channel, column, row, samples.data());
      const std::vector<uint8_t>& to_8_bits = to_8_bits_[channel];
      std::transform(samples.begin(), samples.end(), pixels->begin(), [&](uint16_t v) { return to_8_bits[v]; });
    }
    cache_.insert(key, pixels);
    return pixels;
  }

  // A 16-bit channel's window: the 0.1st and 99.9th percentiles (nearest rank) of its samples in
  // the smallest level, so that neither the background's floor nor a few saturated pixels set the
  // scale. Past kWindowSamples samples, whole tiles at an even stride; unstored tiles count nothing.
  static constexpr int64_t kWindowSamples = int64_t{1} << 24;
  IntensityWindow window_of(size_t channel) const {
    const int level = static_cast<int>(planes_.size()) - 1;
    const Plane& plane = *planes_.back()[channel];
    const int64_t tiles = plane.columns * plane.rows, tile_samples = int64_t{plane.tile_width} * plane.tile_height;
    const int64_t stride = std::max<int64_t>(1, (tiles * tile_samples + kWindowSamples - 1) / kWindowSamples);
    std::vector<uint64_t> histogram(65536, 0);
    std::vector<uint16_t> samples(static_cast<size_t>(tile_samples));
    for (int64_t index = 0; index < tiles; index += stride) {
      int64_t column = index % plane.columns, row = index / plane.columns;
      if (!read_stored(level, channel, column, row, samples.data())) continue;
      int64_t width = std::min<int64_t>(plane.tile_width, plane.width - column * plane.tile_width);
      int64_t height = std::min<int64_t>(plane.tile_height, plane.height - row * plane.tile_height);
      for (int64_t y = 0; y < height; ++y)
        for (int64_t x = 0; x < width; ++x) ++histogram[samples[static_cast<size_t>(y * plane.tile_width + x)]];
    }
    uint64_t count = 0;
    for (uint64_t n : histogram) count += n;
    if (count == 0) return {0, 1};
    // The sample of rank r in sorted order: the least value with more than r samples at or below it.
    auto value_of_rank = [&](uint64_t rank) {
      uint64_t at_or_below = 0;
      for (uint32_t value = 0; value < histogram.size(); ++value)
        if ((at_or_below += histogram[value]) > rank) return value;
      return uint32_t{65535};
    };
    uint32_t low = value_of_rank((count - 1) / 1000), high = value_of_rank(((count - 1) * 999 + 999) / 1000);
    return {low, std::max(high, low + 1)};
  }

  // Every 16-bit value's 8-bit sample through `window`: clipped, linear, rounded half up.
  static std::vector<uint8_t> mapping(const IntensityWindow& window) {
    std::vector<uint8_t> table(65536);
    const int64_t span = window.high - window.low;
    for (int64_t value = 0; value < 65536; ++value) {
      int64_t scaled = ((value - window.low) * 510 + span) / (2 * span);
      table[static_cast<size_t>(value)] = static_cast<uint8_t>(value <= window.low ? 0 : std::min<int64_t>(scaled, 255));
    }
    return table;
  }

  std::string path_;
  Layout layout_;
  std::vector<std::vector<std::unique_ptr<Plane>>> planes_;  // [level][channel]
  std::vector<SlideLevel> shapes_;
  double mpp_ = 0;
  std::vector<IntensityWindow> windows_;         // per channel, for 16-bit planes
  std::vector<std::vector<uint8_t>> to_8_bits_;  // per channel: each 16-bit value's 8 bits
  mutable TileCache cache_;
};

}  // namespace

std::unique_ptr<Slide> open_plane_slide(const std::string& path, uint64_t tile_cache_bytes,
                                        std::optional<IntensityWindow> window) {
  TiffFile tiff(open_tiff(path, "r"));
  if (!tiff) return nullptr;  // the TIFF readers name what is wrong
  std::string xml = description_of(tiff.get());
  std::optional<Layout> layout;
  if (xml.find("<OME") != std::string::npos) {
    layout = ome_layout(tiff.get(), path, xml);
    // OME-XML that describes no pixels is cut short, or keeps them in another file (BinaryOnly).
    if (!layout && xml.find("<Pixels") == std::string::npos)
      throw BadInput(path + ": its OME-XML has no Pixels element (cut short, or its metadata in another file: " +
                     "a multi-file OME-TIFF); tessera reads OME-TIFFs whose first description holds their Pixels");
  } else if (xml.find("PerkinElmer-QPI-ImageDescription") != std::string::npos) {
    layout = qptiff_layout(tiff.get(), path);
  }
  if (!layout) return nullptr;
  return std::make_unique<PlanesSlide>(path, std::move(*layout), tile_cache_bytes, window);
}

}  // namespace tessera::data
