#include "data/tissue.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "common/error.h"

namespace tessera::data {

namespace {

constexpr int64_t max_mask_side = 4096;
constexpr int64_t mask_pixels_per_tile = 16;
// Side of the square that closes gaps between tissue fragments (fat, loose stroma), in mask pixels.
constexpr int close_side = 5;
// Holes enclosed by tissue up to this many tiles' area are tissue (fat lobules, lumens, tears).
constexpr double max_hole_tiles = 16;
// A slide whose median mask pixel is darker than this (brightest channel) has a dark background.
constexpr int darkest_bright_field_median = 64;

uint8_t saturation_of(int red, int green, int blue) {
  int high = std::max({red, green, blue}), low = std::min({red, green, blue});
  return high == 0 ? 0 : static_cast<uint8_t>((high - low) * 255 / high);
}

std::vector<uint8_t> median_blur(const std::vector<uint8_t>& image, int width, int height) {
  std::vector<uint8_t> blurred(image.size());
  std::array<uint8_t, 25> window{};
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      size_t n = 0;
      for (int dy = -2; dy <= 2; ++dy)
        for (int dx = -2; dx <= 2; ++dx) {
          int sx = std::clamp(x + dx, 0, width - 1), sy = std::clamp(y + dy, 0, height - 1);
          window[n++] = image[static_cast<size_t>(sy) * width + sx];
        }
      std::nth_element(window.begin(), window.begin() + 12, window.end());
      blurred[static_cast<size_t>(y) * width + x] = window[12];
    }
  return blurred;
}

// Max (dilate) or min (erode) over a close_side square, separably; the window is cut at the
// image's edges, so the edges neither add nor remove tissue.
void filter_square(std::vector<uint8_t>& image, int width, int height, bool dilate) {
  const int radius = close_side / 2;
  std::vector<uint8_t> pass(image.size());
  auto pick = [dilate](uint8_t a, uint8_t b) { return dilate ? std::max(a, b) : std::min(a, b); };
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      uint8_t value = image[static_cast<size_t>(y) * width + x];
      for (int sx = std::max(0, x - radius); sx <= std::min(width - 1, x + radius); ++sx)
        value = pick(value, image[static_cast<size_t>(y) * width + sx]);
      pass[static_cast<size_t>(y) * width + x] = value;
    }
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      uint8_t value = pass[static_cast<size_t>(y) * width + x];
      for (int sy = std::max(0, y - radius); sy <= std::min(height - 1, y + radius); ++sy)
        value = pick(value, pass[static_cast<size_t>(sy) * width + x]);
      image[static_cast<size_t>(y) * width + x] = value;
    }
}

// Glass regions that touch no edge of the image and have at most `max_area` pixels become tissue.
void fill_holes(std::vector<uint8_t>& tissue, int width, int height, size_t max_area) {
  constexpr uint8_t glass = 0, outside = 2, seen = 3;
  std::vector<uint32_t> stack, component;
  auto flood = [&](uint32_t start, uint8_t mark, std::vector<uint32_t>* members) {
    tissue[start] = mark;
    stack.assign(1, start);
    while (!stack.empty()) {
      uint32_t at = stack.back();
      stack.pop_back();
      if (members && members->size() <= max_area) members->push_back(at);
      int x = static_cast<int>(at % static_cast<uint32_t>(width)), y = static_cast<int>(at / static_cast<uint32_t>(width));
      auto visit = [&](int nx, int ny) {
        if (nx < 0 || ny < 0 || nx >= width || ny >= height) return;
        uint32_t next = static_cast<uint32_t>(ny) * static_cast<uint32_t>(width) + static_cast<uint32_t>(nx);
        if (tissue[next] != glass) return;
        tissue[next] = mark;
        stack.push_back(next);
      };
      visit(x - 1, y);
      visit(x + 1, y);
      visit(x, y - 1);
      visit(x, y + 1);
    }
  };
  auto at = [&](int x, int y) { return static_cast<uint32_t>(y) * static_cast<uint32_t>(width) + static_cast<uint32_t>(x); };
  for (int x = 0; x < width; ++x)
    for (int y : {0, height - 1})
      if (tissue[at(x, y)] == glass) flood(at(x, y), outside, nullptr);
  for (int y = 0; y < height; ++y)
    for (int x : {0, width - 1})
      if (tissue[at(x, y)] == glass) flood(at(x, y), outside, nullptr);
  for (uint32_t i = 0; i < tissue.size(); ++i)
    if (tissue[i] == glass) {
      component.clear();
      flood(i, seen, &component);
      if (component.size() <= max_area)
        for (uint32_t member : component) tissue[member] = 1;
    }
  for (uint8_t& value : tissue) value = value == 1;
}

}  // namespace

