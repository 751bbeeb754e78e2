// A TIFF's structure checked against the bytes the file holds, before any reader (tessera's,
// libvips or OpenSlide) trusts what it declares.
#include <tiffio.h>

#include <array>
#include <cstdarg>
#include <filesystem>
#include <memory>

#include "common/error.h"
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

struct TiffCloser {
  void operator()(TIFF* tiff) const { TIFFClose(tiff); }
};

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

}  // namespace

void check_tiff_structure(const std::string& path) {
  std::string error;
  std::unique_ptr<TIFFOpenOptions, void (*)(TIFFOpenOptions*)> options(TIFFOpenOptionsAlloc(), TIFFOpenOptionsFree);
  TIFFOpenOptionsSetErrorHandlerExtR(options.get(), keep_error, &error);
  TIFFOpenOptionsSetWarningHandlerExtR(options.get(), drop_warning, nullptr);
  TIFFOpenOptionsSetMaxSingleMemAlloc(options.get(), tmsize_t{256} << 20);
  std::unique_ptr<TIFF, TiffCloser> tiff(TIFFOpenExt(path.c_str(), "r", options.get()));
  if (!tiff) throw BadInput(path + ": not a readable TIFF (" + error + ")");
  uint64_t file_size = std::filesystem::file_size(path);
  uint32_t largest_width = 0;
  uint64_t largest_tiles = 0, largest_with_data = 0;
  tdir_t directory = 0;
  for (;; ++directory) {
    std::string where = path + ": directory " + std::to_string(directory);
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
    }
    if (tiled && width > largest_width) {
      largest_width = width;
      largest_tiles = pieces.count;
      largest_with_data = with_data;
    }
    if (TIFFLastDirectory(tiff.get())) break;
    if (!TIFFReadDirectory(tiff.get()))
      throw BadInput(path + ": truncated or corrupt: the directory after directory " + std::to_string(directory) +
                     " cannot be read (" + error + ")");
  }
  if (largest_tiles && !largest_with_data)
    throw BadInput(path + ": holds no image data: all " + std::to_string(largest_tiles) +
                   " tiles of its full-resolution level are empty");
}

}  // namespace tessera::data
