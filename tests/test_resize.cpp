// data/resize.h: the box filter's rules as Pillow's Image.BOX applies them (tests/
// test_extract_vit.py holds whole tiles to Pillow itself).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "data/resize.h"

namespace tessera::data {
namespace {

std::vector<uint8_t> random_rgb(int width, int height, uint32_t seed) {
  std::mt19937 generator(seed);
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3);
  for (auto& value : rgb) value = static_cast<uint8_t>(generator() & 0xff);
  return rgb;
}

TEST(ResizeBox, HalvingIsThe2x2MeanRoundedAfterEachPass) {
  const int size = 14;
  std::vector<uint8_t> source = random_rgb(size, size, 1), target(size / 2 * size / 2 * 3);
  resize_rgb_box(source.data(), size, size, target.data(), size / 2, size / 2);
  auto at = [&](int x, int y, int c) { return static_cast<int>(source[(y * size + x) * 3 + c]); };
  for (int y = 0; y < size / 2; ++y)
    for (int x = 0; x < size / 2; ++x)
      for (int c = 0; c < 3; ++c) {
        // Rows first, each pass's 1/2 weights in 22-bit fixed point: (a + b + 1) / 2, floored.
        int top = (at(2 * x, 2 * y, c) + at(2 * x + 1, 2 * y, c) + 1) / 2;
        int bottom = (at(2 * x, 2 * y + 1, c) + at(2 * x + 1, 2 * y + 1, c) + 1) / 2;
        EXPECT_EQ(target[(y * size / 2 + x) * 3 + c], (top + bottom + 1) / 2) << x << "," << y << "," << c;
      }
}

TEST(ResizeBox, SameSizeCopiesAndThreeToTwoTakesTheBoxItsCentresFallIn) {
  std::vector<uint8_t> source = random_rgb(3, 1, 2), same(9), two(6);
  resize_rgb_box(source.data(), 3, 1, same.data(), 3, 1);
  EXPECT_EQ(same, source);
  // Output pixel 0 covers input [0, 1.5): pixels 0 and 1 (centres 0.5, 1.5: the box's right edge
  // is closed); pixel 1 covers [1.5, 3): pixel 2 only.
  resize_rgb_box(source.data(), 3, 1, two.data(), 2, 1);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(two[c], (source[c] + source[3 + c] + 1) / 2);
    EXPECT_EQ(two[3 + c], source[6 + c]);
  }
}

}  // namespace
}  // namespace tessera::data
