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
// A slide whose median mask pixel is darker than this (brightest channel) has a dark background:
// fluorescence when the stain is chosen automatically.
constexpr int darkest_bright_field_median = 64;

uint8_t saturation_of(int red, int green, int blue) {
  int high = std::max({red, green, blue}), low = std::min({red, green, blue});
  return high == 0 ? 0 : static_cast<uint8_t>((high - low) * 255 / high);
}

template <typename Value>
std::vector<Value> median_blur(const std::vector<Value>& image, int width, int height) {
  std::vector<Value> blurred(image.size());
  std::array<Value, 25> window{};
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

const char* stain_name(Stain stain) {
  switch (stain) {
    case Stain::automatic: return "automatic";
    case Stain::brightfield: return "brightfield";
    case Stain::fluorescence: return "fluorescence";
    case Stain::none: return "none";
  }
  return "?";
}

Stain parse_stain(const std::string& text) {
  for (Stain stain : {Stain::automatic, Stain::brightfield, Stain::fluorescence, Stain::none})
    if (text == stain_name(stain)) return stain;
  throw UsageError("--tissue: automatic, brightfield, fluorescence or none, not '" + text + "'");
}

void check_stain_fits(Stain stain, const Slide& slide) {
  if (stain == Stain::brightfield && !slide.rgb())
    throw UsageError("--tissue brightfield: " + slide.path() + " has " + std::to_string(slide.channels()) +
                     " channels, not RGB (saturation needs colour): use --tissue fluorescence or none");
}

TissueMask::TissueMask(const Slide& slide, double tile_extent, int threshold, Stain stain)
    : threshold_(threshold), channels_(slide.channels()), rgb_(slide.rgb()) {
  if (stain == Stain::none) throw UsageError("--tissue none: every tile is kept, there is no mask to make");
  check_stain_fits(stain, slide);
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
  tile_area_ = (tile_extent / scale_x_) * (tile_extent / scale_y_);

  // Reads bands of whole mask rows, blocks about 512 level pixels a side, and averages each
  // channel over each mask pixel (as a pyramid level would), so JPEG noise on glass averages out.
  // Kept per mask pixel: the saturation of its mean colour and the sum of its channels' means.
  const auto channels = static_cast<size_t>(channels_);
  int64_t block = reduction * std::max<int64_t>(1, 512 / reduction);
  int64_t band_rows = block / reduction;
  std::vector<uint32_t> sums(static_cast<size_t>(band_rows * width_) * (channels + 1));
  std::vector<uint8_t> pixels(static_cast<size_t>(block * block) * channels);
  std::vector<uint8_t> saturation(static_cast<size_t>(width_) * height_);
  std::vector<uint16_t> signal(saturation.size());
  std::array<uint64_t, 256> brightness{};
  std::vector<uint32_t> mean(channels);
  for (int64_t band_y = 0; band_y < level.height; band_y += block) {
    std::fill(sums.begin(), sums.end(), 0);
    int block_height = static_cast<int>(std::min(block, level.height - band_y));
    for (int64_t block_x = 0; block_x < level.width; block_x += block) {
      int block_width = static_cast<int>(std::min(block, level.width - block_x));
      slide.read_region(level_, block_x, band_y, block_width, block_height, pixels.data());
      for (int y = 0; y < block_height; ++y)
        for (int x = 0; x < block_width; ++x) {
          uint32_t* cell =
              &sums[(static_cast<size_t>(y / reduction) * width_ + static_cast<size_t>((block_x + x) / reduction)) *
                    (channels + 1)];
          const uint8_t* pixel = &pixels[(static_cast<size_t>(y) * block_width + x) * channels];
          for (size_t c = 0; c < channels; ++c) cell[c] += pixel[c];
          ++cell[channels];
        }
    }
    int64_t first_row = band_y / reduction, rows = std::min<int64_t>(band_rows, height_ - first_row);
    for (int64_t row = 0; row < rows; ++row)
      for (int column = 0; column < width_; ++column) {
        const uint32_t* cell = &sums[(static_cast<size_t>(row) * width_ + column) * (channels + 1)];
        uint32_t count = std::max<uint32_t>(1, cell[channels]), sum = 0;
        for (size_t c = 0; c < channels; ++c) sum += mean[c] = cell[c] / count;
        size_t at = static_cast<size_t>(first_row + row) * width_ + column;
        if (rgb_)
          saturation[at] =
              saturation_of(static_cast<int>(mean[0]), static_cast<int>(mean[1]), static_cast<int>(mean[2]));
        signal[at] = static_cast<uint16_t>(sum);
        ++brightness[*std::max_element(mean.begin(), mean.end())];
      }
  }
  uint64_t below = 0, median = 0;
  while (median < 255 && (below += brightness[median]) * 2 < static_cast<uint64_t>(width_) * height_) ++median;
  // A dark background is fluorescence; so is a slide of channels that are not a colour image.
  bool dark = median < darkest_bright_field_median || !rgb_;
  stain_ = stain == Stain::automatic ? (dark ? Stain::fluorescence : Stain::brightfield) : stain;
  report_ = {{"stain", stain_name(stain_)},
             {"chosen", stain == Stain::automatic ? "automatic" : "given"},
             {"median_brightness", median}};
  if (stain_ == Stain::brightfield)
    detect_brightfield(saturation);
  else
    detect_fluorescence(signal);
  filter_square(tissue_, width_, height_, true);
  filter_square(tissue_, width_, height_, false);
  fill_holes(tissue_, width_, height_, static_cast<size_t>(max_hole_tiles * tile_area_));
}

void TissueMask::detect_brightfield(const std::vector<uint8_t>& saturation) {
  tissue_ = median_blur(saturation, width_, height_);
  for (uint8_t& value : tissue_) value = value >= threshold_;
}

// Tissue shines above the background: the background's level is the commonest signal among the
// darker half of the mask (zero, where a scanner wrote no data, left out), and tissue is what
// lies `threshold` above it.
void TissueMask::detect_fluorescence(const std::vector<uint16_t>& raw_signal) {
  std::vector<uint16_t> signal = median_blur(raw_signal, width_, height_);
  std::vector<uint64_t> histogram(size_t{255} * static_cast<size_t>(channels_) + 1);
  uint64_t counted = 0;
  for (uint16_t value : signal)
    if (value > 0) {
      ++histogram[value];
      ++counted;
    }
  uint64_t below = 0;
  size_t median = 0;
  while (median + 1 < histogram.size() && (below += histogram[median]) * 2 < counted) ++median;
  // The mode over a window of 5, so that the noise of one level does not decide it.
  size_t background = 0;
  uint64_t best = 0;
  for (size_t value = 1; value <= median; ++value) {
    uint64_t around = 0;
    for (size_t v = value > 2 ? value - 2 : 0; v <= std::min(value + 2, histogram.size() - 1); ++v) around += histogram[v];
    if (around > best) {
      best = around;
      background = value;
    }
  }
  auto from = static_cast<uint32_t>(background) + static_cast<uint32_t>(threshold_);
  tissue_.resize(signal.size());
  for (size_t i = 0; i < signal.size(); ++i) tissue_[i] = signal[i] >= from;
  report_["background"] = background;
  report_["signal_threshold"] = from;
}

double TissueMask::tissue_fraction(double x0, double y0, double x1, double y1) const {
  // Mask pixels whose centres fall inside the rectangle; at least the one under its centre. Clamped
  // as doubles: a rectangle far past the mask never converts to an int out of range.
  auto first = [](double edge, double scale, int size) {
    return static_cast<int>(std::clamp(std::ceil(edge / scale - 0.5), 0.0, static_cast<double>(size)));
  };
  int column0 = first(x0, scale_x_, width_), column1 = first(x1, scale_x_, width_);
  int row0 = first(y0, scale_y_, height_), row1 = first(y1, scale_y_, height_);
  if (column0 >= column1 || row0 >= row1) {
    auto at = [](double centre, double scale, int size) {
      return static_cast<int>(std::clamp(std::floor(centre / scale), 0.0, static_cast<double>(size - 1)));
    };
    int column = at((x0 + x1) / 2, scale_x_, width_), row = at((y0 + y1) / 2, scale_y_, height_);
    return tissue_[static_cast<size_t>(row) * width_ + column];
  }
  size_t tissue = 0;
  for (int row = row0; row < row1; ++row)
    for (int column = column0; column < column1; ++column) tissue += tissue_[static_cast<size_t>(row) * width_ + column];
  return static_cast<double>(tissue) / (static_cast<double>(column1 - column0) * (row1 - row0));
}

}  // namespace tessera::data
