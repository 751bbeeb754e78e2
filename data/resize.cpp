#include "data/resize.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tessera::data {

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // Pillow's: room for 8-bit values times weights, and a sign

// The taps of one output pixel along one axis: the first input pixel and fixed-point weights.
struct Taps {
  int first = 0;
  std::vector<int32_t> weights;
};

// The box filter stretched over the footprint of each output pixel (its width in input pixels is
// the scale when shrinking, one when enlarging), sampled at the input pixels' centres.
std::vector<Taps> box_taps(int in_size, int out_size) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = 0.5 * filter_scale, inverse = 1.0 / filter_scale;
  std::vector<Taps> taps(static_cast<size_t>(out_size));
  for (int out = 0; out < out_size; ++out) {
    const double centre = (out + 0.5) * scale;
    const int first = std::max(static_cast<int>(centre - support + 0.5), 0);
    const int last = std::min(static_cast<int>(centre + support + 0.5), in_size);
    std::vector<double> weights;
    double sum = 0;
    for (int in = first; in < last; ++in) {
      const double x = (in - centre + 0.5) * inverse;  // multiplied, as Pillow: the box's edges are exact
      const double weight = x > -0.5 && x <= 0.5 ? 1.0 : 0.0;
      weights.push_back(weight);
      sum += weight;
    }
    Taps& t = taps[static_cast<size_t>(out)];
    t.first = first;
    for (double weight : weights) {
      const double normalised = sum != 0 ? weight / sum : 0;
      t.weights.push_back(static_cast<int32_t>(normalised * (1 << kPrecisionBits) + (normalised < 0 ? -0.5 : 0.5)));
    }
  }
  return taps;
}

uint8_t clip8(int64_t value) {
  if (value >= (int64_t{1} << kPrecisionBits << 8)) return 255;
  if (value <= 0) return 0;
  return static_cast<uint8_t>(value >> kPrecisionBits);
}

// One pass along an axis: `count` lines of `in_size` pixels `step` bytes apart (pixel to pixel),
// lines `line_in` / `line_out` bytes apart.
void resample_lines(const uint8_t* in, uint8_t* out, int lines, int in_size, int out_size, int64_t step_in,
                    int64_t step_out, int64_t line_in, int64_t line_out) {
  const std::vector<Taps> taps = box_taps(in_size, out_size);
  for (int line = 0; line < lines; ++line)
    for (int o = 0; o < out_size; ++o) {
      const Taps& t = taps[static_cast<size_t>(o)];
      for (int channel = 0; channel < 3; ++channel) {
        int64_t sum = int64_t{1} << (kPrecisionBits - 1);
        for (size_t k = 0; k < t.weights.size(); ++k)
          sum += int64_t{in[line * line_in + (t.first + static_cast<int64_t>(k)) * step_in + channel]} * t.weights[k];
        out[line * line_out + o * step_out + channel] = clip8(sum);
      }
    }
}

}  // namespace

void resize_rgb_box(const uint8_t* source, int source_width, int source_height, uint8_t* target, int target_width,
                    int target_height) {
  // Along rows first (into an intermediate of the target's width), then along columns, each pass
  // only where the size changes: Pillow's order and rounding.
  std::vector<uint8_t> rows;
  const uint8_t* across = source;
  if (target_width != source_width) {
    rows.resize(static_cast<size_t>(source_height) * target_width * 3);
    resample_lines(source, rows.data(), source_height, source_width, target_width, 3, 3, int64_t{source_width} * 3,
                   int64_t{target_width} * 3);
    across = rows.data();
  }
  if (target_height != source_height) {
    resample_lines(across, target, target_width, source_height, target_height, int64_t{target_width} * 3,
                   int64_t{target_width} * 3, 3, 3);
  } else {
    std::copy_n(across, static_cast<size_t>(source_height) * target_width * 3, target);
  }
}

}  // namespace tessera::data
