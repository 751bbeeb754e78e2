// Max pooling against the CPU and central differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "compute/ops/max_pool2d.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

struct Geometry {
  int64_t kernel_size, stride, padding;
};

std::unique_ptr<Op> make(const Geometry& g) {
  return make_max_pool2d(LayerConfig(
      {{"name", "pool"}, {"type", "max_pool2d"}, {"kernel_size", g.kernel_size}, {"stride", g.stride}, {"padding", g.padding}}));
}

// x [N,C,H,W] -> y [N,C,OH,OW], padding never wins
std::vector<float> max_pool_cpu(const std::vector<float>& x, const Shape& in, const Shape& out, const Geometry& g) {
  std::vector<float> y(static_cast<size_t>(element_count(out)));
  for (int64_t plane = 0; plane < in[0] * in[1]; ++plane)
    for (int64_t oy = 0; oy < out[2]; ++oy)
      for (int64_t ox = 0; ox < out[3]; ++ox) {
        float best = -INFINITY;
        for (int64_t ky = 0; ky < g.kernel_size; ++ky)
          for (int64_t kx = 0; kx < g.kernel_size; ++kx) {
            int64_t iy = oy * g.stride - g.padding + ky, ix = ox * g.stride - g.padding + kx;
            if (iy < 0 || iy >= in[2] || ix < 0 || ix >= in[3]) continue;
            best = std::max(best, x[static_cast<size_t>((plane * in[2] + iy) * in[3] + ix)]);
          }
        y[static_cast<size_t>((plane * out[2] + oy) * out[3] + ox)] = best;
      }
  return y;
}

// Distinct values 0.05 apart, so a finite-difference step never changes which one is largest.
void spread_apart(std::vector<float>& x, uint32_t seed) {
  std::vector<size_t> order(x.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.05f * (static_cast<float>(order[i]) - static_cast<float>(x.size()) / 2);
}

const Geometry kGeometries[] = {{2, 2, 0}, {3, 2, 1}, {3, 1, 1}, {2, 1, 0}, {3, 3, 0}};

TEST(MaxPool2d, ShapesFollowPyTorch) {
  auto op = make({3, 2, 1});
  EXPECT_EQ(op->infer({{2, 3, 112, 112}}), (Shape{2, 3, 56, 56}));
  EXPECT_EQ(op->infer({{1, 1, 7, 9}}), (Shape{1, 1, 4, 5}));
  EXPECT_EQ(make({2, 2, 0})->infer({{1, 2, 7, 5}}), (Shape{1, 2, 3, 2}));
  EXPECT_THROW(make({3, 1, 2}), ModelError);
  EXPECT_THROW(make({5, 1, 0})->infer({{1, 1, 4, 9}}), ShapeError);
}

TEST(MaxPool2d, ForwardMatchesCpu) {
  uint32_t seed = 1;
  for (const Geometry& g : kGeometries) {
    auto op = make(g);
    Shape in{2, 3, 9, 7};
    test::OpCheck check(test::context(), *op, {in}, seed++);
    auto y = check.forward();
    test::expect_near(y, max_pool_cpu(check.inputs[0], in, check.output_shape, g), 0, "max_pool2d");
  }
}

TEST(MaxPool2d, BackwardMatchesFiniteDifferences) {
  uint32_t seed = 10;
  for (const Geometry& g : kGeometries) {
    // 7x9 leaves a remainder (backward gathers per input); 6x12 is tiled exactly by the
    // 2x2/2 and 3x3/3 windows (backward scatters per window).
    for (const Shape& in : {Shape{2, 2, 7, 9}, Shape{2, 2, 6, 12}}) {
      auto op = make(g);
      test::OpCheck check(test::context(), *op, {in}, seed);
      spread_apart(check.inputs[0], seed++);
      check.expect_gradients_match(1e-2, 1e-3, 48);
    }
  }
}

}  // namespace
}  // namespace tessera
