// Parts the slide readers share (internal to data/): a bounded cache of decoded tiles, tile
// names for messages, copying a tile into a region, and the readers' constructors.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/slide.h"

namespace tessera::data {

// The largest tile (or DICOM frame) side tessera decodes: 4096x4096 RGB is 48 MiB. A file that
// declares more is refused before anything that large is allocated.
constexpr uint32_t max_tile_side = 4096;

// Walks every directory of a TIFF and checks what it declares against the bytes the file holds:
// a directory chain that ends (not cut short), every tile and strip inside the file, tile sides
// within max_tile_side, a full-resolution level with some tile data. Throws BadInput naming the
// file (a truncated file names the first piece past its end).
void check_tiff_structure(const std::string& path);

// Throws BadInput naming the file unless every level is level 0 reduced by one factor (each
// side rounded within a pixel): a corrupt width or height makes the levels disagree.
void check_levels_nest(const std::string& path, const std::vector<SlideLevel>& levels);

// Throws BadInput naming the slide and the field unless what its reader reports is usable: at least
// one level, each 1 to 2^31 pixels a side with tiles of 1 to 65535 and a finite downsample of at
// least 1, microns per pixel finite and >= 0 (0: not given), 1 to 255 channels.
void check_slide_declares(const Slide& slide);

// Opens the slide with OpenSlide in a child process and reads a little of every level; throws
// BadInput naming the file when OpenSlide refuses it or crashes (a signal ends the child only).
void probe_openslide(const std::string& path);

// Decoded tiles, least recently used first out, bounded in bytes. A tile is known by its level,
// channel (0 for RGB), row and column, each whole: no two tiles share a key, whatever their numbers.
class TileCache {
 public:
  struct Key {
    uint32_t level = 0, channel = 0;
    int64_t row = 0, column = 0;
    bool operator==(const Key&) const = default;
  };
  explicit TileCache(uint64_t capacity) : capacity_(capacity) {}
  using Pixels = std::shared_ptr<const std::vector<uint8_t>>;

  Pixels find(const Key& key) {
    std::lock_guard lock(mutex_);
    auto found = index_.find(key);
    if (found == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, found->second);
    return found->second->second;
  }

  void insert(const Key& key, Pixels pixels) {
    std::lock_guard lock(mutex_);
    if (index_.count(key) || pixels->size() > capacity_) return;
    order_.emplace_front(key, pixels);
    index_[key] = order_.begin();
    bytes_ += pixels->size();
    while (bytes_ > capacity_) {
      bytes_ -= order_.back().second->size();
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }

 private:
  struct Hash {
    size_t operator()(const Key& key) const {
      uint64_t h = (uint64_t{key.level} << 32 | key.channel) * 0x9E3779B97F4A7C15ull;
      h ^= static_cast<uint64_t>(key.row) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
      h ^= static_cast<uint64_t>(key.column) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
      return static_cast<size_t>(h);
    }
  };
  uint64_t capacity_, bytes_ = 0;
  std::mutex mutex_;
  std::list<std::pair<Key, Pixels>> order_;
  std::unordered_map<Key, std::list<std::pair<Key, Pixels>>::iterator, Hash> index_;
};

inline std::string tile_name(int level, int64_t column, int64_t row) {
  return "level " + std::to_string(level) + " tile column " + std::to_string(column) + " row " + std::to_string(row);
}

// Copies the part of a tile (origin tile_x, tile_y in level pixels) that overlaps the region.
inline void copy_overlap(const uint8_t* tile, int64_t tile_x, int64_t tile_y, int tile_width, int tile_height,
                  int64_t region_x, int64_t region_y, int region_width, int region_height, uint8_t* region) {
  int64_t x0 = std::max(tile_x, region_x), x1 = std::min(tile_x + tile_width, region_x + region_width);
  int64_t y0 = std::max(tile_y, region_y), y1 = std::min(tile_y + tile_height, region_y + region_height);
  if (x0 >= x1 || y0 >= y1) return;
  size_t bytes = static_cast<size_t>(x1 - x0) * 3;
  for (int64_t y = y0; y < y1; ++y)
    std::memcpy(region + ((y - region_y) * region_width + (x0 - region_x)) * 3,
                tile + ((y - tile_y) * tile_width + (x0 - tile_x)) * 3, bytes);
}

// Whitens the part of a tile's square (origin tile_x, tile_y in level pixels) that overlaps the
// region: a tile the file leaves out.
inline void whiten_overlap(int64_t tile_x, int64_t tile_y, int tile_width, int tile_height, int64_t region_x,
                           int64_t region_y, int region_width, int region_height, uint8_t* region) {
  int64_t x0 = std::max(tile_x, region_x), x1 = std::min(tile_x + tile_width, region_x + region_width);
  int64_t y0 = std::max(tile_y, region_y), y1 = std::min(tile_y + tile_height, region_y + region_height);
  if (x0 >= x1 || y0 >= y1) return;
  for (int64_t y = y0; y < y1; ++y)
    std::memset(region + ((y - region_y) * region_width + (x0 - region_x)) * 3, 255, static_cast<size_t>(x1 - x0) * 3);
}

// A single-level image through libvips (stripped TIFF, OME-TIFF, PNG, JPEG ...), flattened on
// white and converted to 8-bit sRGB. Throws BadInput naming the file and libvips' error.
std::unique_ptr<Slide> open_vips_slide(const std::string& path);

// True when libvips has a loader for the file.
bool vips_can_read(const std::string& path);

// A multiplex TIFF whose channels are grey planes (OME-TIFF, QPTIFF) as a slide of those
// channels (slide_planes.cpp); nullptr when `path` is not one (an RGB or single-channel TIFF).
// Throws BadInput naming what the file holds when it is a kind tessera does not read: a z-stack,
// a time series, signed, floating-point or wider than 16-bit samples, planes in other files.
// Channels of 16-bit samples read as 8 bits through a window per channel (Slide::intensity_windows).
// `window`, where given, replaces every 16-bit channel's own.
std::unique_ptr<Slide> open_plane_slide(const std::string& path, uint64_t tile_cache_bytes,
                                        std::optional<IntensityWindow> window);

// A DICOM VL Whole Slide Microscopy series (TILED_FULL): `path` is one of its files; the other
// levels are the files of the same series in its directory. Throws BadInput naming the file.
std::unique_ptr<Slide> open_dicom_slide(const std::string& path);

// True when the file has DICOM's "DICM" preamble.
bool has_dicom_signature(const std::string& path);

}  // namespace tessera::data
