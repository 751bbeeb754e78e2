// Keys and values of the LMDB tile store (docs/architecture.md, "Formats").
//
// Key (16 bytes): slide, level, row, column as big-endian uint32, so keys sort by slide, level,
// row, column and a slide's tiles are contiguous.
// Value: a 28-byte little-endian header, then the pixels.
//   0 u8 version (1)   1 u8 encoding (0 raw, 1 JPEG)   2 u8 channels (3: RGB; a multiplex
//   slide's channel count, raw, interleaved)   3 u8 zero
//   4 u16 width   6 u16 height   8 u32 label   12 u32 level-0 x   16 u32 level-0 y
//   20 u32 pixel byte count   24 u32 CRC-32 (zlib) of bytes 0..23 and the pixels
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::data {

struct TileKey {
  uint32_t slide = 0, level = 0, row = 0, column = 0;
  auto operator<=>(const TileKey&) const = default;
};

constexpr size_t tile_key_size = 16;
std::array<uint8_t, tile_key_size> encode_tile_key(const TileKey& key);
// Throws BadInput when `size` is not a key's size.
TileKey decode_tile_key(const void* data, size_t size);
// "slide 2 level 0 row 14 column 37"
std::string describe(const TileKey& key);

enum class TileEncoding : uint8_t { raw = 0, jpeg = 1 };

struct TileHeader {
  uint16_t width = 0, height = 0;
  uint8_t channels = 3;
  TileEncoding encoding = TileEncoding::raw;
  uint32_t label = 0;
  uint32_t x = 0, y = 0;  // level-0 pixels
};

constexpr uint8_t tile_value_version = 1;
// A tile's side as its header holds it (u16), and the most bytes of pixels tessera reads a tile
// into (--size 9000 of RGB; 4096 of 16 channels).
constexpr int max_tile_size = 65535;
constexpr uint64_t max_tile_pixel_bytes = uint64_t{256} << 20;
constexpr size_t tile_header_size = 28;

std::vector<uint8_t> encode_tile_value(const TileHeader& header, const uint8_t* pixels, size_t size);

struct TileValue {
  TileHeader header;
  const uint8_t* pixels = nullptr;
  size_t pixel_bytes = 0;
};

// Parses and verifies a value (version, sizes, checksum); throws BadInput naming `where` when it
// is corrupt.
TileValue parse_tile_value(const void* data, size_t size, const std::string& where);

// Writes the tile as width x height x channels (RGB for 3); throws BadInput naming `where` when it
// is corrupt.
void decode_tile_pixels(const TileValue& value, uint8_t* rgb, const std::string& where);

}  // namespace tessera::data
