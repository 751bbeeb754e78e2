#include "data/synthetic_slide.h"

#include <tiffio.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <vector>

#include "common/error.h"
#include "common/files.h"
#include "common/output.h"
#include "common/progress.h"
#include "data/jpeg.h"
#include "data/library_messages.h"
#include "data/ordered_parallel.h"
#include "data/synthetic_tissue.h"

namespace tessera::data {

namespace {

// libtiff writes the file this run created new (never through a link at `path`).
TiffFile create_tiff(const std::string& path, const char* mode) {
  UniqueFd file = create_new_file(path);
  TiffFile tiff(open_tiff_fd(file.get(), path, mode));
  if (!tiff) throw Error(ExitCode::runtime_error, path + ": cannot create the file (" + last_tiff_error() + ")");
  file.release();  // TIFFClose closes it
  return tiff;
}

void write_directory(TIFF* tiff, const std::string& path) {
  if (!TIFFWriteDirectory(tiff)) throw Error(ExitCode::runtime_error, path + ": cannot write a TIFF directory");
}

// The pyramid: each level halves the one before while it keeps at least ~1,000 pixels.
std::vector<std::pair<int64_t, int64_t>> pyramid(int64_t width, int64_t height) {
  std::vector<std::pair<int64_t, int64_t>> levels{{width, height}};
  for (int64_t divisor = 2; std::max((width + divisor - 1) / divisor, (height + divisor - 1) / divisor) >= 1000;
       divisor *= 2)
    levels.emplace_back((width + divisor - 1) / divisor, (height + divisor - 1) / divisor);
  return levels;
}

void write_mask(const SyntheticTissue& model, int64_t width, int64_t height, const std::string& path, int64_t downsample) {
  int64_t mask_width = (width + downsample - 1) / downsample, mask_height = (height + downsample - 1) / downsample;
  TiffFile tiff = create_tiff(path, "w");
  TIFFSetField(tiff.get(), TIFFTAG_IMAGEWIDTH, static_cast<uint32_t>(mask_width));
  TIFFSetField(tiff.get(), TIFFTAG_IMAGELENGTH, static_cast<uint32_t>(mask_height));
  TIFFSetField(tiff.get(), TIFFTAG_BITSPERSAMPLE, 8);
  TIFFSetField(tiff.get(), TIFFTAG_SAMPLESPERPIXEL, 1);
  TIFFSetField(tiff.get(), TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_MINISBLACK);
  TIFFSetField(tiff.get(), TIFFTAG_COMPRESSION, COMPRESSION_ADOBE_DEFLATE);
  TIFFSetField(tiff.get(), TIFFTAG_ROWSPERSTRIP, 64);
  std::string description =
      nlohmann::json{{"downsample", downsample}, {"values", {{"0", "other"}, {"1", "Tumor"}}}}.dump();
  TIFFSetField(tiff.get(), TIFFTAG_IMAGEDESCRIPTION, description.c_str());
  std::vector<uint8_t> row(static_cast<size_t>(mask_width));
  for (int64_t y = 0; y < mask_height; ++y) {
    for (int64_t x = 0; x < mask_width; ++x)
      row[static_cast<size_t>(x)] = model.in_tumour((static_cast<double>(x) + 0.5) * static_cast<double>(downsample),
                                                    (static_cast<double>(y) + 0.5) * static_cast<double>(downsample));
    if (TIFFWriteScanline(tiff.get(), row.data(), static_cast<uint32_t>(y), 0) < 0)
      throw Error(ExitCode::runtime_error, path + ": cannot write mask row " + std::to_string(y));
  }
  write_directory(tiff.get(), path);
}

void write_geojson(const SyntheticTissue& model, const std::string& path) {
  auto features = nlohmann::json::array();
  for (size_t tumour = 0; tumour < model.tumour_count(); ++tumour)
    features.push_back(
        {{"type", "Feature"},
         {"geometry", {{"type", "Polygon"}, {"coordinates", {model.tumour_ring(tumour)}}}},
         {"properties",
          {{"objectType", "annotation"}, {"classification", {{"name", "Tumor"}, {"color", {200, 0, 0}}}}}}});
  write_new_file(path, nlohmann::json{{"type", "FeatureCollection"}, {"features", features}}.dump() + "\n");
}


using Levels = std::vector<std::pair<int64_t, int64_t>>;
using Encoded = std::shared_ptr<const std::vector<uint8_t>>;

// The tags of a level's directory: its size, tiling, samples, compression and resolution.
void set_level_tags(TIFF* out, const SyntheticSlideOptions& options, int64_t width, int64_t height, size_t level,
                    uint16_t samples, uint16_t compression, uint16_t photometric) {
  double downsample = static_cast<double>(int64_t{1} << level);
  TIFFSetField(out, TIFFTAG_SUBFILETYPE, level > 0 ? FILETYPE_REDUCEDIMAGE : 0);
  // The shape before the codec: setting JPEG's photometric makes libtiff size a scanline, which
  // is zero (and a warning) while the directory has no width.
  TIFFSetField(out, TIFFTAG_IMAGEWIDTH, static_cast<uint32_t>(width));
  TIFFSetField(out, TIFFTAG_IMAGELENGTH, static_cast<uint32_t>(height));
  TIFFSetField(out, TIFFTAG_TILEWIDTH, static_cast<uint32_t>(options.tile_size));
  TIFFSetField(out, TIFFTAG_TILELENGTH, static_cast<uint32_t>(options.tile_size));
  TIFFSetField(out, TIFFTAG_BITSPERSAMPLE, 8);
  TIFFSetField(out, TIFFTAG_SAMPLESPERPIXEL, samples);
  TIFFSetField(out, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
  TIFFSetField(out, TIFFTAG_COMPRESSION, compression);
  TIFFSetField(out, TIFFTAG_PHOTOMETRIC, photometric);
  TIFFSetField(out, TIFFTAG_RESOLUTIONUNIT, RESUNIT_CENTIMETER);
  TIFFSetField(out, TIFFTAG_XRESOLUTION, 1e4 / (options.mpp * downsample));
  TIFFSetField(out, TIFFTAG_YRESOLUTION, 1e4 / (options.mpp * downsample));
  TIFFSetField(out, TIFFTAG_SOFTWARE, "tessera synth");
}

// Writes one level's tiles, rendered and compressed on the workers and written in order;
// `encode` turns a tile's pixels (channels() bytes a pixel) into the bytes the file stores.
// Returns how many tiles held tissue.
uint64_t write_level_tiles(TIFF* out, const SyntheticTissue& model, const SyntheticSlideOptions& options,
                           const std::string& path, int64_t width, int64_t height, size_t level, const Encoded& empty,
                           const std::function<Encoded(std::vector<uint8_t>&&)>& encode, Progress& progress,
                           uint64_t& done) {
  const int size = options.tile_size;
  double downsample = static_cast<double>(int64_t{1} << level);
  int64_t columns = (width + size - 1) / size, rows = (height + size - 1) / size;
  uint64_t tissue_tiles = 0;
  ordered_parallel<Encoded>(
      static_cast<size_t>(columns * rows), options.workers, static_cast<size_t>(options.workers) * 16,
      [&](size_t tile) -> Encoded {
        int64_t x0 = static_cast<int64_t>(tile) % columns * size, y0 = static_cast<int64_t>(tile) / columns * size;
        std::vector<uint8_t> pixels(static_cast<size_t>(size) * size * static_cast<size_t>(model.channels()));
        if (!model.render(downsample, x0, y0, size, pixels.data())) return empty;
        return encode(std::move(pixels));
      },
      [&](size_t tile, Encoded&& bytes) {
        tissue_tiles += bytes != empty;
        if (TIFFWriteRawTile(out, static_cast<uint32_t>(tile), const_cast<uint8_t*>(bytes->data()),
                             static_cast<tmsize_t>(bytes->size())) < 0)
          throw Error(ExitCode::runtime_error, path + ": cannot write level " + std::to_string(level) + " tile " +
                                                   std::to_string(tile) + " (disk full?)");
        progress.update(++done, {{"level", level}});
      });
  write_directory(out, path);
  return tissue_tiles;
}

// Bright-field, or fluorescence as a scanner's RGB composite: a pyramidal JPEG BigTIFF, each
// level a directory. Returns level 0's tissue tiles.
uint64_t write_rgb_pyramid(const SyntheticTissue& model, const SyntheticSlideOptions& options, const Levels& levels,
                           const std::string& path, Progress& progress) {
  const int size = options.tile_size;
  std::vector<uint8_t> background(static_cast<size_t>(size) * size * 3, model.background());
  auto empty = std::make_shared<const std::vector<uint8_t>>(encode_jpeg(background.data(), size, size, options.quality));
  auto encode = [&](std::vector<uint8_t>&& pixels) -> Encoded {
    return std::make_shared<const std::vector<uint8_t>>(encode_jpeg(pixels.data(), size, size, options.quality));
  };
  TiffFile tiff = create_tiff(path, "w8");
  uint64_t done = 0, tissue_tiles = 0;
  for (size_t level = 0; level < levels.size(); ++level) {
    TIFF* out = tiff.get();
    set_level_tags(out, options, levels[level].first, levels[level].second, level, 3, COMPRESSION_JPEG,
                   PHOTOMETRIC_YCBCR);
    TIFFSetField(out, TIFFTAG_YCBCRSUBSAMPLING, 2, 2);
    if (level == 0) {
      std::string description = std::string("tessera synthetic slide seed=") + std::to_string(options.seed) +
                                " mpp=" + std::to_string(options.mpp) + (options.fluorescence ? " fluorescence" : "");
      TIFFSetField(out, TIFFTAG_IMAGEDESCRIPTION, description.c_str());
    }
    uint64_t tissue = write_level_tiles(out, model, options, path, levels[level].first, levels[level].second, level,
                                        empty, encode, progress, done);
    if (level == 0) tissue_tiles = tissue;
  }
  return tissue_tiles;
}

// The channel names of a panel of `channels` (synthetic_tissue.h), for the OME-XML.
std::string channel_name(int channel) {
  static const char* const names[] = {"DAPI", "panCK", "Autofluorescence", "CD8", "CD20", "CD68", "FOXP3", "CD31"};
  return channel < 8 ? names[channel] : "Marker " + std::to_string(channel);
}

std::string ome_xml(const SyntheticSlideOptions& options, const std::string& name) {
  std::ostringstream mpp;  // to 10 digits: std::to_string keeps 6 decimals (0.001234 for 0.0012345)
  mpp.precision(10);
  mpp << options.mpp;
  std::string xml =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?><OME xmlns=\"http://www.openmicroscopy.org/Schemas/OME/2016-06\" "
      "Creator=\"tessera synth\"><Image ID=\"Image:0\" Name=\"" + name + "\"><Pixels ID=\"Pixels:0\" "
      "DimensionOrder=\"XYCZT\" Type=\"uint8\" BigEndian=\"false\" SizeX=\"" + std::to_string(options.width) +
      "\" SizeY=\"" + std::to_string(options.height) + "\" SizeC=\"" + std::to_string(options.channels) +
      "\" SizeZ=\"1\" SizeT=\"1\" PhysicalSizeX=\"" + mpp.str() + "\" PhysicalSizeY=\"" + mpp.str() + "\">";
  for (int c = 0; c < options.channels; ++c)
    xml += "<Channel ID=\"Channel:0:" + std::to_string(c) + "\" Name=\"" + channel_name(c) + "\" SamplesPerPixel=\"1\"/>";
  return xml + "<TiffData IFD=\"0\" PlaneCount=\"" + std::to_string(options.channels) + "\"/></Pixels></Image></OME>";
}

// A multiplex slide as OME-TIFF writes one (Bio-Formats, QuPath): each channel a grey plane,
// its level 0 a directory of the main chain and its smaller levels that directory's SubIFDs,
// the OME-XML in the first directory; tiles deflate-compressed. Each channel renders the
// pyramid again and keeps its own samples. Returns level 0's tissue tiles.
uint64_t write_ome_planes(const SyntheticTissue& model, const SyntheticSlideOptions& options, const Levels& levels,
                          const std::string& path, const std::string& name, Progress& progress) {
  const int size = options.tile_size;
  const auto channels = static_cast<size_t>(options.channels);
  auto deflate = [](const uint8_t* data, size_t input_bytes) {
    auto bytes = std::make_shared<std::vector<uint8_t>>(compressBound(static_cast<uLong>(input_bytes)));
    uLongf length = static_cast<uLongf>(bytes->size());
    if (compress2(bytes->data(), &length, data, static_cast<uLong>(input_bytes), Z_BEST_SPEED) != Z_OK)
      throw Error(ExitCode::runtime_error, "zlib: cannot compress a tile");
    bytes->resize(length);
    return Encoded(std::move(bytes));
  };
  std::vector<uint8_t> background(static_cast<size_t>(size) * size, model.background());
  Encoded empty = deflate(background.data(), background.size());
  TiffFile tiff = create_tiff(path, "w8");
  uint64_t done = 0, tissue_tiles = 0;
  std::string xml = ome_xml(options, name);
  for (size_t channel = 0; channel < channels; ++channel) {
    auto encode = [&](std::vector<uint8_t>&& pixels) {
      for (size_t i = 0; i < pixels.size() / channels; ++i) pixels[i] = pixels[i * channels + channel];
      return deflate(pixels.data(), pixels.size() / channels);
    };
    for (size_t level = 0; level < levels.size(); ++level) {
      TIFF* out = tiff.get();
      set_level_tags(out, options, levels[level].first, levels[level].second, level, 1, COMPRESSION_ADOBE_DEFLATE,
                     PHOTOMETRIC_MINISBLACK);
      if (level == 0 && levels.size() > 1) {
        std::vector<uint64_t> subifds(levels.size() - 1, 0);  // filled in as the next directories are written
        TIFFSetField(out, TIFFTAG_SUBIFD, static_cast<uint16_t>(subifds.size()), subifds.data());
      }
      if (level == 0 && channel == 0) TIFFSetField(out, TIFFTAG_IMAGEDESCRIPTION, xml.c_str());
      uint64_t tissue = write_level_tiles(out, model, options, path, levels[level].first, levels[level].second, level,
                                          empty, encode, progress, done);
      if (level == 0 && channel == 0) tissue_tiles = tissue;
    }
  }
  return tissue_tiles;
}

nlohmann::json write_files(const SyntheticSlideOptions& options, const SyntheticSlidePaths& paths,
                           const std::string& name) {
  auto start = std::chrono::steady_clock::now();
  const int64_t width = options.width, height = options.height;
  const int size = options.tile_size;
  SyntheticTissue model(width, height, options.seed, options.tumour, options.fluorescence, options.channels);
  auto levels = pyramid(width, height);
  bool planes = options.channels != 3;

  uint64_t total_tiles = 0;
  for (auto [level_width, level_height] : levels)
    total_tiles += static_cast<uint64_t>((level_width + size - 1) / size) *
                   static_cast<uint64_t>((level_height + size - 1) / size);
  Progress progress("synth", total_tiles * (planes ? static_cast<uint64_t>(options.channels) : 1));
  uint64_t tissue_tiles = planes ? write_ome_planes(model, options, levels, paths.slide, name, progress)
                                 : write_rgb_pyramid(model, options, levels, paths.slide, progress);
  progress.finish();

  int64_t mask_downsample = 1;
  while (std::max(width, height) / mask_downsample > 2048) mask_downsample *= 2;
  write_mask(model, width, height, paths.mask, mask_downsample);
  write_geojson(model, paths.geojson);

  auto level_list = nlohmann::json::array();
  for (auto [level_width, level_height] : levels) level_list.push_back({level_width, level_height});
  double area = static_cast<double>(width) * static_cast<double>(height);
  return {{"slide", paths.slide},
          {"mask", paths.mask},
          {"geojson", paths.geojson},
          {"width", width},
          {"height", height},
          {"seed", options.seed},
          {"stain", options.fluorescence ? "fluorescence" : "brightfield"},
          {"channels", options.channels},
          {"format", planes ? "ome-tiff" : "tiff"},
          {"levels", level_list},
          {"tile_size", size},
          {"mpp", options.mpp},
          {"mask_downsample", mask_downsample},
          {"tissue_fraction", model.tissue_area() / area},
          {"tumour_fraction", model.tumour_area() / area},
          {"tumour_regions", model.tumour_count()},
          {"level0_tissue_tiles", tissue_tiles},
          {"tiles", total_tiles},
          {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()}};
}

}  // namespace

nlohmann::json write_synthetic_slide(const SyntheticSlideOptions& options, const SyntheticSlidePaths& paths) {
  // Each file is written under NAME.partial and renamed when all three are complete (the slide
  // last), so a killed or failed run leaves nothing at the output paths.
  SyntheticSlidePaths partial{paths.slide + ".partial", paths.mask + ".partial", paths.geojson + ".partial"};
  nlohmann::json summary;
  try {
    summary = write_files(options, partial, std::filesystem::path(paths.slide).filename().string());
    for (auto [from, to] : {std::pair{&partial.mask, &paths.mask}, std::pair{&partial.geojson, &paths.geojson},
                            std::pair{&partial.slide, &paths.slide}})
      durable_rename(*from, *to);
  } catch (...) {
    std::error_code ignored;
    for (auto* path : {&partial.slide, &partial.mask, &partial.geojson}) std::filesystem::remove(*path, ignored);
    throw;
  }
  summary.update({{"slide", paths.slide}, {"mask", paths.mask}, {"geojson", paths.geojson}});
  return summary;
}

}  // namespace tessera::data
