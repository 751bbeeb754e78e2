// Whole-slide images behind one interface: libtiff for tiled TIFF and BigTIFF, OpenSlide for the
// vendor formats (SVS, NDPI, MRXS, ...).
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tessera::data {

struct SlideLevel {
  int64_t width = 0, height = 0;
  double downsample = 1;                // level-0 pixels per pixel of this level
  int tile_width = 0, tile_height = 0;  // the file's own tiles
};

// How a channel of wider samples becomes the 8 bits a tile holds: `low` and below give 0, `high`
// and above 255, linearly between (rounded).
struct IntensityWindow {
  uint32_t low = 0, high = 255;
};

class Slide {
 public:
  virtual ~Slide() = default;
  virtual const std::string& path() const = 0;
  // "tiff", or "openslide:<vendor>".
  virtual std::string format() const = 0;
  virtual const std::vector<SlideLevel>& levels() const = 0;
  // Microns per level-0 pixel; 0 when the file does not say.
  virtual double mpp_x() const = 0;
  virtual double mpp_y() const = 0;
  // Samples per pixel that read_region writes: 3 (RGB) for bright-field and for fluorescence
  // read as a colour image; a multiplex slide's channel count otherwise (slide_planes.cpp).
  virtual int channels() const { return 3; }
  // Whether the channels are red, green and blue of a colour image (saturation, JPEG, bright-field
  // tissue apply) rather than separate planes: a multiplex slide of 3 channels is not.
  virtual bool rgb() const { return channels() == 3; }
  // The channels' names where the file gives them (OME-TIFF, QPTIFF: "DAPI", "CD8"...); else empty.
  virtual std::vector<std::string> channel_names() const { return {}; }
  // Bits per sample in the file: 8, or 16 for a multiplex slide of 16-bit planes, whose channels
  // read_region maps to 8 bits through intensity_windows() (one a channel; empty for 8 bits).
  virtual int sample_bits() const { return 8; }
  virtual std::vector<IntensityWindow> intensity_windows() const { return {}; }
  // Writes [x, x + width) x [y, y + height) of `level` (in that level's pixels) as RGB (or
  // channels() samples a pixel), row-major; what lies outside the image is white (0 for a
  // multiplex slide). Safe from several threads. Throws BadInput naming the file and the tile
  // when a tile is corrupt.
  virtual void read_region(int level, int64_t x, int64_t y, int width, int height, uint8_t* rgb) const = 0;
  // The file's own tile (column, row) of `level` as a complete JPEG stream that decodes to RGB,
  // when the file stores it that way (so it can be copied without decoding); else nothing.
  virtual std::optional<std::vector<uint8_t>> jpeg_tile(int level, int64_t column, int64_t row) const = 0;
};

// The level-0 pixel nearest to pixel `position` of a level with `downsample`: the origin a tile
// records, and where OpenSlide (which takes level-0 coordinates) is asked to read it, so the two
// never round differently.
inline int64_t level0_position(int64_t position, double downsample) {
  return std::llround(static_cast<double>(position) * downsample);
}

enum class SlideReader {
  automatic,  // libtiff for generic tiled TIFF (its JPEG tiles can be copied), else OpenSlide
  libtiff,
  openslide,
};

// Opens a slide. Throws BadInput naming the file when it is missing, truncated, not tiled or not
// a slide, or a kind tessera does not read (an Olympus .vsi, whose pyramid lives in .ets files;
// a z-stack, a time series, or signed, floating-point or wider than 16-bit samples, named as the
// file's OME-XML or QPTIFF description gives them). Decoded tiles of a TIFF are cached up to
// `tile_cache_bytes`.
// `window`, where given, maps every 16-bit channel instead of the channel's own window.
std::unique_ptr<Slide> open_slide(const std::string& path, uint64_t tile_cache_bytes = uint64_t{64} << 20,
                                  SlideReader reader = SlideReader::automatic,
                                  std::optional<IntensityWindow> window = std::nullopt);

}  // namespace tessera::data
