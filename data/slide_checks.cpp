// What a slide declares checked against what it holds: a TIFF's structure against the bytes of
// the file, before any reader (tessera's, libvips or OpenSlide) trusts it; a pyramid's levels
// against each other.
#include <fcntl.h>
#include <tiffio.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdarg>
#include <cstring>
#include <filesystem>
#include <memory>

#include "common/checked.h"
#include "common/error.h"
#include "data/library_messages.h"
#include "data/slide_parts.h"

namespace tessera::data {

namespace {

int keep_error(TIFF*, void* user_data, const char* module, const char* format, va_list args) {
  std::array<char, 512> text{};
  std::vsnprintf(text.data(), text.size(), format, args);
  *static_cast<std::string*>(user_data) = std::string(module ? module : "libtiff") + ": " + text.data();
  return 1;
}

int drop_warning(TIFF*, void*, const char*, const char*, va_list) { return 1; }

// The offsets and byte counts of a directory's tiles (or strips), or nothing when it has none.
struct Pieces {
  const uint64_t* offsets = nullptr;
  const uint64_t* byte_counts = nullptr;
  uint32_t count = 0;
};

Pieces pieces_of(TIFF* tiff) {
  Pieces pieces;
  bool tiled = TIFFIsTiled(tiff);
  uint64_t* offsets = nullptr;
  uint64_t* byte_counts = nullptr;
  if (TIFFGetField(tiff, tiled ? TIFFTAG_TILEOFFSETS : TIFFTAG_STRIPOFFSETS, &offsets) &&
      TIFFGetField(tiff, tiled ? TIFFTAG_TILEBYTECOUNTS : TIFFTAG_STRIPBYTECOUNTS, &byte_counts) && offsets &&
      byte_counts)
    pieces = {offsets, byte_counts, tiled ? TIFFNumberOfTiles(tiff) : TIFFNumberOfStrips(tiff)};
  return pieces;
}

// Bytes of one value of a TIFF field type; 0 for a type libtiff does not know (it skips those).
uint64_t type_size(uint16_t type) {
  switch (type) {
    case 1: case 2: case 6: case 7: return 1;           // BYTE, ASCII, SBYTE, UNDEFINED
    case 3: case 8: return 2;                           // SHORT, SSHORT
    case 4: case 9: case 11: case 13: return 4;         // LONG, SLONG, FLOAT, IFD
    case 5: case 10: case 12: case 16: case 17: case 18: return 8;  // RATIONAL ... IFD8
    default: return 0;
  }
}

// The raw entries of the directory at `offset`: each value stored outside its entry must lie in
// the file. libtiff drops such a field with a warning and reads on, so a file cut inside an
// ImageDescription or JPEGTables would otherwise open as if whole.
class DirectoryEntries {
 public:
  DirectoryEntries(const std::string& path, uint64_t file_size, bool big, bool big_endian)
      : path_(path), file_size_(file_size), big_(big), big_endian_(big_endian), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) throw BadInput(path + ": cannot open: " + std::strerror(errno));
  }
  ~DirectoryEntries() { ::close(fd_); }
  DirectoryEntries(const DirectoryEntries&) = delete;
  DirectoryEntries& operator=(const DirectoryEntries&) = delete;

  void check(tdir_t directory, uint64_t offset) const {
    std::string where = path_ + ": truncated: directory " + std::to_string(directory);
    uint64_t count = number(offset, big_ ? 8 : 2, where);
    uint64_t entry_size = big_ ? 20 : 12, inline_size = big_ ? 8 : 4;
    uint64_t first = offset + (big_ ? 8 : 2);
    if (count > file_size_ / entry_size || first + count * entry_size + inline_size > file_size_)
      throw BadInput(where + " (" + std::to_string(count) + " entries at byte " + std::to_string(offset) +
                     ") ends past the end of the file (" + std::to_string(file_size_) + " bytes)");
    for (uint64_t i = 0; i < count; ++i) {
      uint64_t entry = first + i * entry_size;
      auto tag = static_cast<uint16_t>(number(entry, 2, where));
      uint64_t size = type_size(static_cast<uint16_t>(number(entry + 2, 2, where)));
      uint64_t values = number(entry + 4, big_ ? 8 : 4, where);
      if (size == 0 || values > file_size_ / size || values * size <= inline_size) continue;
      uint64_t at = number(entry + (big_ ? 12 : 8), big_ ? 8 : 4, where);
      if (at > file_size_ || values * size > file_size_ - at)
        throw BadInput(where + ": field " + std::to_string(tag) + " holds " + std::to_string(values * size) +
                       " bytes at byte " + std::to_string(at) + ", past the end of the file (" +
                       std::to_string(file_size_) + " bytes)");
    }
  }

