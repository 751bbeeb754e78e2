#include "data/tile_format.h"

#include <zlib.h>

#include <cstring>

#include "common/checked.h"
#include "common/error.h"
#include "data/jpeg.h"

namespace tessera::data {

namespace {

void put_big_endian(uint8_t* out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(value >> (24 - 8 * i));
}

uint32_t get_big_endian(const uint8_t* in) {
  return uint32_t{in[0]} << 24 | uint32_t{in[1]} << 16 | uint32_t{in[2]} << 8 | uint32_t{in[3]};
}

template <class T>
void put_little_endian(uint8_t* out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

template <class T>
T get_little_endian(const uint8_t* in) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value = static_cast<T>(value | T(in[i]) << (8 * i));
  return value;
}

uint32_t checksum(const uint8_t* header, const uint8_t* pixels, size_t size) {
  uLong crc = crc32(0L, header, 24);
  crc = crc32_z(crc, pixels, size);
  return static_cast<uint32_t>(crc);
}

}  // namespace

std::array<uint8_t, tile_key_size> encode_tile_key(const TileKey& key) {
  std::array<uint8_t, tile_key_size> bytes{};
  put_big_endian(bytes.data(), key.slide);
  put_big_endian(bytes.data() + 4, key.level);
  put_big_endian(bytes.data() + 8, key.row);
  put_big_endian(bytes.data() + 12, key.column);
  return bytes;
}

TileKey decode_tile_key(const void* data, size_t size) {
  if (size != tile_key_size)
    throw BadInput("a tile key has " + std::to_string(size) + " bytes, expected " + std::to_string(tile_key_size));
  auto* bytes = static_cast<const uint8_t*>(data);
  return {get_big_endian(bytes), get_big_endian(bytes + 4), get_big_endian(bytes + 8), get_big_endian(bytes + 12)};
}

std::string describe(const TileKey& key) {
  return "slide " + std::to_string(key.slide) + " level " + std::to_string(key.level) + " row " +
         std::to_string(key.row) + " column " + std::to_string(key.column);
}

std::vector<uint8_t> encode_tile_value(const TileHeader& header, const uint8_t* pixels, size_t size) {
  std::vector<uint8_t> value(tile_header_size + size);
  uint8_t* out = value.data();
  out[0] = tile_value_version;
  out[1] = static_cast<uint8_t>(header.encoding);
  out[2] = header.channels;
  out[3] = 0;
  put_little_endian(out + 4, header.width);
  put_little_endian(out + 6, header.height);
  put_little_endian(out + 8, header.label);
  put_little_endian(out + 12, header.x);
  put_little_endian(out + 16, header.y);
  put_little_endian(out + 20, narrow<uint32_t>(size, Field("a tile value", "pixel byte count")));
  if (size) std::memcpy(out + tile_header_size, pixels, size);
  put_little_endian(out + 24, checksum(out, out + tile_header_size, size));
  return value;
}

TileValue parse_tile_value(const void* data, size_t size, const std::string& where) {
  auto* in = static_cast<const uint8_t*>(data);
  if (size < tile_header_size)
    throw BadInput(where + ": value of " + std::to_string(size) + " bytes is shorter than a tile header");
  if (in[0] != tile_value_version)
    throw BadInput(where + ": tile value version " + std::to_string(in[0]) + " (this build reads " +
                   std::to_string(tile_value_version) + ")");
  TileValue value;
  value.header.encoding = static_cast<TileEncoding>(in[1]);
  value.header.channels = in[2];
  value.header.width = get_little_endian<uint16_t>(in + 4);
  value.header.height = get_little_endian<uint16_t>(in + 6);
  value.header.label = get_little_endian<uint32_t>(in + 8);
  value.header.x = get_little_endian<uint32_t>(in + 12);
  value.header.y = get_little_endian<uint32_t>(in + 16);
  value.pixels = in + tile_header_size;
  value.pixel_bytes = get_little_endian<uint32_t>(in + 20);
  if (value.pixel_bytes != size - tile_header_size)
    throw BadInput(where + ": header says " + std::to_string(value.pixel_bytes) + " pixel bytes, value holds " +
                   std::to_string(size - tile_header_size));
  if (get_little_endian<uint32_t>(in + 24) != checksum(in, value.pixels, value.pixel_bytes))
    throw BadInput(where + ": checksum mismatch (the value is corrupt)");
  if (value.header.channels == 0 || value.header.encoding > TileEncoding::jpeg ||
      (value.header.encoding == TileEncoding::jpeg && value.header.channels != 3))
    throw BadInput(where + ": unsupported tile (channels " + std::to_string(value.header.channels) + ", encoding " +
                   std::to_string(in[1]) + ")");
  return value;
}

void decode_tile_pixels(const TileValue& value, uint8_t* rgb, const std::string& where) {
  const TileHeader& header = value.header;
  size_t expected = size_t{header.width} * header.height * header.channels;
  if (header.encoding == TileEncoding::raw) {
    if (value.pixel_bytes != expected)
      throw BadInput(where + ": raw tile has " + std::to_string(value.pixel_bytes) + " bytes, expected " +
                     std::to_string(expected));
    std::memcpy(rgb, value.pixels, expected);
    return;
  }
  if (auto problem = decode_jpeg(value.pixels, value.pixel_bytes, header.width, header.height, rgb); !problem.empty())
    throw BadInput(where + ": " + problem);
}

}  // namespace tessera::data
