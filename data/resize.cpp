#include "data/resize.h"

#include <algorithm>
#include <vector>

namespace tessera::data {

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // Pillow's: room for 8-bit values times weights, and a sign
constexpr int32_t kHalf = int32_t{1} << (kPrecisionBits - 1);  // rounds the fixed-point sum

// Where each output pixel's box falls along one axis. Pillow weighs every input pixel whose
// centre the box covers 1/n in 22-bit fixed point (the n rounded alike) and the rest 0, so its
// sum of value times weight is exactly weight times the sum of those n values: summed first
// here, multiplied once.
struct AxisBoxes {
  int in_size = 0, out_size = 0;
  std::vector<int> first, count;  // the covered input pixels [first, first + count)
  std::vector<int32_t> weight;    // each one's, in fixed point (0 where none is covered)
  // The same boxes as `taps` pixels each (the most any box covers) from tap_first[o], weighted
  // tap_weights[o * taps + k]: `weight` where the box covers the pixel, else 0. A fixed count
  // the compiler unrolls, for the pass along rows.
  int taps = 0;
  std::vector<int> tap_first;
  std::vector<int32_t> tap_weights;
  // Whether a sum can pass 255 (boxes of over 16,000 pixels, whose rounded weights add up to
  // more than one); otherwise the clipping is left out of the pass along rows.
  bool clips = false;
};

// The box stretched over the footprint of each output pixel (its width in input pixels is the
// scale when shrinking, one when enlarging), tested at the input pixels' centres as Pillow does.
AxisBoxes box_taps(int in_size, int out_size) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = 0.5 * filter_scale, inverse = 1.0 / filter_scale;
  AxisBoxes boxes;
  boxes.in_size = in_size;
  boxes.out_size = out_size;
  for (int out = 0; out < out_size; ++out) {
    const double centre = (out + 0.5) * scale;
    const int from = std::max(static_cast<int>(centre - support + 0.5), 0);
    const int to = std::min(static_cast<int>(centre + support + 0.5), in_size);
    int first = 0, count = 0;
    for (int in = from; in < to; ++in) {
      const double x = (in - centre + 0.5) * inverse;  // multiplied, as Pillow: the box's edges are exact
      if (x > -0.5 && x <= 0.5) {
        if (count++ == 0) first = in;  // the covered pixels are contiguous: the box is an interval
      }
    }
    const double normalised = count ? 1.0 / count : 0.0;
    boxes.first.push_back(first);
    boxes.count.push_back(count);
    boxes.weight.push_back(static_cast<int32_t>(normalised * (1 << kPrecisionBits) + 0.5));
  }
  boxes.taps = *std::max_element(boxes.count.begin(), boxes.count.end());
  boxes.tap_weights.assign(static_cast<size_t>(out_size) * static_cast<size_t>(boxes.taps), 0);
  for (size_t o = 0; o < static_cast<size_t>(out_size); ++o) {
    const int start = std::min(boxes.first[o], in_size - boxes.taps);  // within the line at its end
    boxes.tap_first.push_back(start);
    for (int k = 0; k < boxes.taps; ++k)
      if (start + k >= boxes.first[o] && start + k < boxes.first[o] + boxes.count[o])
        boxes.tap_weights[o * static_cast<size_t>(boxes.taps) + static_cast<size_t>(k)] = boxes.weight[o];
    const int64_t largest = int64_t{255} * boxes.count[o] * boxes.weight[o] + kHalf;
    boxes.clips = boxes.clips || largest >= (int64_t{1} << kPrecisionBits << 8);
  }
  return boxes;
}

// Every tile of a slide is resized between the same two sizes: each thread keeps the boxes it used last.
const AxisBoxes& cached_boxes(int in_size, int out_size) {
  thread_local std::vector<AxisBoxes> cache;
  for (const AxisBoxes& boxes : cache)
    if (boxes.in_size == in_size && boxes.out_size == out_size) return boxes;
  if (cache.size() >= 4) cache.erase(cache.begin());
  cache.push_back(box_taps(in_size, out_size));
  return cache.back();
}

// The rounded 8-bit value of a fixed-point sum, clipped as Pillow clips it. Box sums are never
// negative (no negative weights), so only the top needs clipping.
inline uint8_t clip8(int32_t sum) { return static_cast<uint8_t>(std::min(sum >> kPrecisionBits, 255)); }