 private:
  // An unsigned integer of `bytes` bytes at `offset`, in the file's byte order.
  uint64_t number(uint64_t offset, int bytes, const std::string& where) const {
    std::array<uint8_t, 8> raw{};
    if (::pread(fd_, raw.data(), static_cast<size_t>(bytes), static_cast<off_t>(offset)) != bytes)
      throw BadInput(where + ": cannot read byte " + std::to_string(offset));
    uint64_t value = 0;
    for (int i = 0; i < bytes; ++i) {
      int from = big_endian_ ? i : bytes - 1 - i;  // most significant first
      value = value << 8 | raw[static_cast<size_t>(from)];
    }
    return value;
  }

  std::string path_;
  uint64_t file_size_;
  bool big_, big_endian_;
  int fd_;
};

// Bytes an uncompressed tile or strip `index` must hold; 0 when the data is compressed.
uint64_t uncompressed_size(TIFF* tiff, uint32_t index) {
  uint16_t compression = COMPRESSION_NONE;
  TIFFGetFieldDefaulted(tiff, TIFFTAG_COMPRESSION, &compression);
  if (compression != COMPRESSION_NONE) return 0;
  if (TIFFIsTiled(tiff)) return TIFFTileSize64(tiff);
  uint32_t height = 0, rows_per_strip = 0;
  TIFFGetField(tiff, TIFFTAG_IMAGELENGTH, &height);
  TIFFGetFieldDefaulted(tiff, TIFFTAG_ROWSPERSTRIP, &rows_per_strip);
  rows_per_strip = std::min(std::max(rows_per_strip, 1u), std::max(height, 1u));
  uint32_t strips_per_plane = (height + rows_per_strip - 1) / rows_per_strip;
  uint64_t first_row = uint64_t{index % std::max(strips_per_plane, 1u)} * rows_per_strip;
  auto rows = static_cast<uint32_t>(std::min<uint64_t>(rows_per_strip, height > first_row ? height - first_row : 0));
  return TIFFVStripSize64(tiff, rows);
}

}  // namespace

void check_tiff_structure(const std::string& path) {
  std::string error;
  std::unique_ptr<TIFFOpenOptions, void (*)(TIFFOpenOptions*)> options(TIFFOpenOptionsAlloc(), TIFFOpenOptionsFree);
  TIFFOpenOptionsSetErrorHandlerExtR(options.get(), keep_error, &error);
  TIFFOpenOptionsSetWarningHandlerExtR(options.get(), drop_warning, nullptr);
  TIFFOpenOptionsSetMaxSingleMemAlloc(options.get(), tmsize_t{256} << 20);
  TiffFile tiff(TIFFOpenExt(path.c_str(), "r", options.get()));
  if (!tiff) throw BadInput(path + ": not a readable TIFF (" + error + ")");
  uint64_t file_size = std::filesystem::file_size(path);
  DirectoryEntries entries(path, file_size, TIFFIsBigTIFF(tiff.get()), TIFFIsBigEndian(tiff.get()));
  // A sparse TIFF may leave whole levels unstored (read as background); a file whose every tiled
  // level stores nothing holds no image.
  uint64_t tiles = 0, tiles_with_data = 0;
  tdir_t directory = 0;
  for (;; ++directory) {
    std::string where = path + ": directory " + std::to_string(directory);
    entries.check(directory, TIFFCurrentDirOffset(tiff.get()));
    uint32_t width = 0, height = 0;
    TIFFGetField(tiff.get(), TIFFTAG_IMAGEWIDTH, &width);
    TIFFGetField(tiff.get(), TIFFTAG_IMAGELENGTH, &height);
    bool tiled = TIFFIsTiled(tiff.get());
    if (tiled) {
      uint32_t tile_width = 0, tile_height = 0;
      TIFFGetField(tiff.get(), TIFFTAG_TILEWIDTH, &tile_width);
      TIFFGetField(tiff.get(), TIFFTAG_TILELENGTH, &tile_height);
      if (!tile_width || !tile_height || tile_width > max_tile_side || tile_height > max_tile_side)
        throw BadInput(where + ": tiles of " + std::to_string(tile_width) + "x" + std::to_string(tile_height) +
                       " pixels; tessera reads tiles of 1 to " + std::to_string(max_tile_side) +
                       " pixels a side (a corrupt file?)");
    }
    Pieces pieces = pieces_of(tiff.get());
    if (!pieces.offsets && width && height)
      throw BadInput(where + " has no " + (tiled ? "tile" : "strip") + " offsets (" + error + ")");
    uint64_t with_data = 0;
    for (uint32_t i = 0; i < pieces.count; ++i) {
      uint64_t offset = pieces.offsets[i], bytes = pieces.byte_counts[i];
      if (bytes == 0) continue;
      ++with_data;
      if (offset > file_size || bytes > file_size - offset)
        throw BadInput(path + ": truncated: directory " + std::to_string(directory) + " " +
                       (tiled ? "tile " : "strip ") + std::to_string(i) + " ends at byte " +
                       std::to_string(offset + bytes) + ", the file has " + std::to_string(file_size));
      // Uncompressed pixels are as many bytes as the geometry says (a row of padding at most).
      if (uint64_t expected = uncompressed_size(tiff.get(), i);
          expected && (bytes < expected || bytes > expected + TIFFScanlineSize64(tiff.get())))
        throw BadInput(where + ": " + (tiled ? "tile " : "strip ") + std::to_string(i) + " holds " +
                       std::to_string(bytes) + " bytes of uncompressed pixels, its " + std::to_string(width) + "x" +
                       std::to_string(height) + " image needs " + std::to_string(expected) + " (a corrupt file)");
    }
    if (tiled) {
      tiles += pieces.count;
      tiles_with_data += with_data;
    }
    if (TIFFLastDirectory(tiff.get())) break;
    if (!TIFFReadDirectory(tiff.get()))
      throw BadInput(path + ": truncated or corrupt: the directory after directory " + std::to_string(directory) +
                     " cannot be read (" + error + ")");
  }
  if (tiles && !tiles_with_data)
    throw BadInput(path + ": holds no image data: all " + std::to_string(tiles) + " tiles of its levels are empty");
}