TissueMask::TissueMask(const Slide& slide, double tile_extent, int threshold) : threshold_(threshold) {
  const auto& levels = slide.levels();
  level_ = 0;
  for (size_t l = 0; l < levels.size(); ++l)
    if (levels[l].downsample * 8 <= tile_extent) level_ = static_cast<int>(l);
  const SlideLevel& level = levels[static_cast<size_t>(level_)];
  int64_t reduction = std::max<int64_t>(
      {1, (std::max(level.width, level.height) + max_mask_side - 1) / max_mask_side,
       static_cast<int64_t>(tile_extent / level.downsample / mask_pixels_per_tile)});
  width_ = static_cast<int>((level.width + reduction - 1) / reduction);
  height_ = static_cast<int>((level.height + reduction - 1) / reduction);
  scale_x_ = static_cast<double>(levels[0].width) / static_cast<double>(level.width) * static_cast<double>(reduction);
  scale_y_ = static_cast<double>(levels[0].height) / static_cast<double>(level.height) * static_cast<double>(reduction);

  // Reads bands of whole mask rows, blocks about 512 level pixels a side, and averages the colour
  // of each mask pixel (as a pyramid level would), so JPEG noise on glass averages out.
  int64_t block = reduction * std::max<int64_t>(1, 512 / reduction);
  int64_t band_rows = block / reduction;
  std::vector<uint32_t> sums(static_cast<size_t>(band_rows * width_) * 4);
  std::vector<uint8_t> rgb(static_cast<size_t>(block * block * 3));
  std::vector<uint8_t> saturation(static_cast<size_t>(width_) * height_);
  std::array<uint64_t, 256> brightness{};
  for (int64_t band_y = 0; band_y < level.height; band_y += block) {
    std::fill(sums.begin(), sums.end(), 0);
    int block_height = static_cast<int>(std::min(block, level.height - band_y));
    for (int64_t block_x = 0; block_x < level.width; block_x += block) {
      int block_width = static_cast<int>(std::min(block, level.width - block_x));
      slide.read_region(level_, block_x, band_y, block_width, block_height, rgb.data());
      for (int y = 0; y < block_height; ++y)
        for (int x = 0; x < block_width; ++x) {
          uint32_t* cell = &sums[(static_cast<size_t>(y / reduction) * width_ + static_cast<size_t>((block_x + x) / reduction)) * 4];
          const uint8_t* pixel = &rgb[(static_cast<size_t>(y) * block_width + x) * 3];
          cell[0] += pixel[0];
          cell[1] += pixel[1];
          cell[2] += pixel[2];
          ++cell[3];
        }
    }
    int64_t first_row = band_y / reduction, rows = std::min<int64_t>(band_rows, height_ - first_row);
    for (int64_t row = 0; row < rows; ++row)
      for (int column = 0; column < width_; ++column) {
        const uint32_t* cell = &sums[(static_cast<size_t>(row) * width_ + column) * 4];
        int count = static_cast<int>(std::max<uint32_t>(1, cell[3]));
        int red = static_cast<int>(cell[0]) / count, green = static_cast<int>(cell[1]) / count,
            blue = static_cast<int>(cell[2]) / count;
        saturation[static_cast<size_t>(first_row + row) * width_ + column] = saturation_of(red, green, blue);
        ++brightness[static_cast<size_t>(std::max({red, green, blue}))];
      }
  }
  uint64_t below = 0, median = 0;
  while (median < 255 && (below += brightness[median]) * 2 < saturation.size()) ++median;
  if (median < darkest_bright_field_median)
    throw BadInput(slide.path() + ": most of the slide is dark (median brightness " + std::to_string(median) +
                   " of 255): a fluorescence image? Tissue detection works on bright-field slides (stained tissue "
                   "on bright glass)");

  tissue_ = median_blur(saturation, width_, height_);
  for (uint8_t& value : tissue_) value = value >= threshold_;
  filter_square(tissue_, width_, height_, true);
  filter_square(tissue_, width_, height_, false);
  double tile_area = (tile_extent / scale_x_) * (tile_extent / scale_y_);
  fill_holes(tissue_, width_, height_, static_cast<size_t>(max_hole_tiles * tile_area));
}

double TissueMask::tissue_fraction(double x0, double y0, double x1, double y1) const {
  // Mask pixels whose centres fall inside the rectangle; at least the one under its centre.
  auto first = [](double edge, double scale) { return static_cast<int>(std::ceil(edge / scale - 0.5)); };
  int column0 = std::max(0, first(x0, scale_x_)), column1 = std::min(width_, first(x1, scale_x_));
  int row0 = std::max(0, first(y0, scale_y_)), row1 = std::min(height_, first(y1, scale_y_));
  if (column0 >= column1 || row0 >= row1) {
    int column = std::clamp(static_cast<int>((x0 + x1) / 2 / scale_x_), 0, width_ - 1);
    int row = std::clamp(static_cast<int>((y0 + y1) / 2 / scale_y_), 0, height_ - 1);
    return tissue_[static_cast<size_t>(row) * width_ + column];
  }
  size_t tissue = 0;
  for (int row = row0; row < row1; ++row)
    for (int column = column0; column < column1; ++column) tissue += tissue_[static_cast<size_t>(row) * width_ + column];
  return static_cast<double>(tissue) / (static_cast<double>(column1 - column0) * (row1 - row0));
}

}  // namespace tessera::data