// Along rows: each output pixel from its box's `taps` pixels in the same row, the three channels
// at once (a box of more than 4 pixels: its count, summed then weighted).
template <int taps, bool clips>
void resample_rows(const uint8_t* in, int in_width, uint8_t* out, int rows, const AxisBoxes& boxes) {
  for (int y = 0; y < rows; ++y) {
    const uint8_t* line = in + static_cast<size_t>(y) * static_cast<size_t>(in_width) * 3;
    uint8_t* target = out + static_cast<size_t>(y) * static_cast<size_t>(boxes.out_size) * 3;
    for (size_t o = 0; o < static_cast<size_t>(boxes.out_size); ++o) {
      int32_t red = kHalf, green = kHalf, blue = kHalf;
      if constexpr (taps > 0) {
        const uint8_t* pixel = line + static_cast<size_t>(boxes.tap_first[o]) * 3;
        const int32_t* weight = boxes.tap_weights.data() + o * taps;
        for (int k = 0; k < taps; ++k, pixel += 3) {
          red += pixel[0] * weight[k];
          green += pixel[1] * weight[k];
          blue += pixel[2] * weight[k];
        }
      } else {
        const uint8_t* pixel = line + static_cast<size_t>(boxes.first[o]) * 3;
        int32_t red_sum = 0, green_sum = 0, blue_sum = 0;
        for (int k = 0; k < boxes.count[o]; ++k, pixel += 3) {
          red_sum += pixel[0];
          green_sum += pixel[1];
          blue_sum += pixel[2];
        }
        red += red_sum * boxes.weight[o];
        green += green_sum * boxes.weight[o];
        blue += blue_sum * boxes.weight[o];
      }
      if constexpr (clips) {
        red = clip8(red);
        green = clip8(green);
        blue = clip8(blue);
      } else {
        red >>= kPrecisionBits;
        green >>= kPrecisionBits;
        blue >>= kPrecisionBits;
      }
      target[3 * o] = static_cast<uint8_t>(red);
      target[3 * o + 1] = static_cast<uint8_t>(green);
      target[3 * o + 2] = static_cast<uint8_t>(blue);
    }
  }
}

void resample_rows(const uint8_t* in, int in_width, uint8_t* out, int rows, const AxisBoxes& boxes) {
  if (boxes.clips) return resample_rows<0, true>(in, in_width, out, rows, boxes);
  switch (boxes.taps) {
    case 1: return resample_rows<1, false>(in, in_width, out, rows, boxes);
    case 2: return resample_rows<2, false>(in, in_width, out, rows, boxes);  // 40x read for 20x: 2, or 1 and 2
    case 3: return resample_rows<3, false>(in, in_width, out, rows, boxes);
    case 4: return resample_rows<4, false>(in, in_width, out, rows, boxes);
    default: return resample_rows<0, false>(in, in_width, out, rows, boxes);
  }
}

// Along columns: each output row from whole input rows of `row_bytes` contiguous bytes, in
// chunks of a fixed width that the compiler turns into vector instructions.
void resample_columns(const uint8_t* in, size_t row_bytes, uint8_t* out, const AxisBoxes& boxes) {
  constexpr size_t chunk = 16;
  for (size_t o = 0; o < static_cast<size_t>(boxes.out_size); ++o) {
    const uint8_t* first_row = in + static_cast<size_t>(boxes.first[o]) * row_bytes;
    const int count = boxes.count[o];
    const int32_t weight = boxes.weight[o];
    uint8_t* __restrict target = out + o * row_bytes;
    size_t i = 0;
    for (; i + chunk <= row_bytes; i += chunk) {
      int32_t sums[chunk] = {};
      for (int k = 0; k < count; ++k) {
        const uint8_t* __restrict row = first_row + static_cast<size_t>(k) * row_bytes + i;
        for (size_t j = 0; j < chunk; ++j) sums[j] += row[j];
      }
      for (size_t j = 0; j < chunk; ++j) target[i + j] = clip8(kHalf + sums[j] * weight);
    }
    for (; i < row_bytes; ++i) {
      int32_t sum = 0;
      for (int k = 0; k < count; ++k) sum += first_row[static_cast<size_t>(k) * row_bytes + i];
      target[i] = clip8(kHalf + sum * weight);
    }
  }
}

}  // namespace

void resize_rgb_box(const uint8_t* source, int source_width, int source_height, uint8_t* target, int target_width,
                    int target_height) {
  // Along rows first (into an intermediate of the target's width), then along columns, each pass
  // only where the size changes: Pillow's order and rounding.
  thread_local std::vector<uint8_t> rows;
  const uint8_t* across = source;
  if (target_width != source_width) {
    rows.resize(static_cast<size_t>(source_height) * static_cast<size_t>(target_width) * 3);
    resample_rows(source, source_width, rows.data(), source_height, cached_boxes(source_width, target_width));
    across = rows.data();
  }
  if (target_height != source_height) {
    resample_columns(across, static_cast<size_t>(target_width) * 3, target, cached_boxes(source_height, target_height));
  } else {
    std::copy_n(across, static_cast<size_t>(source_height) * static_cast<size_t>(target_width) * 3, target);
  }
}

}  // namespace tessera::data