void check_levels_nest(const std::string& path, const std::vector<SlideLevel>& levels) {
  if (levels.empty()) return;
  auto base_width = static_cast<double>(levels[0].width), base_height = static_cast<double>(levels[0].height);
  for (size_t l = 1; l < levels.size(); ++l) {
    // The downsamples that round to this width (and height) within a pixel must overlap.
    auto width = static_cast<double>(levels[l].width), height = static_cast<double>(levels[l].height);
    double low = std::max(base_width / (width + 1), base_height / (height + 1));
    double high = std::min(width > 1 ? base_width / (width - 1) : INFINITY, height > 1 ? base_height / (height - 1) : INFINITY);
    if (low > high)
      throw BadInput(path + ": level " + std::to_string(l) + " (" + std::to_string(levels[l].width) + "x" +
                     std::to_string(levels[l].height) + ") is no reduction of level 0 (" +
                     std::to_string(levels[0].width) + "x" + std::to_string(levels[0].height) +
                     ") by one factor: a corrupt file");
  }
}

void check_slide_declares(const Slide& slide) {
  const std::string& path = slide.path();
  if (slide.levels().empty()) throw BadInput(path + ": holds no image level");
  for (size_t l = 0; l < slide.levels().size(); ++l) {
    const SlideLevel& level = slide.levels()[l];
    const std::string name = "level " + std::to_string(l) + " ";
    within(level.width, 1, int64_t{1} << 31, Field(path, name + "width"), "a slide side tessera reads");
    within(level.height, 1, int64_t{1} << 31, Field(path, name + "height"), "a slide side tessera reads");
    within(level.tile_width, 1, 65535, Field(path, name + "tile width"));
    within(level.tile_height, 1, 65535, Field(path, name + "tile height"));
    if (!std::isfinite(level.downsample) || level.downsample < 1 - 1e-9)
      throw BadInput(path + ": " + name + "downsample is " + std::to_string(level.downsample) +
                     ", not a finite number of at least 1");
  }
  for (auto [name, mpp] : {std::pair{"x", slide.mpp_x()}, std::pair{"y", slide.mpp_y()}})
    if (!std::isfinite(mpp) || mpp < 0)
      throw BadInput(path + ": microns per pixel (" + name + ") is " + std::to_string(mpp) +
                     ", not a finite number >= 0 (a corrupt resolution or pixel spacing)");
  within(slide.channels(), 1, 255, Field(path, "channels"), "channels a tile header holds");
}

}  // namespace tessera::data
