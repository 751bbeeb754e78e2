#include "tools/heatmap_image.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

#include "tools/bitmap_font.h"

namespace tessera::cli {

namespace {

// Viridis (matplotlib) at nine even steps: perceptually uniform and readable in grey.
constexpr std::array<std::array<float, 3>, 9> kViridis{{{68, 1, 84},
                                                        {71, 44, 122},
                                                        {59, 81, 139},
                                                        {44, 113, 142},
                                                        {33, 144, 141},
                                                        {39, 173, 129},
                                                        {92, 200, 99},
                                                        {170, 220, 50},
                                                        {253, 231, 37}}};

std::array<float, 3> viridis(float position) {
  float at = std::clamp(position, 0.0f, 1.0f) * static_cast<float>(kViridis.size() - 1);
  auto low = std::min(static_cast<size_t>(at), kViridis.size() - 2);
  float t = at - static_cast<float>(low);
  std::array<float, 3> colour;
  for (size_t c = 0; c < 3; ++c) colour[c] = kViridis[low][c] + t * (kViridis[low + 1][c] - kViridis[low][c]);
  return colour;
}

float position_on(const ScoreScale& scale, float score) {
  float range = scale.high - scale.low;
  return range > 0 ? (score - scale.low) / range : 0.0f;
}

std::string number(double value, int decimals) {
  std::array<char, 32> text{};
  std::snprintf(text.data(), text.size(), "%.*f", decimals, value);
  return text.data();
}

}  // namespace

int thumbnail_level(const data::Slide& slide, int max_size) {
  const auto& levels = slide.levels();
  int best = 0;
  auto distance = [&](size_t level) {
    return std::abs(static_cast<double>(std::max(levels[level].width, levels[level].height)) - max_size);
  };
  for (size_t level = 1; level < levels.size(); ++level)
    if (distance(level) < distance(static_cast<size_t>(best))) best = static_cast<int>(level);
  return best;
}

Image read_thumbnail(const data::Slide& slide, int level, int max_size) {
  const auto& source_level = slide.levels()[static_cast<size_t>(level)];
  const int64_t source_width = source_level.width, source_height = source_level.height;
  const auto channels = static_cast<size_t>(slide.channels());
  double scale = std::min(1.0, max_size / static_cast<double>(std::max(source_width, source_height)));
  Image image{std::max(1, static_cast<int>(std::lround(static_cast<double>(source_width) * scale))),
              std::max(1, static_cast<int>(std::lround(static_cast<double>(source_height) * scale))), {}};
  image.rgb.resize(static_cast<size_t>(image.width) * static_cast<size_t>(image.height) * 3);
  // The source pixels under thumbnail pixel `index`: consecutive spans that cover the source.
  auto span = [](int64_t index, int64_t from, int64_t to) {
    int64_t first = index * from / to, last = std::max(first + 1, (index + 1) * from / to);
    return std::pair{first, std::min(last, from)};
  };
  // The level is read in blocks of at most 16 MiB, whatever its size (a slide with no small level).
  const auto block_side = static_cast<int64_t>(std::max(64.0, std::sqrt((16 << 20) / static_cast<double>(channels))));
  std::vector<uint8_t> block(static_cast<size_t>(block_side * block_side) * channels);
  std::vector<uint64_t> sums(static_cast<size_t>(image.width) * 3);
  // One channel is grey; two are red and green; more give their first three.
  auto channel_of = [&](size_t c) { return std::min(c, channels - 1); };
  for (int y = 0; y < image.height; ++y) {
    auto [y0, y1] = span(y, source_height, image.height);
    std::fill(sums.begin(), sums.end(), 0);
    for (int64_t band = y0; band < y1; band += block_side) {
      const auto rows = static_cast<int>(std::min(block_side, y1 - band));
      for (int64_t left = 0; left < source_width; left += block_side) {
        const auto columns = static_cast<int>(std::min(block_side, source_width - left));
        slide.read_region(level, left, band, columns, rows, block.data());
        int64_t x = std::min<int64_t>(image.width - 1, left * image.width / source_width);
        while (x > 0 && span(x, source_width, image.width).first > left) --x;
        for (int64_t sx = left; sx < left + columns; ++sx) {
          while (span(x, source_width, image.width).second <= sx) ++x;
          for (int row = 0; row < rows; ++row) {
            const uint8_t* pixel = &block[(static_cast<size_t>(row) * static_cast<size_t>(columns) +
                                           static_cast<size_t>(sx - left)) * channels];
            for (size_t c = 0; c < 3; ++c)
              sums[static_cast<size_t>(x) * 3 + c] += channels == 2 && c == 2 ? 0 : pixel[channel_of(c)];
          }
        }
      }
    }
    for (int x = 0; x < image.width; ++x) {
      auto [x0, x1] = span(x, source_width, image.width);
      auto count = static_cast<uint64_t>((y1 - y0) * (x1 - x0));
      for (size_t c = 0; c < 3; ++c)
        image.rgb[(static_cast<size_t>(y) * static_cast<size_t>(image.width) + static_cast<size_t>(x)) * 3 + c] =
            static_cast<uint8_t>((sums[static_cast<size_t>(x) * 3 + c] + count / 2) / count);
    }
  }
  return image;
}

void paint_scores(Image& image, const FeatureFileTiles& tiles, const std::vector<float>& scores,
                  const data::SlideLevel& base, double alpha, const ScoreScale& scale) {
  double scale_x = image.width / static_cast<double>(base.width);
  double scale_y = image.height / static_cast<double>(base.height);
  std::vector<float> pixel_scores(static_cast<size_t>(image.width) * static_cast<size_t>(image.height), -1.0f);
  for (size_t n = 0; n < scores.size(); ++n) {
    auto x = static_cast<double>(tiles.coords[2 * n]), y = static_cast<double>(tiles.coords[2 * n + 1]);
    int x0 = static_cast<int>(std::floor(x * scale_x)), y0 = static_cast<int>(std::floor(y * scale_y));
    int x1 = std::min(image.width, std::max(x0 + 1, static_cast<int>(std::ceil((x + tiles.extent()) * scale_x))));
    int y1 = std::min(image.height, std::max(y0 + 1, static_cast<int>(std::ceil((y + tiles.extent()) * scale_y))));
    float position = std::clamp(position_on(scale, scores[n]), 0.0f, 1.0f);
    for (int py = y0; py < y1; ++py)
      for (int px = x0; px < x1; ++px) {
        float& pixel = pixel_scores[static_cast<size_t>(py) * static_cast<size_t>(image.width) + static_cast<size_t>(px)];
        pixel = std::max(pixel, position);
      }
  }
  for (size_t p = 0; p < pixel_scores.size(); ++p) {
    if (pixel_scores[p] < 0) continue;
    auto colour = viridis(pixel_scores[p]);
    for (size_t c = 0; c < 3; ++c) {
      double blended = (1 - alpha) * image.rgb[p * 3 + c] + alpha * colour[c];
      image.rgb[p * 3 + c] = static_cast<uint8_t>(std::lround(std::clamp(blended, 0.0, 255.0)));
    }
  }
}

int add_legend(Image& image, const std::string& score_name, const ScoreScale& scale) {
  const int s = image.width >= 600 ? 2 : 1, margin = 4 * s, bar = 12 * s, tick = 3 * s, glyph = 7 * s;
  std::string title = score_name + ", " + kColourMap + ", " + (scale.fixed ? "fixed scale" : "stretched to this slide");
  int width = std::max(image.width, text_width(title, s) + 2 * margin);
  int band = margin + glyph + margin + bar + tick + s + glyph + margin;
  int height = image.height + band;
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * static_cast<size_t>(height) * 3, 255);
  for (int y = 0; y < image.height; ++y)
    std::copy_n(&image.rgb[static_cast<size_t>(y) * static_cast<size_t>(image.width) * 3],
                static_cast<size_t>(image.width) * 3, &rgb[static_cast<size_t>(y) * static_cast<size_t>(width) * 3]);
  auto pixel = [&](int x, int y) { return &rgb[(static_cast<size_t>(y) * static_cast<size_t>(width) + static_cast<size_t>(x)) * 3]; };
  const uint8_t ink[3] = {0, 0, 0};
  int top = image.height + margin;
  draw_text(rgb, width, height, margin, top, title, s, ink);
  // The bar runs from the scale's low end at its first column to the high end at its last.
  int bar_top = top + glyph + margin, left = margin, right = width - margin - 1;
  for (int x = left; x <= right; ++x) {
    auto colour = viridis(static_cast<float>(x - left) / static_cast<float>(std::max(1, right - left)));
    for (int y = bar_top; y < bar_top + bar; ++y)
      for (size_t c = 0; c < 3; ++c) pixel(x, y)[c] = static_cast<uint8_t>(std::lround(colour[c]));
  }
  int ticks = scale.fixed ? 5 : 3, decimals = scale.fixed ? 2 : 3;
  for (int i = 0; i < ticks; ++i) {
    double fraction = static_cast<double>(i) / (ticks - 1);
    int x = left + static_cast<int>(std::lround(fraction * (right - left)));
    for (int y = bar_top + bar; y < bar_top + bar + tick; ++y)
      for (int dx = 0; dx < s; ++dx) std::fill_n(pixel(std::min(x + dx, right), y), 3, 0);
    std::string label = number(scale.low + fraction * (scale.high - scale.low), decimals);
    if (scale.fixed) label = fraction == 0 ? "0" : fraction == 1 ? "1" : label;
    int label_x = std::clamp(x - text_width(label, s) / 2, margin, width - margin - text_width(label, s));
    draw_text(rgb, width, height, label_x, bar_top + bar + tick + s, label, s, ink);
  }
  image = {width, height, std::move(rgb)};
  return band;
}

}  // namespace tessera::cli
