#include "data/tissue.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace tessera::data {

namespace {

// A saturation below this is background or glass whatever Otsu says (a slide of all tissue or
// all glass has no two classes to split).
constexpr int minimum_threshold = 20;
constexpr int64_t max_mask_side = 4096;

uint8_t saturation_of(const uint8_t* rgb) {
  int high = std::max({rgb[0], rgb[1], rgb[2]}), low = std::min({rgb[0], rgb[1], rgb[2]});
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

}  // namespace

int otsu_threshold(const std::vector<uint64_t>& histogram) {
  double total = 0, weighted_total = 0;
  for (size_t value = 0; value < histogram.size(); ++value) {
    total += static_cast<double>(histogram[value]);
    weighted_total += static_cast<double>(value) * static_cast<double>(histogram[value]);
  }
  double below = 0, weighted_below = 0, best_variance = -1;
  int best = 0;
  for (size_t value = 1; value < histogram.size(); ++value) {
    below += static_cast<double>(histogram[value - 1]);
    weighted_below += static_cast<double>(value - 1) * static_cast<double>(histogram[value - 1]);
    double above = total - below;
    if (below == 0 || above == 0) continue;
    double mean_below = weighted_below / below, mean_above = (weighted_total - weighted_below) / above;
    double variance = below * above * (mean_below - mean_above) * (mean_below - mean_above);
    if (variance > best_variance) {
      best_variance = variance;
      best = static_cast<int>(value);
    }
  }
  return best;
}

TissueMask::TissueMask(const Slide& slide, double tile_extent, std::optional<int> fixed_threshold) {
  const auto& levels = slide.levels();
  level_ = 0;
  for (size_t l = 0; l < levels.size(); ++l)
    if (levels[l].downsample * 8 <= tile_extent) level_ = static_cast<int>(l);
  const SlideLevel& level = levels[static_cast<size_t>(level_)];
  int64_t reduction = std::max<int64_t>(1, (std::max(level.width, level.height) + max_mask_side - 1) / max_mask_side);
  width_ = static_cast<int>((level.width + reduction - 1) / reduction);
  height_ = static_cast<int>((level.height + reduction - 1) / reduction);
  scale_x_ = static_cast<double>(levels[0].width) / static_cast<double>(level.width) * static_cast<double>(reduction);
  scale_y_ = static_cast<double>(levels[0].height) / static_cast<double>(level.height) * static_cast<double>(reduction);

  // Reads blocks of whole mask pixels, about 512 level pixels a side, and averages saturation.
  std::vector<uint32_t> sums(static_cast<size_t>(width_) * height_, 0), counts(sums.size(), 0);
  int64_t block = reduction * std::max<int64_t>(1, 512 / reduction);
  std::vector<uint8_t> rgb(static_cast<size_t>(block * block * 3));
  for (int64_t block_y = 0; block_y < level.height; block_y += block)
    for (int64_t block_x = 0; block_x < level.width; block_x += block) {
      int block_width = static_cast<int>(std::min(block, level.width - block_x));
      int block_height = static_cast<int>(std::min(block, level.height - block_y));
      slide.read_region(level_, block_x, block_y, block_width, block_height, rgb.data());
      for (int y = 0; y < block_height; ++y)
        for (int x = 0; x < block_width; ++x) {
          size_t cell =
              static_cast<size_t>((block_y + y) / reduction) * width_ + static_cast<size_t>((block_x + x) / reduction);
          sums[cell] += saturation_of(&rgb[(static_cast<size_t>(y) * block_width + x) * 3]);
          ++counts[cell];
        }
    }
  std::vector<uint8_t> saturation(sums.size());
  for (size_t i = 0; i < sums.size(); ++i) saturation[i] = static_cast<uint8_t>(counts[i] ? sums[i] / counts[i] : 0);
  saturation_ = median_blur(saturation, width_, height_);
  std::vector<uint64_t> histogram(256, 0);
  for (uint8_t value : saturation_) ++histogram[value];
  threshold_ = fixed_threshold ? *fixed_threshold : std::max(minimum_threshold, otsu_threshold(histogram));
}

double TissueMask::tissue_fraction(double x0, double y0, double x1, double y1) const {
  // Mask pixels whose centres fall inside the rectangle; at least the one under its centre.
  auto first = [](double edge, double scale) { return static_cast<int>(std::ceil(edge / scale - 0.5)); };
  int column0 = std::max(0, first(x0, scale_x_)), column1 = std::min(width_, first(x1, scale_x_));
  int row0 = std::max(0, first(y0, scale_y_)), row1 = std::min(height_, first(y1, scale_y_));
  if (column0 >= column1 || row0 >= row1) {
    int column = std::clamp(static_cast<int>((x0 + x1) / 2 / scale_x_), 0, width_ - 1);
    int row = std::clamp(static_cast<int>((y0 + y1) / 2 / scale_y_), 0, height_ - 1);
    return saturation_[static_cast<size_t>(row) * width_ + column] >= threshold_ ? 1.0 : 0.0;
  }
  size_t tissue = 0;
  for (int row = row0; row < row1; ++row)
    for (int column = column0; column < column1; ++column)
      tissue += saturation_[static_cast<size_t>(row) * width_ + column] >= threshold_;
  return static_cast<double>(tissue) / (static_cast<double>(column1 - column0) * (row1 - row0));
}

}  // namespace tessera::data
